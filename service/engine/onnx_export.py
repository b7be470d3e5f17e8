"""Export a checkpoint to one ONNX graph: embedding and every head's output, dynamic batch and length.

The graph takes `input_ids` and `attention_mask` ((B, L) int64, right-padded) and returns
`sentence_embedding` ((B, D) float32, unnormalised) and `head.<name>` per head ((B, C) probabilities or
(B,) values). It records a fingerprint of the checkpoint's weights and heads in its metadata, so the
service re-exports at start-up when a checkpoint gained or changed heads after the export.

This lives in the service (not in training) so the service can export at start-up when the onnx backend
is chosen and the checkpoint ships no `model.onnx`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from service.core.checkpoint import HEADS_DIR, META_FILE, WEIGHTS_FILE, Checkpoint, load_checkpoint
from service.core.errors import ErrorCode, HtmllmError
from service.core.modeling import HtmlEncoderModel

logger = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
INPUT_NAMES = ("input_ids", "attention_mask")
EMBEDDING_OUTPUT = "sentence_embedding"
HEAD_OUTPUT_PREFIX = "head."
FINGERPRINT_KEY = "htmllm.fingerprint"
HEAD_NAMES_KEY = "htmllm.heads"
OPSET = 18


class OnnxExportError(HtmllmError):
    code = ErrorCode.BACKEND_FAILED


class _ExportWrapper(nn.Module):
    """Flattens the model's (embedding, {head: scores}) into a tuple, heads in a fixed order."""

    def __init__(self, model: HtmlEncoderModel, head_names: list[str]) -> None:
        super().__init__()
        self.model = model
        self.head_names = head_names

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        embedding, scores = self.model(input_ids, attention_mask)
        return (embedding, *(scores[name] for name in self.head_names))


def checkpoint_fingerprint(path: str | Path) -> str:
    """sha256 over the encoder weights, every head file and htmllm.json: what the graph was built from."""
    root = Path(path)
    digest = hashlib.sha256()
    files = [root / WEIGHTS_FILE, root / META_FILE, *sorted((root / HEADS_DIR).glob("*.safetensors"))]
    for file in files:
        digest.update(file.name.encode())
        with file.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def read_onnx_metadata(path: str | Path) -> dict[str, str]:
    """The graph's metadata properties, read without loading the weights."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {prop.key: prop.value for prop in model.metadata_props}


def export_onnx(checkpoint: Checkpoint, out: str | Path, *, opset: int = OPSET) -> Path:
    """Write `out` (atomically) from a loaded checkpoint; the model is exported in float32 on CPU."""
    import onnx

    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    model = checkpoint.model
    model.encoder.set_attn_implementation("sdpa")
    model.to(device="cpu", dtype=torch.float32).eval()
    head_names = list(model.heads.keys())
    wrapper = _ExportWrapper(model, head_names).eval()
    ids = torch.full((2, 16), checkpoint.tokenizer.special_ids.unk, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".onnx")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                wrapper,
                (ids, mask),
                str(tmp),
                input_names=list(INPUT_NAMES),
                output_names=[EMBEDDING_OUTPUT, *(HEAD_OUTPUT_PREFIX + name for name in head_names)],
                dynamic_shapes={"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}},
                opset_version=opset,
                dynamo=True,
                external_data=False,
            )
        graph = onnx.load(str(tmp))
        for key, value in (
            (FINGERPRINT_KEY, checkpoint_fingerprint(checkpoint.path)),
            (HEAD_NAMES_KEY, ",".join(head_names)),
        ):
            prop = graph.metadata_props.add()
            prop.key, prop.value = key, value
        onnx.save(graph, str(tmp))
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the graph from other users of the checkpoint
        os.replace(tmp, target)
    except HtmllmError:
        raise
    except Exception as exc:
        raise OnnxExportError(
            f"exporting {checkpoint.path} to ONNX failed: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target


def ensure_onnx(checkpoint_dir: str | Path, onnx_path: str | Path | None = None) -> Path:
    """An ONNX graph up to date with the checkpoint: the existing one, or a fresh export.

    The default place is `<checkpoint>/model.onnx`; a stale graph (weights or heads changed since it was
    exported) is replaced.
    """
    root = Path(checkpoint_dir)
    target = Path(onnx_path) if onnx_path is not None else root / ONNX_FILE
    fingerprint = checkpoint_fingerprint(root)
    if target.is_file():
        try:
            if read_onnx_metadata(target).get(FINGERPRINT_KEY) == fingerprint:
                return target
        except Exception as exc:  # an unreadable graph is as good as none: re-export it
            logger.warning("ignoring unreadable ONNX graph %s: %s", target, exc)
        logger.info("ONNX graph %s is out of date with %s; re-exporting", target, root)
    else:
        logger.info("exporting %s to ONNX at %s", root, target)
    return export_onnx(load_checkpoint(root), target)
