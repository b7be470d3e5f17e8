"""`htmllm export-onnx --checkpoint DIR --out model.onnx`: one graph with the embedding and every head.

The cheap checks come before the export: an `--opset` torch's exporter cannot write (it builds opset-18
graphs and converts them up, never down, so below 18 it would write 18 after a converter traceback) or
one newer than the installed `onnx` knows is refused, and so are an `--out` naming a directory (it is the
graph's file) or one that cannot be written, and a `--checkpoint` that is no checkpoint directory, as
`htmllm embed` and `htmllm serve` refuse it (`check_checkpoint_path`: a training run's folder gets its
`model/` suggested). The opset the written graph declares is read back and reported; a graph that did
not get the opset asked for fails the command rather than pass for it.

An `--out` that is up to date (exported from the checkpoint as it is now, with the same `--quantize` and
`--opset`: `ensure_onnx`'s rule, and the opset) is left as it is, in one line, unless `--force`: run again,
the command had exported the same graph again, minutes with a real model.

An `--out` holding htmllm's graph of the other quantisation (a float32 `--out` given `--quantize int8`,
or the other way round) is refused rather than replaced: it is another configuration's graph, which a
server's HTMLLM_ONNX_PATH may name (`OtherQuantizationError`); remove it first to replace it.

The export holds the lock a starting server's `ensure_onnx` takes on the target's directory
(`export_onnx_locked`): that server, cleaning up the temporaries of killed exports, would otherwise
remove this one's, and a second export to the same file would interleave with it; either waits instead.
The checkpoint's fingerprint, which the graph records, is taken before the checkpoint is loaded (see
`export_onnx`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from service.core.quantization import NO_QUANTIZATION, QUANTIZATION_CHOICES, quantization_option

# torch.onnx's dynamo exporter builds every graph at opset 18 and converts it up to the opset asked for;
# it cannot convert down (below 18 it warns, prints the converter's traceback and keeps 18).
MIN_OPSET = 18


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "export-onnx",
        help="export a checkpoint to ONNX (dynamic batch and length; embedding and head outputs)",
    )
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint directory to export")
    parser.add_argument(
        "--out",
        default=None,
        help="the graph's file, e.g. graphs/model.onnx (default: model.onnx inside the checkpoint, where "
        "the service looks)",
    )
    parser.add_argument(
        "--opset",
        type=int,
        default=None,
        help=f"ONNX opset version, {MIN_OPSET} or newer (default 23: fused Attention and RoPE)",
    )
    parser.add_argument(
        "--quantize",
        choices=QUANTIZATION_CHOICES,
        default=NO_QUANTIZATION,
        help="int8: dynamic int8 weights for CPUs with VNNI/AMX (default out: model.int8.onnx)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="export even where the graph file is up to date: exported from this checkpoint as it is now, "
        "with the same --quantize and --opset (without it the command says so and leaves the file)",
    )
    parser.set_defaults(func=run)


def _unwritable(out: Path) -> str | None:
    """Why `out` cannot be written (as the exporter writes it: a temporary file beside it), or None.

    Missing directories are not made here (the exporter makes them): a typo in `--checkpoint` must not
    leave an empty directory behind. The nearest existing one is probed instead.
    """
    if out.is_dir():
        return "it is a directory"
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{out.name}.", suffix=".probe"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _written_opset(path: Path) -> int | None:
    """The default-domain opset a written graph declares."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _up_to_date_at(graph: Path, fingerprint: str, quantize: str | None, opset: int) -> bool:
    """Whether `graph` is what this export would write: the checkpoint's current graph of `quantize` by
    the rule a starting server keeps or re-exports a graph by (`onnx_export.graph_up_to_date`: the
    fingerprint, quantisation and export form it records), at `opset` (which that rule leaves aside: the
    service takes a graph of any opset, but `--opset` asks for one)."""
    from service.engine.onnx_export import graph_up_to_date

    if not graph_up_to_date(graph, fingerprint, quantize, say_unreadable=False):
        return False
    try:
        return _written_opset(graph) == opset
    except Exception:  # replaced or removed since (onnx raises its own errors): exported as asked, then
        return False


def _say_waiting(directory: Path) -> None:
    """One line before waiting on another export's lock (a server exporting on start takes minutes):
    waiting in silence looked hung."""
    print(
        f"htmllm export-onnx: waiting for another export into {directory} to finish (it holds the "
        "directory's lock)",
        file=sys.stderr,
        flush=True,
    )


def run(args: argparse.Namespace) -> int:
    try:
        import onnx
    except ImportError:  # an optional extra
        print("htmllm export-onnx: needs onnx and onnxscript (pip install onnx onnxscript)", file=sys.stderr)
        return 1
    from service.core.checkpoint import checkpoint_fingerprint, load_checkpoint
    from service.core.checkpoint_path import check_checkpoint_path
    from service.core.errors import HtmllmError
    from service.engine.onnx_export import OPSET, check_quantization, default_onnx_path, export_onnx_locked

    opset = OPSET if args.opset is None else args.opset
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        print(
            f"htmllm export-onnx: --opset {opset} cannot be exported: the exporter writes opsets "
            f"{MIN_OPSET} to {newest} (the newest the installed onnx knows)",
            file=sys.stderr,
        )
        return 2
    quantize = quantization_option(args.quantize)
    if args.out is not None and args.out.endswith(("/", os.sep)):
        # A file, as documented: Path() dropped the slash, and `--out onnxout/` wrote a file `onnxout`.
        file = default_onnx_path(args.out, quantize)
        print(
            f"htmllm export-onnx: --out {args.out} names a directory; --out is the graph's file: "
            f"--out {file}, say",
            file=sys.stderr,
        )
        return 2
    try:
        # The check `htmllm embed` and `htmllm serve` make, before anything is loaded: a training run's
        # folder had been "cannot read config.json", where they suggest the run's model/.
        check_checkpoint_path(args.checkpoint, "--checkpoint")
    except HtmllmError as exc:
        print(f"htmllm export-onnx: {exc.code}: {exc}", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out is not None else default_onnx_path(args.checkpoint, quantize)
    problem = _unwritable(out)
    if problem is not None:
        print(f"htmllm export-onnx: cannot write {out}: {problem}", file=sys.stderr)
        return 1
    try:
        # Another quantisation's graph there is another configuration's (a server's HTMLLM_ONNX_PATH):
        # refused before the checkpoint loads, and again under the export's lock.
        check_quantization(out, quantize)
    except HtmllmError as exc:
        print(f"htmllm export-onnx: {exc.code}: {exc}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    try:
        # Before the load: a `save_heads` between the two (while the export waits minutes for another's
        # lock, say) then leaves the graph stale, where the fingerprint taken after it had stamped the
        # old heads' graph as the new checkpoint's, and every server kept serving it.
        fingerprint = checkpoint_fingerprint(args.checkpoint)
        if not args.force and _up_to_date_at(out, fingerprint, quantize, opset):
            # Run again (a deploy script's every run) it had exported the same graph again: minutes.
            print(
                f"htmllm export-onnx: {out} is up to date: exported from {args.checkpoint} as it is now "
                f"(fingerprint {fingerprint[:16]}), {quantize or 'float32'}, opset {opset}; left as it "
                "is (--force exports it again)",
                file=sys.stderr,
            )
            return 0
        path = export_onnx_locked(
            load_checkpoint(args.checkpoint),
            out,
            fingerprint=fingerprint,
            opset=opset,
            quantize=quantize,
            on_wait=_say_waiting,
        )
    except HtmllmError as exc:
        print(f"htmllm export-onnx: {exc.code}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # outside the exporter's own error handling: its temporary file, say
        print(f"htmllm export-onnx: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    written = _written_opset(path)
    if written != opset:
        print(
            f"htmllm export-onnx: wrote {path} at opset {written}, not the {opset} asked for: "
            f"the exporter could not convert the graph",
            file=sys.stderr,
        )
        return 1
    size_mb = path.stat().st_size / 1e6
    elapsed = time.perf_counter() - started
    print(f"wrote {path} (opset {written}, {size_mb:.1f} MB) in {elapsed:.1f}s", file=sys.stderr)
    return 0
