"""Export a checkpoint to one ONNX graph: embedding and every head's output, dynamic batch and length.

The graph takes `input_ids` and `attention_mask` ((B, L) int64, right-padded) and returns
`sentence_embedding` ((B, D) float32, unnormalised) and `head.<name>` per head ((B, C) probabilities or
(B,) values). It records a fingerprint of the checkpoint's weights and heads in its metadata, so the
service re-exports at start-up when a checkpoint gained or changed heads after the export.

The default opset is 23, whose `Attention` and `RotaryEmbedding` operators onnxruntime runs as fused
kernels: on CPU that is 1.1-1.3x the opset-18 graph (a probe at 256 tokens), where attention was a
dozen unfused nodes materialising every (B, heads, L, L) intermediate. `quantize="int8"` adds dynamic
int8 quantisation of every MatMul/Gemm weight (activations quantised per batch at run time), for CPUs
with VNNI or AMX: 1.5-2.0x the float32 torch runner model-only on such a CPU, at an embedding cosine
above 0.99999 to float32 (`docs/benchmarks.md`). The quantised graph is a separate file, `model.int8.onnx`.

This lives in the service (not in training) so the service can export at start-up when the onnx backend
is chosen and the checkpoint ships no `model.onnx`.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import fcntl
import logging
import os
import re
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor, nn

from service.core.checkpoint import Checkpoint, checkpoint_fingerprint, load_checkpoint
from service.core.errors import ErrorCode, HtmllmError
from service.core.modeling import HtmlEncoderModel
from service.core.quantization import NO_QUANTIZATION, QUANTIZED_ONNX_FILES

logger = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
QUANTIZATIONS = tuple(QUANTIZED_ONNX_FILES)
INPUT_NAMES = ("input_ids", "attention_mask")
EMBEDDING_OUTPUT = "sentence_embedding"
HEAD_OUTPUT_PREFIX = "head."
FINGERPRINT_KEY = "htmllm.fingerprint"
HEAD_NAMES_KEY = "htmllm.heads"
QUANTIZATION_KEY = "htmllm.quantization"
# How a graph of each quantisation is built, recorded beside the fingerprint: a graph of an older form is
# stale even for the same checkpoint. A graph without the key is form "1".
# int8 2: the task heads stay float32 (form 1 quantised them, and a page's score moved with its batch).
EXPORT_FORM_KEY = "htmllm.export_form"
EXPORT_FORMS: Final = {NO_QUANTIZATION: "1", "int8": "2"}
OPSET = 23

# The exporter's libraries narrate every pass at INFO (onnxscript's optimizer and rewriter, onnx_ir's
# passes: ~150 lines for the tiny test model, more for a real one) on loggers that propagate to the
# service's root handler. Raised to WARNING for the export, where the operator left their level unset.
_NARRATING_LOGGERS: Final = ("onnxscript", "onnx_ir")
# torch.onnx warns on every export that torchvision's operators cannot be registered when torchvision is
# absent; the service never exports them.
_TORCH_REGISTRATION_LOGGER: Final = "torch.onnx._internal.exporter._registration"
_TORCHVISION_SKIPPED: Final = "torchvision is not installed"
# Warnings torch.onnx.export gives every export of this model, about its own internals or about the two
# inputs sharing the `batch` and `length` dimensions (as they must): nothing an operator can act on.
_HARMLESS_WARNINGS: Final = (
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
    (UserWarning, r"# The axis name: \w+ will not be used, since it shares the same shape constraints"),
)
# onnxruntime's quantizer logs on the root logger (module-level `logging.info`/`logging.warning`).
_QUANTIZER_SOURCES: Final = os.sep + os.path.join("onnxruntime", "quantization") + os.sep
# Its advice to run `quant_pre_process` (shape inference and graph optimisation) first: `quantize_dynamic`
# infers shapes itself, and the graph it writes without that step is the one measured in docs/benchmarks.md.
_PREPROCESSING_ADVICE: Final = "Please consider"
# One export at a time in a process: `_quiet_exporters` saves and restores process-wide logging state, and
# two overlapping exports would restore each other's raised levels for good.
_QUIET_LOCK = threading.Lock()


class OnnxExportError(HtmllmError):
    code = ErrorCode.BACKEND_FAILED


class OtherQuantizationError(OnnxExportError):
    """The graph file holds htmllm's graph of another quantisation: another configuration's graph (a
    float32 run and an int8 run given one HTMLLM_ONNX_PATH or --onnx-path), which no export replaces.

    Each run had exported its own over the other's at every start (minutes each), and a server that
    found the file up to date could load the other's graph written in between, serving int8 while its
    settings said float32. A configuration conflict, not a backend failure: `validation_error`."""

    code = ErrorCode.VALIDATION

    def __init__(self, graph: Path, found: str, quantize: str | None) -> None:
        wanted = _precision(quantize or NO_QUANTIZATION)
        own = _own_path(graph, quantize)
        super().__init__(
            f"{graph} holds the {_precision(found)} ONNX graph, not the {wanted} one asked for: it is left "
            f"as it is (runs of the other precision use it); give the {wanted} graph a file of its own "
            f"({own}, say), or remove {graph} first to replace it"
        )
        self.graph, self.found, self.quantize, self.own = graph, found, quantize, own


def _precision(quantization: str) -> str:
    """A quantisation as an operator names it: "float32" for none, else its own name ("int8")."""
    return "float32" if quantization == NO_QUANTIZATION else quantization


def _own_path(graph: Path, quantize: str | None) -> Path:
    """A file beside `graph` for the graph of `quantize`, where `graph` holds another quantisation's:
    `x.onnx` -> `x.int8.onnx` for int8, `x.int8.onnx` -> `x.onnx` for float32."""
    stem = graph.name.removesuffix(".onnx")
    for name in QUANTIZATIONS:
        stem = stem.removesuffix(f".{name}")
    own = graph.with_name(f"{stem}.onnx" if quantize is None else f"{stem}.{quantize}.onnx")
    if own == graph:  # `graph` is named for the quantisation it does not hold (`x.onnx` quantised)
        own = graph.with_name(f"{graph.stem}.{_precision(quantize or NO_QUANTIZATION)}.onnx")
    return own


class _ExportWrapper(nn.Module):
    """Flattens the model's (embedding, {head: scores}) into a tuple, heads in a fixed order."""

    def __init__(self, model: HtmlEncoderModel, head_names: list[str]) -> None:
        super().__init__()
        self.model = model
        self.head_names = head_names

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        # transformers' forward, not service/core/encoder_forward.py's: a branch-free banded graph made
        # onnxruntime 0.8x slower at 256 tokens and no faster at 512 (docs/benchmarks.md).
        embedding, scores = self.model(input_ids, attention_mask, fast=False)
        return (embedding, *(scores[name] for name in self.head_names))


def read_onnx_metadata(path: str | Path) -> dict[str, str]:
    """The graph's metadata properties, read without loading the weights."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {prop.key: prop.value for prop in model.metadata_props}


def default_onnx_path(checkpoint_dir: str | Path, quantize: str | None = None) -> Path:
    """Where the service looks for (and writes) the graph of a checkpoint."""
    return Path(checkpoint_dir) / (ONNX_FILE if quantize is None else QUANTIZED_ONNX_FILES[quantize])


def _check_quantize(quantize: str | None) -> None:
    if quantize is not None and quantize not in QUANTIZED_ONNX_FILES:
        raise ValueError(f"quantize {quantize!r} is not one of {QUANTIZATIONS} (or None)")


def conform_rotary_caches(graph: Any) -> int:
    """Broadcast every `RotaryEmbedding`'s cos/sin caches to the batch size of its input, in place.

    torch's exporter passes caches of shape (1, L, D/2), shared by the batch; the operator (without
    position ids) takes (B, L, D/2), and onnxruntime refuses the shared form for B > 1. One Expand per
    distinct cache, fed by the input's batch dimension, makes the graph conform. Returns the number of
    caches expanded.
    """
    from onnx import helper

    expanded: dict[str, str] = {}
    nodes = []
    for node in graph.node:
        if node.op_type == "RotaryEmbedding" and node.domain in ("", "ai.onnx"):
            x = node.input[0]
            for slot in (1, 2):
                cache = node.input[slot]
                if cache not in expanded:
                    stem = f"{cache}__htmllm_batch"
                    nodes += [
                        helper.make_node("Shape", [x], [f"{stem}_b"], start=0, end=1, name=f"{stem}_b"),
                        helper.make_node("Shape", [cache], [f"{stem}_r"], start=1, name=f"{stem}_r"),
                        helper.make_node(
                            "Concat", [f"{stem}_b", f"{stem}_r"], [f"{stem}_s"], axis=0, name=f"{stem}_s"
                        ),
                        helper.make_node("Expand", [cache, f"{stem}_s"], [stem], name=stem),
                    ]
                    expanded[cache] = stem
                node.input[slot] = expanded[cache]
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(expanded)


def export_onnx(
    checkpoint: Checkpoint,
    out: str | Path,
    *,
    fingerprint: str,
    opset: int = OPSET,
    quantize: str | None = None,
) -> Path:
    """Write `out` (atomically) from a loaded checkpoint; the model is exported in float32 on CPU.

    The checkpoint must be loaded in float32 (`load_checkpoint` without `dtype`): a graph cast back up
    from bfloat16 weights is ~4e-3 off the checkpoint, yet would carry its fingerprint and pass for its
    graph. The caller's model is left as it was (device, dtype, attention implementation): the export
    runs on a copy.

    With `quantize="int8"` the float32 graph is quantised dynamically (int8 weights, per-batch
    activation scales) before it is written. `fingerprint` (`checkpoint_fingerprint`) is the
    checkpoint's as it was before `checkpoint` was loaded from it, and required: taken any later (it
    had defaulted to now, after the load and after `htmllm export-onnx` waited on another export's
    lock), it is that of files changed meanwhile (a `save_heads`), and the graph of the old heads
    passes for the new ones forever. Taken before, a change in between only makes the graph stale.
    """
    import onnx

    _check_quantize(quantize)
    lossy = sorted({str(p.dtype) for p in checkpoint.model.parameters() if p.dtype != torch.float32})
    if lossy:
        raise OnnxExportError(
            f"cannot export {checkpoint.path} to ONNX from a model loaded in {', '.join(lossy)}: the graph "
            "would be float32 cast up from rounded weights yet carry the checkpoint's fingerprint; load "
            "the checkpoint in float32 (load_checkpoint without dtype) to export it"
        )
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # A copy: the export needs SDPA on CPU, and the caller's model may be serving (eager, on a GPU).
    model = copy.deepcopy(checkpoint.model).to(device="cpu").eval()
    model.encoder.set_attn_implementation("sdpa")
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
        with _quiet_exporters():
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
                verbose=False,  # its "[torch.onnx] <step>... ✅" progress lines, printed to stdout
            )
            graph = onnx.load(str(tmp))
            conform_rotary_caches(graph.graph)
            if quantize is not None:
                graph = _quantize(graph, tmp)
        for key, value in (
            (FINGERPRINT_KEY, fingerprint),
            (HEAD_NAMES_KEY, ",".join(head_names)),
            (QUANTIZATION_KEY, quantize or NO_QUANTIZATION),
            (EXPORT_FORM_KEY, EXPORT_FORMS[quantize or NO_QUANTIZATION]),
        ):
            prop = graph.metadata_props.add()
            prop.key, prop.value = key, value
        onnx.save(graph, str(tmp))
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the graph from other users of the checkpoint
        os.replace(tmp, target)
        logger.info(
            "exported %s to ONNX at %s in %.1fs", checkpoint.path, target, time.perf_counter() - started
        )
    except HtmllmError:
        raise
    except Exception as exc:
        raise OnnxExportError(
            f"exporting {checkpoint.path} to ONNX failed: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _not_torchvision_skipped(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_TORCHVISION_SKIPPED)


def _not_quantizer_chatter(record: logging.LogRecord) -> bool:
    """Keeps a root-logger record unless it is onnxruntime's quantizer narrating (one INFO line per tensor
    left float, `Quantization parameters for tensor ... not specified`) or advising pre-processing. Its
    other warnings and errors, and every other module's root records, pass."""
    if _QUANTIZER_SOURCES not in record.pathname:
        return True
    return record.levelno >= logging.WARNING and not str(record.msg).startswith(_PREPROCESSING_ADVICE)


@contextlib.contextmanager
def _quiet_exporters() -> Iterator[None]:
    """Silence, for the export only, what torch.onnx, onnxscript, onnx_ir and onnxruntime's quantizer say
    that an operator cannot act on (~170 lines for the tiny test model, ~280 for the bundled one), and
    restore every setting afterwards: the rest of the process logs as it was configured to.

    Their warnings and errors still show (other than the known harmless ones above), and an export that
    fails raises with the cause. The quantizer's module-level `logging.warning` configures a root handler
    (`logging.basicConfig`) where the root had none (`htmllm export-onnx`, which configures no logging);
    that handler is removed again."""
    root = logging.getLogger()
    registration = logging.getLogger(_TORCH_REGISTRATION_LOGGER)
    with _QUIET_LOCK, warnings.catch_warnings():
        for category, message in _HARMLESS_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        handlers = list(root.handlers)
        raised = [lg for lg in map(logging.getLogger, _NARRATING_LOGGERS) if lg.level == logging.NOTSET]
        for narrating in raised:
            narrating.setLevel(logging.WARNING)
        registration.addFilter(_not_torchvision_skipped)
        root.addFilter(_not_quantizer_chatter)
        try:
            yield
        finally:
            root.removeFilter(_not_quantizer_chatter)
            registration.removeFilter(_not_torchvision_skipped)
            for narrating in raised:
                narrating.setLevel(logging.NOTSET)
            if not handlers:
                for added in list(root.handlers):
                    root.removeHandler(added)


# The heads' weights in the exported graph: `_ExportWrapper.model`, then the model's `heads` ModuleDict.
HEAD_WEIGHTS_PREFIX: Final = "model.heads."


def head_nodes(graph: Any) -> list[str]:
    """The names of the graph's nodes that read a task head's weights."""
    weights = {init.name for init in graph.graph.initializer if init.name.startswith(HEAD_WEIGHTS_PREFIX)}
    return [node.name for node in graph.graph.node if weights.intersection(node.input)]


def _quantize(graph: Any, scratch: Path) -> Any:
    """The graph with the encoder's MatMul/Gemm weights in int8 (onnxruntime's dynamic quantisation).

    The heads stay float32: dynamic quantisation scales a node's input by its largest value over the
    whole batch, so a quantised head's score for a page moved with the pages batched beside it (by
    2e-3 on a test model, where the embedding moved by 7e-5 relative), and the heads are a sliver of
    the work."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source = scratch.with_suffix(".float.onnx")
    try:
        onnx.save(graph, str(source))
        # Signed int8 weights: onnxruntime's VNNI/AMX kernels take u8 activations x s8 weights, and the
        # unsigned-weight form runs its slower path (1.0-1.2x float32 instead of 1.5-1.9x on this CPU).
        quantize_dynamic(
            str(source),
            str(scratch),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Gemm"],
            # By name, and as onnxruntime renames them: dynamic quantisation first rewrites each Gemm as
            # a MatMul named `<name>_MatMul` (and an Add), and matches the exclusions against that.
            nodes_to_exclude=[name + suffix for name in head_nodes(graph) for suffix in ("", "_MatMul")],
        )
        return onnx.load(str(scratch))
    finally:
        source.unlink(missing_ok=True)


def onnx_cache_path(fingerprint: str, quantize: str | None = None) -> Path:
    """Where a graph goes when its checkpoint's directory is read-only: the temporary directory (TMPDIR;
    in the Helm chart the pod's /tmp emptyDir), one folder per checkpoint fingerprint."""
    name = ONNX_FILE if quantize is None else QUANTIZED_ONNX_FILES[quantize]
    return Path(tempfile.gettempdir()) / "htmllm-onnx" / fingerprint[:32] / name


def _metadata(graph: Path, *, say_unreadable: bool = True) -> dict[str, str] | None:
    """`graph`'s metadata, None where there is no graph or it cannot be read (as good as none: it is
    re-exported), with a warning unless `say_unreadable` is off (a second look at a graph the caller
    has looked at already)."""
    if not graph.is_file():
        return None
    try:
        return read_onnx_metadata(graph)
    except Exception as exc:
        if say_unreadable:
            logger.warning("ignoring unreadable ONNX graph %s: %s", graph, exc)
        return None


def _is_current(meta: dict[str, str] | None, fingerprint: str, quantize: str | None) -> bool:
    """Whether a graph of metadata `meta` is the checkpoint's current graph of `quantize`."""
    if meta is None:
        return False
    kind = quantize or NO_QUANTIZATION
    return (
        meta.get(FINGERPRINT_KEY) == fingerprint
        and meta.get(QUANTIZATION_KEY, NO_QUANTIZATION) == kind
        and meta.get(EXPORT_FORM_KEY, "1") == EXPORT_FORMS[kind]
    )


def graph_up_to_date(
    graph: Path, fingerprint: str, quantize: str | None, *, say_unreadable: bool = True
) -> bool:
    """Whether `graph` is the checkpoint's current graph (`_metadata`, `_is_current`)."""
    return _is_current(_metadata(graph, say_unreadable=say_unreadable), fingerprint, quantize)


def _other_quantization(meta: dict[str, str] | None, quantize: str | None) -> str | None:
    """The quantisation of a graph of metadata `meta` where it is htmllm's graph of another one than
    `quantize`, else None: no graph, an unreadable one or one htmllm did not export (replaced as
    before), or one of `quantize` (stale or current)."""
    if meta is None or FINGERPRINT_KEY not in meta:
        return None
    found = meta.get(QUANTIZATION_KEY, NO_QUANTIZATION)
    return None if found == (quantize or NO_QUANTIZATION) else found


def check_quantization(graph: str | Path, quantize: str | None) -> None:
    """OtherQuantizationError where `graph` holds htmllm's graph of another quantisation than `quantize`:
    an export there would replace another configuration's graph. `htmllm export-onnx` asks before it
    loads the checkpoint; every export asks again under the directory's lock (`export_onnx_locked`)."""
    path = Path(graph)
    found = _other_quantization(_metadata(path, say_unreadable=False), quantize)
    if found is not None:
        raise OtherQuantizationError(path, found, quantize)


# What a read-only checkpoint directory answers a write with (a read-only mount, another owner).
_NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
# How much of a fingerprint a message quotes: enough to tell two apart.
_FINGERPRINT_SHOWN = 16


def ensure_onnx(
    checkpoint_dir: str | Path,
    onnx_path: str | Path | None = None,
    *,
    quantize: str | None = None,
    fingerprint: str | None = None,
) -> Path:
    """An ONNX graph up to date with the checkpoint: the existing one, or a fresh export.

    The place is `onnx_path` when given, else `<checkpoint>/model.onnx` (`model.int8.onnx` quantised). A
    stale graph there (weights or heads changed since it was exported, an older export form) is
    replaced. Where that place cannot be written (a read-only volume or image, as Kubernetes mounts
    models), the graph is exported to `onnx_cache_path` instead, so the onnx backend starts wherever
    the torch one does; for an explicit `onnx_path` with a warning that names the stale graph and the
    command that refreshes it. Re-raising there had crash-looped every new pod once the checkpoint
    gained a head. Any other failure to write is an `OnnxExportError` saying where and why.

    A graph of another quantisation there (a float32 run and an int8 run given one HTMLLM_ONNX_PATH) is
    another configuration's, and is never replaced: the graph asked for comes from `onnx_cache_path`
    too, with a warning naming a file of its own. The two runs had exported over each other at every
    start, and one could load the other's graph (`OtherQuantizationError`).

    `fingerprint` is the checkpoint's (`checkpoint_fingerprint`) where the caller took it already: the
    engine's loader checks the graph it loads against it, and the weights are then hashed once.
    """
    _check_quantize(quantize)
    root = Path(checkpoint_dir)
    if fingerprint is None:  # (the caller's, where it took one: the weights are hashed once)
        fingerprint = checkpoint_fingerprint(root)
    beside = Path(onnx_path) if onnx_path is not None else default_onnx_path(root, quantize)
    cached = onnx_cache_path(fingerprint, quantize)
    meta = _metadata(beside)
    if _is_current(meta, fingerprint, quantize):
        return beside
    found = _other_quantization(meta, quantize)
    conflict = None if found is None else OtherQuantizationError(beside, found, quantize)
    # An explicit path is tried before the cache: a graph cached by an earlier start (or `htmllm embed`)
    # must not stand in for one the operator asked for where that can be written.
    if (onnx_path is None or conflict is not None) and graph_up_to_date(cached, fingerprint, quantize):
        if conflict is not None:
            _warn_other_quantization(root, conflict, cached, explicit=onnx_path is not None)
        return cached
    checkpoint = load_checkpoint(root)  # after the fingerprint: a change in between reads as stale later
    if conflict is None:
        if meta is not None and FINGERPRINT_KEY not in meta:
            # A readable ONNX file htmllm did not export (or an export older than its fingerprint): a
            # mistyped --onnx-path had replaced a user's own model with no more than an info line.
            logger.warning(
                "%s is an ONNX graph htmllm did not export (its metadata has no %s): it is replaced by "
                "%s's graph",
                beside,
                FINGERPRINT_KEY,
                root,
            )
        logger.info("exporting %s to ONNX at %s", root, beside)
        try:
            return export_onnx_locked(
                checkpoint, beside, quantize=quantize, fingerprint=fingerprint, reuse=True
            )
        except OtherQuantizationError as exc:  # exported there meanwhile by a run of the other one
            conflict = exc
        except OSError as exc:
            if exc.errno not in _NOT_WRITABLE:
                raise _write_failed(root, beside, exc, quantize) from exc
            refused = exc
    if conflict is not None:
        _warn_other_quantization(root, conflict, cached, explicit=onnx_path is not None)
        why, refresh = f"it holds the {_precision(conflict.found)} graph", conflict.own
    else:
        if onnx_path is not None:
            _warn_stale(root, beside, cached, fingerprint, quantize, refused)
        else:
            logger.info(
                "%s cannot be written (%s); exporting the ONNX graph to %s", beside.parent, refused, cached
            )
        why, refresh = str(refused.strerror or refused), beside
    try:  # `reuse`: a container restarted in its pod finds the graph its previous run cached
        return export_onnx_locked(checkpoint, cached, quantize=quantize, fingerprint=fingerprint, reuse=True)
    except OSError as exc:
        raise _write_failed(root, cached, exc, quantize, refused=(beside, why, refresh)) from exc


def _warn_other_quantization(
    root: Path, conflict: OtherQuantizationError, used: Path, *, explicit: bool
) -> None:
    """The warning for a graph file of another quantisation (`conflict`), left to the runs that use it,
    while `used` (the temporary directory's) is served: each new pod exports there again at start-up
    until the graph asked for has a file of its own."""
    wanted = _precision(conflict.quantize or NO_QUANTIZATION)
    logger.warning(
        "the ONNX graph %s%s is the %s graph, not the %s one asked for: it is left as it is (runs of the "
        "other precision use it), and the %s graph exported to %s is served instead; give it a file of "
        "its own with `%s`%s",
        conflict.graph,
        " (HTMLLM_ONNX_PATH)" if explicit else "",
        _precision(conflict.found),
        wanted,
        wanted,
        used,
        _refresh_command(root, conflict.own, conflict.quantize),
        " and point HTMLLM_ONNX_PATH (--onnx-path) at it" if explicit else f", or remove {conflict.graph}",
    )


def _staleness(graph: Path, fingerprint: str, quantize: str | None) -> str:
    """Why `graph` is not the checkpoint's current graph, in words for an operator."""
    try:
        meta = read_onnx_metadata(graph)
    except FileNotFoundError:
        return "does not exist"
    except Exception as exc:  # as `graph_up_to_date` takes it: unreadable is as good as none
        return f"cannot be read ({type(exc).__name__}: {exc})"
    had = meta.get(FINGERPRINT_KEY)
    if had is None:
        return "records no checkpoint fingerprint (it was not exported by htmllm)"
    if had != fingerprint:
        return (
            f"was exported from checkpoint fingerprint {had[:_FINGERPRINT_SHOWN]}, and the checkpoint's is "
            f"now {fingerprint[:_FINGERPRINT_SHOWN]}"
        )
    kind = quantize or NO_QUANTIZATION
    if meta.get(QUANTIZATION_KEY, NO_QUANTIZATION) != kind:
        return f"is quantised {meta.get(QUANTIZATION_KEY, NO_QUANTIZATION)!r}, not {kind!r}"
    return f"is of export form {meta.get(EXPORT_FORM_KEY, '1')}, and this version writes {EXPORT_FORMS[kind]}"


def _refresh_command(root: Path, graph: Path, quantize: str | None) -> str:
    """The command that (re)writes `graph` for the checkpoint at `root`."""
    option = "" if quantize is None else f" --quantize {quantize}"
    return f"htmllm export-onnx --checkpoint {root} --out {graph}{option}"


def _warn_stale(
    root: Path, graph: Path, used: Path, fingerprint: str, quantize: str | None, refused: OSError
) -> None:
    """The warning for an explicit graph (`onnx_path`, HTMLLM_ONNX_PATH) that is stale and cannot be
    replaced (`refused` says why): each new pod exports the graph again at start-up (minutes with a
    large model) until it is refreshed."""
    logger.warning(
        "the ONNX graph %s (HTMLLM_ONNX_PATH) %s, and it cannot be replaced here (%s): serving the graph "
        "exported to %s instead; refresh %s with `%s` where it can be written",
        graph,
        _staleness(graph, fingerprint, quantize),
        refused.strerror or refused,
        used,
        graph,
        _refresh_command(root, graph, quantize),
    )


def _write_failed(
    root: Path,
    graph: Path,
    exc: OSError,
    quantize: str | None,
    *,
    refused: tuple[Path, str, Path] | None = None,
) -> OnnxExportError:
    """The error for a graph that cannot be written (`refused`: the place tried first, why it was not
    written, and where the command to export it by hand should write): one line, where a raw OSError
    had ended the server's start with a traceback."""
    if refused is None:
        return OnnxExportError(f"cannot export {root} to ONNX at {graph}: {exc.strerror or exc}")
    wanted, why, refresh = refused
    return OnnxExportError(
        f"cannot export {root} to ONNX: {wanted} cannot be written ({why}), nor {graph} in the temporary "
        f"directory ({exc.strerror or exc}); give the server a writable TMPDIR, or export the graph where "
        f"it can be written: `{_refresh_command(root, refresh, quantize)}`"
    )


def export_onnx_locked(
    checkpoint: Checkpoint,
    out: str | Path,
    *,
    fingerprint: str,
    opset: int = OPSET,
    quantize: str | None = None,
    on_wait: Callable[[Path], None] | None = None,
    reuse: bool = False,
) -> Path:
    """`export_onnx` under an exclusive lock on the target's directory, which every exporter into it takes
    (`ensure_onnx`'s, `htmllm export-onnx`'s). With `reuse` (`ensure_onnx`) a graph found up to date with
    `fingerprint` once the lock is held is kept: processes starting on one checkpoint export it once
    (the caller has looked at the graph before, and warned about it if unreadable: this look does not
    warn a second time). Without it (`htmllm export-onnx`, which leaves a graph up to date at its opset
    before it gets here unless `--force`d) it always exports. Either way a graph of another quantisation
    there is never replaced (`OtherQuantizationError`). `on_wait` is called with the directory before
    waiting on another holder's lock (by default a log line).

    Without the lock, a server starting on the checkpoint meanwhile took the export's temporary for a
    killed export's and removed it under its own lock (the export then failed reading it back), and two
    exports to one target ran at once. With it, whoever comes second waits; under it the temporaries of
    an export killed with `kill -9` (as large as the graph, and never removed by anyone else) are
    removed, since none is then a live export's.
    """
    target = Path(out)
    with _target_lock(target, on_wait) as locked:
        # Looked at under the lock: a graph of the other quantisation that another run exported since
        # the caller last looked is that run's, and is never replaced (OtherQuantizationError).
        meta = _metadata(target, say_unreadable=False)
        found = _other_quantization(meta, quantize)
        if found is not None:
            raise OtherQuantizationError(target, found, quantize)
        if locked:
            if reuse and _is_current(meta, fingerprint, quantize):
                return target
            _remove_stale_temporaries(target)
        return export_onnx(checkpoint, target, fingerprint=fingerprint, opset=opset, quantize=quantize)


@contextlib.contextmanager
def _target_lock(target: Path, on_wait: Callable[[Path], None] | None = None) -> Iterator[bool]:
    """`_directory_lock` on the directory `target` is written to, made first where it is missing (the
    lock needs it open); yields whether the lock is held. Every exporter into a directory takes it:
    one export's temporary is then never another's stale one."""
    with contextlib.suppress(OSError):  # export_onnx creates it, or says why it cannot
        target.parent.mkdir(parents=True, exist_ok=True)
    with _directory_lock(target.parent, on_wait) as locked:
        yield locked


@contextlib.contextmanager
def _directory_lock(directory: Path, on_wait: Callable[[Path], None] | None = None) -> Iterator[bool]:
    """Hold `flock` on `directory` (waiting for another holder, after calling `on_wait` with the
    directory or logging that it waits); yields whether it is held. Not held where the directory cannot
    be opened or locked (missing, a file system without flock): the export then runs as it did before
    the lock, and no temporary is removed."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        fd = None
    if fd is None:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            # Another export holds it, for minutes with a real model: said, where a command waiting in
            # silence looked hung.
            _say_waiting(on_wait, directory)
            locked = _wait_for_lock(fd)
        except OSError:  # a file system without flock
            locked = False
        yield locked
    finally:
        os.close(fd)  # lets the lock go


def _wait_for_lock(fd: int) -> bool:
    """Block until `fd`'s flock is held; False where the file system refuses it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        return False
    return True


def _say_waiting(on_wait: Callable[[Path], None] | None, directory: Path) -> None:
    """Call `on_wait` (or log) before waiting on `directory`'s lock. A notice that cannot be given
    (`htmllm export-onnx` printing to a closed pipe: EPIPE) is logged and the wait goes on: it was
    caught as "no flock here" and the export ran WITHOUT the lock, beside the other export. Waiting
    rather than failing, since the notice only says why the command pauses, and a user who asked for a
    graph expects one (written under the lock) whether or not anyone reads the command's messages."""
    try:
        (on_wait or _log_wait)(directory)
    except OSError as exc:
        logger.warning("cannot say that the export waits for the lock on %s (%s); waiting", directory, exc)


def _log_wait(directory: Path) -> None:
    logger.info("waiting for the export lock on %s: another export into it is running", directory)


def _remove_stale_temporaries(target: Path) -> None:
    """Remove `export_onnx`'s temporaries for `target` (`.<name>.<8 characters>.onnx`, and `_quantize`'s
    `.float.onnx` beside them) and nothing else; best effort, since the export itself does not need it."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.[a-z0-9_]{{8}}(\.float)?\.onnx")
    with contextlib.suppress(OSError):
        for entry in target.parent.iterdir():
            if pattern.fullmatch(entry.name) and (entry.is_symlink() or not entry.is_dir()):
                logger.info("removing %s, left by an ONNX export that was killed", entry)
                entry.unlink(missing_ok=True)
