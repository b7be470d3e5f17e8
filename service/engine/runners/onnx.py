"""The ONNX Runtime runner: the exported graph on CPU or CUDA execution providers, padded batches."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from service.core.cpus import intra_op_threads as choose_threads
from service.core.quantization import NO_QUANTIZATION
from service.engine.onnx_export import (
    EMBEDDING_OUTPUT,
    FINGERPRINT_KEY,
    HEAD_OUTPUT_PREFIX,
    INPUT_NAMES,
    QUANTIZATION_KEY,
)
from service.engine.runners import PreparedBatch, RunnerOutput, batch_cost, pad_batch
from service.engine.types import BackendError, ShuttingDownError

logger = logging.getLogger(__name__)

PROVIDERS: dict[str, list[str]] = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
}


@dataclass(frozen=True)
class ExpectedGraph:
    """What the graph a runner loads must be: the quantisation the configuration asked for (None:
    float32) and the fingerprint of the checkpoint it serves (`checkpoint_fingerprint`)."""

    quantize: str | None
    fingerprint: str


class GraphMismatchError(BackendError):
    """The graph loaded is not the one the configuration asked for: another quantisation, or the graph
    of another checkpoint.

    `ensure_onnx` checks the file, but the runner loads it afterwards: a graph written there in between
    (another server's export to a shared HTMLLM_ONNX_PATH, an `htmllm export-onnx --out`, a file put
    there by hand) had been served as it was, its dtype taken from its own metadata: a server configured
    for float32 served int8 (or another checkpoint's embeddings) without a word. The metadata checked is
    the loaded session's, not a second read of the file, which could change again."""


def _precision(quantization: str) -> str:
    """A graph's quantisation as /info and the messages name it: "float32" for none."""
    return "float32" if quantization == NO_QUANTIZATION else quantization


def check_graph(path: str | Path, metadata: Mapping[str, str], expect: ExpectedGraph) -> None:
    """GraphMismatchError where a graph of `metadata` (loaded from `path`) is not what `expect` says: its
    quantisation (none recorded: float32, as `export_onnx` wrote before it recorded one), and its
    checkpoint's fingerprint where it records one (a graph made by hand records none)."""
    found = _precision(metadata.get(QUANTIZATION_KEY, NO_QUANTIZATION))
    wanted = _precision(expect.quantize or NO_QUANTIZATION)
    how = (
        "it was written there after it was checked (another server or `htmllm export-onnx` given the same "
        "file?) or by hand"
    )
    again = "give each configuration a graph file of its own, and start again"
    if found != wanted:
        raise GraphMismatchError(
            f"{path} holds the {found} ONNX graph, not the {wanted} one asked for: {how}; {again}"
        )
    had = metadata.get(FINGERPRINT_KEY)
    if had is not None and had != expect.fingerprint:
        raise GraphMismatchError(
            f"{path} is the ONNX graph of another checkpoint (fingerprint {had[:12]}, not "
            f"{expect.fingerprint[:12]}): {how}, or the checkpoint changed while it loaded; {again}"
        )


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
        expect: ExpectedGraph | None = None,
    ) -> None:
        """`expect`: what the graph must be (`check_graph`); None (a benchmark, a test loading a graph
        it has just exported) serves whatever graph `path` holds, reporting its quantisation as dtype."""
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
        metadata = session.get_modelmeta().custom_metadata_map
        if expect is not None:  # before the inputs and outputs: a wrong graph is what to say first
            check_graph(path, metadata, expect)
        inputs = [i.name for i in session.get_inputs()]
        outputs = [o.name for o in session.get_outputs()]
        expected = [EMBEDDING_OUTPUT, *(HEAD_OUTPUT_PREFIX + name for name in head_names)]
        if inputs != list(INPUT_NAMES) or sorted(outputs) != sorted(expected):
            raise BackendError(f"{path} has inputs {inputs} and outputs {outputs}; expected {expected}")
        self._outputs = expected
        self.dtype = _precision(metadata.get(QUANTIZATION_KEY, NO_QUANTIZATION))  # what /info reports
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
