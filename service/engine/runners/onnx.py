"""The ONNX Runtime runner: the exported graph on CPU or CUDA execution providers, padded batches."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from service.core.cpus import intra_op_threads as choose_threads
from service.core.quantization import NO_QUANTIZATION
from service.engine.onnx_export import EMBEDDING_OUTPUT, HEAD_OUTPUT_PREFIX, INPUT_NAMES, QUANTIZATION_KEY
from service.engine.runners import PreparedBatch, RunnerOutput, batch_cost, pad_batch
from service.engine.types import BackendError, ShuttingDownError

logger = logging.getLogger(__name__)

PROVIDERS: dict[str, list[str]] = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
}


class OnnxRunner:
    """Runs `model.onnx` with onnxruntime; one instance is used from one thread at a time."""

    backend = "onnx"
    attention = "graph"  # the exported graph's own attention (transformers' SDPA form, opset 23)

    def __init__(
        self,
        path: str | Path,
        *,
        pad_id: int,
        head_names: Sequence[str],
        device: str = "cpu",
        intra_op_threads: int | None = None,
    ) -> None:
        import onnxruntime as ort

        if device not in PROVIDERS:
            raise ValueError(f"device {device!r} is not one of {sorted(PROVIDERS)}")
        wanted = PROVIDERS[device]
        if wanted[0] not in ort.get_available_providers():
            raise BackendError(
                f"onnxruntime has no {wanted[0]} here (install onnxruntime-gpu for CUDA); available: "
                f"{ort.get_available_providers()}"
            )
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # onnxruntime's default is one thread per physical core of the machine, whatever the container's
        # CPU limit (service.core.cpus); OMP_NUM_THREADS, which torch honours, it ignores.
        choice = choose_threads(intra_op_threads)
        options.intra_op_num_threads = choice.threads
        self.threads = choice.threads
        logger.info("onnxruntime runs %d intra-op threads (%s)", choice.threads, choice.reason)
        # Idle intra-op threads would spin between batches, taking the cores the pruning and
        # tokenization pool needs; they sleep instead.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            session = ort.InferenceSession(str(path), sess_options=options, providers=wanted)
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise BackendError(f"onnxruntime cannot load {path}: {exc}") from exc
        self._session: ort.InferenceSession | None = session  # None once closed
        # A provider listed as available may still fail to start (an onnxruntime-gpu built for another
        # CUDA or cuDNN than the machine's): onnxruntime then logs an error and runs the session on the
        # next provider, the CPU, while /info would say cuda. A server that asked for CUDA refuses that.
        running = session.get_providers()
        if running[:1] != wanted[:1]:
            raise BackendError(
                f"onnxruntime could not start {wanted[0]} for {path} (it runs on {running}); check that "
                "onnxruntime-gpu matches this machine's CUDA and cuDNN versions"
            )
        inputs = [i.name for i in session.get_inputs()]
        outputs = [o.name for o in session.get_outputs()]
        expected = [EMBEDDING_OUTPUT, *(HEAD_OUTPUT_PREFIX + name for name in head_names)]
        if inputs != list(INPUT_NAMES) or sorted(outputs) != sorted(expected):
            raise BackendError(f"{path} has inputs {inputs} and outputs {outputs}; expected {expected}")
        self._outputs = expected
        quantization = session.get_modelmeta().custom_metadata_map.get(QUANTIZATION_KEY, NO_QUANTIZATION)
        self.dtype = "float32" if quantization == NO_QUANTIZATION else quantization  # what /info reports
        self.device = device
        self.pad_id = pad_id

    def cost(self, lengths: Sequence[int]) -> int:
        return batch_cost(lengths, packed=False)

    def prepare(self, batch: Sequence[Sequence[int]], *, pad_to: int | None = None) -> PreparedBatch:
        ids, mask = pad_batch(batch, self.pad_id, pad_to=pad_to)
        return PreparedBatch(
            payload={INPUT_NAMES[0]: ids, INPUT_NAMES[1]: mask},
            documents=len(batch),
            tokens=sum(len(seq) for seq in batch),
            padded_tokens=int(ids.size),
        )

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        session = self._session  # read once: a close on another thread leaves this pass its session
        if session is None:
            raise ShuttingDownError("the onnx runner has been closed")
        feeds = cast(dict[str, Any], prepared.payload)
        values = session.run(self._outputs, feeds)
        return RunnerOutput(
            embeddings=np.asarray(values[0], dtype=np.float32),
            scores={
                name[len(HEAD_OUTPUT_PREFIX) :]: np.asarray(value, dtype=np.float32)
                for name, value in zip(self._outputs[1:], values[1:], strict=True)
            },
        )

    def abort(self) -> None:
        """A pass in this process cannot be stopped; it ends on its own."""

    def close(self) -> None:
        """Drop the session; a later `run` raises ShuttingDownError (a pass in flight keeps its session
        to the end). A dropped attribute had failed each later pass as a BackendError about `_session`,
        which counted against the engine's health."""
        self._session = None
