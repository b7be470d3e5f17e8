"""`htmllm embed`: bulk-embed a page collection into one Parquet file, resumably, through the Engine.

Resumability (a restart after `kill -9` or Ctrl-C writes every document exactly once): results go to
append-only part files in `<output>.parts/`, each written to a temporary name and renamed, so a part is
either complete or absent. Every row carries its input position (`index`); on restart the union of the
parts' indices is the done-set and only the other documents are embedded. When all are done the parts are
merged, sorted by index, into `<output>` (again via a temporary name; refused unless they hold each index
of the input once) and the parts directory removed; a crash during the merge just merges again. The
on-disk rules (the lock that refuses a second run on the same output, `run.json` pinning the checkpoint's
fingerprint, the options and the pruner's and tokenizers' versions so a resumed run cannot mix two
models or two preprocessings, the check that a resumed input is the one that was started; --overwrite
starts over from an interrupted run it cannot resume) are `resume_state`'s, shared with `htmllm
extract`; the Parquet parts and the settings kept in the output's metadata are `embed_state`'s.

Rows: `index`, `id`, `url`, `http_status` and `content_type` (a WARC page's HTTP status and Content-Type,
`response_fields`; null for any other page), `warc_truncated` (why the crawler cut a WARC page's record
short, its WARC-Truncated: `length`, `time`, `disconnect`...; null for a whole record and any other page),
`embedding` (float32 list, null on error), `tokens`,
`truncated`, `error` (an ErrorCode, null on success), `error_message` (why, null on success), then per
classification head `<head>` (top label) and `<head>.probs` (float32 list in label order), per regression
head `<head>` (float).

A document that fails (an input row that is not JSON, a page over the 16 MiB cap, a page nested too deep;
a page file that cannot be read, `input_unreadable`; pages over the token limit are truncated)
gets its row with the error and the run goes on: one bad line in a crawl dump must not stop a run of
millions. Such a row is done, as every written row is: a resume does not read that page again. A failure
of the engine that a retry may fix (shutting down under Ctrl-C, a timeout, a full queue, a backend
failure, `not_ready`: the page's preprocessing process killed from outside, by the OOM killer or
`kill -9`, in each of the Engine's tries, `failures.ProcessLostError`) is never written: the document
is left for the next run, and the command exits 1 without merging (130 after Ctrl-C; 143 after SIGTERM
and 129 after SIGHUP, which end the run as Ctrl-C does: `sigterm_as_ctrl_c`). A part that cannot be
written (a full disk) ends the run at once, exit 1: no page more is taken, those in flight are
cancelled, and what no part holds is left for the next run. Options, the input and the checkpoint's
metadata are checked before the model loads or a file is created; a missing output directory is made.
A larger --limit (or none) goes on from a run or finished output of a smaller one (`limit_raised`).
--device is not pinned (the same weights in the pinned dtype differ only by rounding), but recorded: each
part and the output carry the devices their rows were embedded on (`htmllm.devices`), and a run going on
from rows of another device says so. A directory of pages holding files the reader passes over by their
names (`.xhtml`, `.php`, no suffix) has them counted, with their names, in the last line
(`resume_state.unread_files_note`), where they had been left out in silence.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from service.commands.embed_state import (
    UNRECORDED_DEVICE,
    OutputUnreadable,
    ParquetParts,
    merge,
    output_settings,
    part_devices,
)
from service.commands.options import (
    STDIN_INPUT,
    STDIO,
    OptionError,
    at_least,
    check_output_parent,
    compressed_output_problem,
    path_or_stdio,
)
from service.commands.resume_state import (
    INPUT_KEY,
    RUN_FILE,
    Deferred,
    InputChanged,
    InputWalk,
    PartWriter,
    changed,
    check_has_pages,
    clean_leftovers,
    done_set,
    holds_parts,
    input_change,
    input_identity,
    installed_version,
    leftovers,
    limit_raised,
    only_input_stops_the_limit,
    own_files,
    part_files,
    parts_dir,
    pin_settings,
    pinned_settings,
    remove_parts,
    run_lock,
    sigterm_as_ctrl_c,
    unread_files_note,
)
from service.core.attention import ATTENTION_CHOICES, AUTO_ATTENTION, attention_option
from service.core.checkpoint_path import check_checkpoint_path
from service.core.errors import ErrorCode, HtmllmError, shown
from service.core.quantization import NO_QUANTIZATION, QUANTIZATION_CHOICES, quantization_option

if TYPE_CHECKING:
    import pyarrow as pa

    from service.core.modeling import HeadSpec
    from service.core.pages import Page
    from service.engine import EngineConfig

# Documents per part file (--part-size): the rows a run holds in memory, and so what `kill -9` costs.
PART_SIZE = 512
# Bumped when the rows change; run.json pins it, so parts of an older layout are never merged with new.
# 2: `error_message`. 3: `http_status` and `content_type`. 4: a WARC's HTTP response with no body and no
# Content-Type (a bare redirect) is a row, its `http_status` kept (format 3 passed it over: every later
# row's `index` is one more). 5: a JSONL row with both `html` and `file`, or whose `encoding` names no
# charset, is an error row (the `file` and the label had been ignored in silence); a WARC's `url` loses
# WARC 1.0's angle brackets, and an untyped response record holding an HTTP response is a row; a corrupt
# member of a per-record .warc.gz is one row and the records after it are read. 6: `warc_truncated`; a
# record without a WARC-Record-ID inside a compressed stream is `<file>#<n>` (records in one gzip member
# had shared an id), and a corrupt zstd or LZ4 frame of a per-record file (or a gzip member FastWARC
# stops at quietly) is one row, the records after it read (they had been lost). 7: a .warc.gz whose gzip
# members do not line up with records (bgzip, pgzip) has no false error row at its end; a record whose
# WARC header lines end in LF alone is a page (plain and per-record files) or a row saying so (one-stream
# files), not skipped; reading never resumes inside a damaged member (a stored .warc.gz made pages); the
# messages of undecompressable members changed. 8: a corrupt member of a bgzip/pgzip .warc.gz is one row
# and the records after it are read (reading had ended there); a record whose header has no WARC-Type
# field is an error row (it had vanished); the fence in a damaged member holding a stored .warc.gz
# follows the record that shows it; untyped WARC responses starting with a BOM, in UTF-16 or content-coded
# are rows (an undecodable coding an error row); a JSONL `encoding` is read as an HTTP charset parameter
# (`"windows-1252"` and `windows-1252;` are used, `'utf-8'`-style labels are validation_error rows).
# 9: the records after an empty gzip member or LZ4 frame are read (two bgzip files joined by `cat` hold one
# between them; reading had ended there, silently); a JSONL row nested too deep, whose `url` is not a
# string or whose `file` is a WARC or JSONL file is a validation_error row; a corpus's manifest.jsonl.gz
# is read; a directory of pages leaves out hidden files and __MACOSX/ and walks each directory once.
ROW_FORMAT = 9
# The columns every row has: a head's column (`<head>`, `<head>.probs`) must be none of them.
FIXED_COLUMNS = (
    "index",
    "id",
    "url",
    "http_status",
    "content_type",
    "warc_truncated",
    "embedding",
    "tokens",
    "truncated",
    "error",
    "error_message",
)
# Failures a later attempt may not repeat: written as rows they would be "done" for good.
TRANSIENT = frozenset(
    {
        ErrorCode.SHUTTING_DOWN,
        ErrorCode.TIMEOUT,
        ErrorCode.OVERLOADED,
        ErrorCode.BACKEND_FAILED,
        ErrorCode.NOT_READY,  # a page's preprocessing process killed from outside (the OOM killer)
    }
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "embed", help="embed a collection of pages into a Parquet file (resumable after a crash)"
    )
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint directory")
    parser.add_argument(
        "--input",
        required=True,
        type=path_or_stdio,
        help=(
            "pages: a JSONL(.gz) file, a WARC file (.warc, .warc.gz, .warc.zst, .warc.lz4), a corpus "
            "directory with manifest.jsonl(.gz), or a directory of HTML and WARC files"
        ),
    )
    parser.add_argument("--output", required=True, type=path_or_stdio, help="Parquet file to write")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing output written with other settings (or not by htmllm embed), and start "
        "over from an interrupted run with other settings or over a changed input (its parts are deleted)",
    )
    parser.add_argument("--backend", choices=("torch", "onnx"), default="torch", help="inference backend")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model runs")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="model precision (bfloat16 also on CPUs with AMX/AVX512-BF16; float16 on CUDA)",
    )
    parser.add_argument(
        "--onnx-quantize",
        choices=QUANTIZATION_CHOICES,
        default=NO_QUANTIZATION,
        help="onnx backend on CPU: run the int8 graph (model.int8.onnx, exported when missing)",
    )
    parser.add_argument(
        "--onnx-path",
        type=Path,
        default=None,
        help="onnx backend: the graph file (as HTMLLM_ONNX_PATH), used when up to date with the checkpoint, "
        "else exported there; default <checkpoint>/model.onnx, or the temporary directory when the "
        "checkpoint is read-only",
    )
    parser.add_argument(
        "--attention",
        choices=ATTENTION_CHOICES,
        default=AUTO_ATTENTION,
        help="torch backend: auto picks packed varlen batches on CUDA in half precision, padded SDPA on CPU",
    )
    parser.add_argument(
        "--max-length",
        type=at_least(2),
        default=None,
        help="truncate documents to this many tokens (default: the checkpoint's max_length)",
    )
    parser.add_argument(
        "--batch-tokens", type=at_least(1), default=16384, help="token budget per forward pass"
    )
    parser.add_argument("--batch-size", type=at_least(1), default=64, help="documents per forward pass")
    parser.add_argument("--workers", type=at_least(1), default=2, help="pruning and tokenization workers")
    parser.add_argument(
        "--preprocess-pool",
        choices=("thread", "process"),
        default="process",
        help="process (default): the workers are processes, which scale with cores (pruning holds the GIL) "
        "and stop a page after 20 s or 1024 MiB of data (it becomes a preprocess_failed or "
        "payload_too_large row; a process killed from outside, as by the OOM killer, is replaced and "
        "its page tried again); thread: no processes, no limits",
    )
    parser.add_argument(
        "--inference-process",
        action="store_true",
        help="run the model in a child process with a GIL of its own (HTMLLM_INFERENCE_PROCESS)",
    )
    parser.add_argument(
        "--intra-op-threads",
        type=at_least(1),
        default=None,
        help="CPU threads per forward pass (default OMP_NUM_THREADS, else the container's CPU limit or the "
        "CPUs in the affinity mask)",
    )
    parser.add_argument(
        "--heads",
        default=None,
        help='comma-separated heads to score, white space around each name ignored (default: all; "" for '
        'none, as the API\'s "heads": [])',
    )
    parser.add_argument("--no-normalize", action="store_true", help="write unnormalised embeddings")
    parser.add_argument(
        "--limit",
        type=at_least(1),
        default=None,
        help="embed only the first N pages (a later run with a larger N, or none, keeps their rows)",
    )
    parser.add_argument(
        "--part-size",
        type=at_least(1),
        default=PART_SIZE,
        help="documents per part file (the resume grain): finished rows are held until a part fills, so a "
        "kill -9 leaves up to this many less one, and the pages in flight, to be embedded again by the "
        "next run; Ctrl-C, SIGTERM and SIGHUP write them first",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.output is STDIO:  # a Parquet file named "-" had been written
        print(
            "htmllm embed: --output -: embed writes a Parquet file (finished from parts kept beside it), "
            "not standard output; name that file (./- for a file named -)",
            file=sys.stderr,
        )
        return 2
    if args.input is STDIO:  # "page source - does not exist"
        print(f"htmllm embed: {STDIN_INPUT}", file=sys.stderr)
        return 2
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        print("htmllm embed: needs pyarrow (pip install pyarrow)", file=sys.stderr)
        return 2
    with sigterm_as_ctrl_c() as termination:
        try:
            return _run(args)
        except KeyboardInterrupt:
            parts = parts_dir(args.output)
            kept = f"what was finished is kept in {parts}: " if parts.exists() else ""
            again = "run the same command again to go on"
            # After SIGHUP stderr may be the terminal that hung up (EIO): the line is lost, not the status.
            with contextlib.suppress(OSError):
                print(f"htmllm embed: {termination.how}; {kept}{again}", file=sys.stderr)
            return termination.status
        except HtmllmError as exc:
            print(f"htmllm embed: {exc.code}: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:  # an output that cannot be written (a full disk...)
            print(f"htmllm embed: {exc}", file=sys.stderr)
            return 1


@dataclass(frozen=True)
class _Plan:
    """What the command line asks for, checked, with the settings that determine its rows."""

    config: EngineConfig
    heads: list[str]  # as asked, each once, in the checkpoint's order
    specs: list[HeadSpec]  # those heads' specs (the columns' order)
    settings: dict[str, Any]


@dataclass
class _Outcome:
    """What a run did, for its last line and for the merge's check."""

    documents: int = 0  # input rows seen, done before or not
    written: int = 0  # rows written this run, error rows included
    failures: int = 0  # error rows written this run
    deferred: Deferred = field(default_factory=Deferred)  # transient failures, not written


def _check_input(path: Path, output: Path) -> None:
    """The input exists, can be read, is a kind of page source (`pages.source_kind`: a file of no kind
    it reads is refused here, not after the model loaded) and holds a page (`check_has_pages`; its first
    is read, so a JSONL file in UTF-16 is refused here too), the run's own files beside `output` left
    out."""
    from service.core.pages import PageUnreadableError, iter_pages, source_kind

    # Missing, a dangling symlink, closed to this user (EACCES on a directory above it), neither a file
    # nor a directory: `source_kind`'s rule, which `htmllm extract` reads its input through too.
    kind, read_from = source_kind(path)
    try:
        if kind == "directory":
            with os.scandir(path):
                pass
        else:
            with read_from.open("rb"):
                pass
    except OSError as exc:
        raise PageUnreadableError(f"page source {path} cannot be read: {exc.strerror}") from exc
    check_has_pages(path, next(iter_pages(path, limit=1, bad_rows="report", skip=own_files(output)), None))


def response_fields(page: Page, *, jsonl: bool) -> dict[str, Any]:
    """`http_status`, `content_type` and `warc_truncated` of a page read from a WARC record (`warc_pages`
    records them in `Page.meta`; a resource record's Content-Type is its WARC header's; WARC-Truncated
    where the crawler cut the record short), null for any other page: the one rule for `htmllm embed`'s
    columns and `htmllm extract`'s fields, so 404 bodies, empty redirects and partial pages can be
    filtered out afterwards. `jsonl`: the input is a JSONL file or a corpus manifest, whose rows' own
    fields land in `Page.meta` too (`warc_file` among them where a dump carries it): a row's
    "http_status" is its writer's word, of any type (a string would fail the int32 column's write), never
    a response this run read. A value of a type the reader does not record is null likewise."""
    if jsonl or "warc_file" not in page.meta:
        return {"http_status": None, "content_type": None, "warc_truncated": None}
    status, content_type = page.meta.get("http_status"), page.meta.get("content_type")
    truncated = page.meta.get("warc_truncated")
    return {
        # A status line's three digits (`warc_record_page._STATUS_LINE`); a bool is no status.
        "http_status": status if type(status) is int and 0 <= status <= 999 else None,
        "content_type": content_type if isinstance(content_type, str) else None,
        "warc_truncated": truncated if isinstance(truncated, str) else None,
    }


def head_columns(name: str, kind: str) -> list[str]:
    """The output columns of a head: its value, and for a classifier its probabilities too (one rule
    for this command's schema and for `htmllm heads train`, which refuses names that would collide)."""
    return [name, f"{name}.probs"] if kind == "classification" else [name]


def _check_columns(specs: list[HeadSpec]) -> None:
    """Refuse heads whose columns would collide with a fixed column (a head named `tokens`, `error`,
    ...) or with each other's: the output's schema could not hold them, and it would be found
    only when the first part is written, after the model loaded."""
    seen = set(FIXED_COLUMNS)
    for spec in specs:
        for column in head_columns(spec.name, spec.kind):
            if column in seen:
                raise OptionError(
                    f"head {spec.name!r} would write a column {column!r} the output already has; "
                    "leave it out with --heads (or rename it in the checkpoint)"
                )
            seen.add(column)


def _plan(args: argparse.Namespace) -> _Plan:
    """Check everything a command line can get wrong before the model loads (seconds to minutes) or a
    file is created (a run.json written for a typo would pin it)."""
    _check_input(args.input, args.output)
    problem = compressed_output_problem(str(args.output), "embed", "a Parquet file (compressed inside)")
    if problem is not None:
        raise OptionError(problem)
    check_output_parent(args.output)
    check_checkpoint_path(args.checkpoint, "--checkpoint")  # before torch's import (seconds)
    from service.core.checkpoint import checkpoint_fingerprint, read_meta
    from service.engine import EngineConfig

    if args.onnx_path is not None and args.backend != "onnx":
        raise OptionError("--onnx-path is the onnx backend's graph: give it with --backend onnx")
    try:
        config = EngineConfig(
            backend=args.backend,
            device=args.device,
            dtype=args.dtype,
            onnx_quantize=quantization_option(args.onnx_quantize),
            onnx_path=None if args.onnx_path is None else str(args.onnx_path),
            attn_implementation=attention_option(args.attention),
            max_length=args.max_length,
            max_batch_tokens=args.batch_tokens,
            max_batch_requests=args.batch_size,
            max_queue_documents=max(4 * args.batch_size, 256),
            preprocess_workers=args.workers,
            preprocess_pool=args.preprocess_pool,
            inference_process=args.inference_process,
            intra_op_threads=args.intra_op_threads,
            max_wait_ms=5.0,
        )
    except ValueError as exc:
        raise OptionError(str(exc)) from exc
    from service.engine.loading import check_device

    try:  # the server's check: CUDA where there is none, an attention the device cannot run
        check_device(config)
    except ValueError as exc:
        raise OptionError(
            f"--device {args.device}, --dtype {args.dtype}, --attention {args.attention}: {exc}"
        ) from exc
    if args.backend == "onnx":
        try:
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            raise OptionError("--backend onnx needs onnxruntime (pip install onnxruntime)") from exc
    meta = read_meta(args.checkpoint)
    if args.max_length is not None and args.max_length > meta.max_length:
        raise OptionError(f"--max-length {args.max_length} exceeds the checkpoint's {meta.max_length}")
    known = [spec.name for spec in meta.heads]
    if args.heads is None:
        asked = known
    elif not args.heads.strip():  # none, as the API's `"heads": []` (it had meant every head, as no --heads)
        asked = []
    else:
        # White space around a name is no part of it: `--heads "tld, url_depth"` had refused ' url_depth'.
        # An empty name between commas ("tld,,url_depth") is still refused, as a head nobody has.
        asked = list(dict.fromkeys(name.strip() for name in args.heads.split(",")))
    unknown = [name for name in asked if name not in known]
    if unknown:
        raise HtmllmError(
            f"unknown head(s) {shown(unknown)}; this model has {sorted(known)}", code=ErrorCode.UNKNOWN_HEAD
        )
    # In the checkpoint's order, whatever --heads' order: the same heads are the same run (and columns).
    heads = [name for name in known if name in asked]
    specs = [spec for spec in meta.heads if spec.name in heads]
    _check_columns(specs)
    from service.core.prune import PRUNE_VERSION

    settings = {
        "row_format": ROW_FORMAT,
        # The code that turns a page into tokens, where the checkpoint does not pin it: the pruner (a
        # version bump changes the pruned text of some page), the HTML parser it serializes (selectolax's
        # Lexbor: a parser fix changes the tree of some page), and the tokenizers library, whose Unicode
        # tables (NFC, the Punctuation pre-tokenizer) and fixes can give other ids for the same
        # tokenizer.json. Unpinned, a resume across an upgrade mixed both in one output, and an older
        # output passed for complete.
        "prune_version": PRUNE_VERSION,
        "selectolax_version": installed_version("selectolax"),
        "tokenizers_version": installed_version("tokenizers"),
        "input": str(args.input.resolve()),
        INPUT_KEY: input_identity(args.input, args.output, _recorded_identities(args.output)),
        "limit": args.limit,
        "model": meta.name,
        "tokenizer_sha256": meta.tokenizer_sha256,
        "checkpoint_sha256": checkpoint_fingerprint(args.checkpoint),
        "embedding_dim": meta.embedding_dim,
        "max_length": args.max_length or meta.max_length,
        "heads": heads,
        "normalize": not args.no_normalize,
        "backend": args.backend,
        "dtype": args.dtype,
        "onnx_quantize": config.onnx_quantize,
        # Processes hold a page to 20 s and 1024 MiB (past them, an error row), threads do not (the page
        # is embedded): a resume with the other pool had mixed both answers in one output. Not --device:
        # on a GPU the same weights in the same dtype give the same rows but for rounding, as other
        # batch mates, another attention kernel or another thread count do on one device; a run begun on
        # a CPU may be finished on a GPU. It is recorded instead (`htmllm.devices`, `_say_other_devices`).
        "preprocess_pool": args.preprocess_pool,
    }
    return _Plan(config, heads, specs, settings)


def _recorded_identities(output: Path) -> list[Any]:
    """The input identities earlier runs on `output` recorded (its run.json's, the finished output's), so
    that `input_identity` need not read a JSONL file through that is the one they saw. One that cannot
    be read gives none: `_finished` and `pin_settings` say why, where it matters."""
    recorded = [(pinned_settings(parts_dir(output)) or {}).get(INPUT_KEY)]
    try:
        if output.is_file():
            recorded.append((output_settings(output) or {}).get(INPUT_KEY))
    except (HtmllmError, OSError):
        pass
    return recorded


# What an existing output is to a run (`_finished`): its finished output; a finished output of a smaller
# --limit, whose rows are this run's first; or nothing to keep (none there, or one --overwrite replaces).
_Found = Literal["complete", "smaller_limit", "none"]


def _finished(output: Path, settings: dict[str, Any], overwrite: bool) -> _Found:
    """What `output` is to a run of `settings`; another run's output, or a file this command did not
    write, is refused unless `overwrite` (then "none": it is replaced when the run merges, its rows not
    kept, even those of a smaller --limit: --overwrite starts over)."""
    if not output.exists():
        return "none"
    if output.is_dir():
        raise OptionError(f"{output} is a directory, not a Parquet file")
    try:
        previous = output_settings(output)
    except OutputUnreadable:
        if overwrite:  # asked for: replaced unread
            return "none"
        raise
    if previous == settings:
        return "complete"
    if overwrite:
        return "none"
    if previous is not None and limit_raised(settings, previous):
        return "smaller_limit"
    if previous is None:
        why = "was not written by this version of htmllm embed"
    elif only_input_stops_the_limit(settings, previous):  # a larger --limit, but over another input
        why = (
            f"was written before its input changed ({input_change(settings, previous)}): a larger --limit "
            "goes on only over the same input"
        )
    elif other := changed(settings, previous, recorded=settings.keys()):
        why = f"was written with other settings ({other})"
    else:  # the same options over an input rewritten or grown since: its rows may be stale
        why = f"was written before its input changed ({input_change(settings, previous)})"
    raise OptionError(f"{output} {why}; pass --overwrite to replace it")


def _schema(dim: int, heads: list[HeadSpec]) -> pa.Schema:
    import pyarrow as pa

    fields = [
        pa.field("index", pa.int64(), nullable=False),
        pa.field("id", pa.string()),
        pa.field("url", pa.string()),
        pa.field("http_status", pa.int32()),
        pa.field("content_type", pa.string()),
        pa.field("warc_truncated", pa.string()),
        pa.field("embedding", pa.list_(pa.float32(), dim)),
        pa.field("tokens", pa.int32()),
        pa.field("truncated", pa.bool_()),
        pa.field("error", pa.string()),
        pa.field("error_message", pa.string()),
    ]
    for spec in heads:
        if spec.kind == "classification":
            fields += [
                pa.field(spec.name, pa.string()),
                pa.field(f"{spec.name}.probs", pa.list_(pa.float32())),
            ]
        else:
            fields.append(pa.field(spec.name, pa.float64()))
    labels = {spec.name: spec.labels for spec in heads if spec.kind == "classification"}
    return pa.schema(fields, metadata={"htmllm.head_labels": json.dumps(labels)})


def _run(args: argparse.Namespace) -> int:
    output: Path = args.output
    parts = parts_dir(output)
    plan = _plan(args)
    complete = f"htmllm embed: {output} is complete with these settings; nothing to do"
    # Without the lock only when there is nothing to clean: a run killed while it removed its parts
    # leaves them whole in a temporary folder, which must not stay there for good.
    found = _finished(output, plan.settings, args.overwrite)
    if found == "complete" and not parts.exists() and not leftovers(output):
        print(complete, file=sys.stderr)
        return 0
    with run_lock(parts):
        clean_leftovers(output, parts)
        try:  # again under the lock: another run may have finished meanwhile
            found = _finished(output, plan.settings, args.overwrite)
        except HtmllmError:
            if not (parts / RUN_FILE).exists():
                remove_parts(parts, output)  # only created by this run, to take the lock
            raise
        if found == "complete":
            # The parts are this run's merged ones (killed before their removal), or an interrupted
            # --overwrite run's with other settings, which this finished output must not cost.
            pinned = pinned_settings(parts)
            if not (parts / RUN_FILE).exists() or pinned == plan.settings or not holds_parts(parts):
                remove_parts(parts, output)
                print(complete, file=sys.stderr)
            else:
                why = changed(plan.settings, pinned or {}, recorded=plan.settings.keys()) or "input"
                print(
                    f"{complete}; {parts} holds an interrupted run with other settings ({why}), left as "
                    "it was: run that command again to finish it, or delete it",
                    file=sys.stderr,
                )
            return 0
        if discarded := pin_settings(
            parts, plan.settings, recorded=plan.settings.keys(), overwrite=args.overwrite, limit_may_grow=True
        ):
            print(f"htmllm embed: --overwrite: {discarded}", file=sys.stderr)
        fmt = ParquetParts(_schema(plan.settings["embedding_dim"], plan.specs), device=args.device)
        done = done_set(parts, fmt, command="htmllm embed")
        writer = PartWriter(parts, fmt, args.part_size)
        kept = _keep_smaller_limit(output, writer, done) if found == "smaller_limit" else None
        _say_other_devices(parts, fmt, args.device)
        try:
            outcome = asyncio.run(_embed_all(args, plan, done, writer))
        except BaseException as exc:
            # Keep what was finished, less error rows: a worker killed by the same Ctrl-C fails a page for
            # a reason not its own; dropped, it is redone.
            writer.flush(keep=lambda row: row["error"] is None)
            if writer.failed is not None and exc is not writer.failed:
                # A part the disk would not take ended the run, and Ctrl-C (SIGTERM, SIGHUP) came while
                # it stopped: the full disk is what the user must hear of, with its status, not "interrupted".
                raise writer.failed from None
            if isinstance(exc, InputChanged) and kept is not None and exc.index in kept.indices:
                raise _stale_output(output, kept, exc) from exc
            raise
        writer.flush()
        if outcome.deferred.codes:
            print(
                f"htmllm embed: {outcome.deferred.said('documents', 'were left for the next run')}; run "
                "the same command again to embed them",
                file=sys.stderr,
            )
            return 1
        rows = merge(parts, output, fmt.schema, outcome.documents, plan.settings)
        remove_parts(parts, output)
    # Both halves: after a resume, the rows of this run alone had passed for the whole output.
    print(
        f"wrote {rows} documents to {output}: {len(done)} resumed from earlier runs, {outcome.written} "
        f"embedded this run ({outcome.failures} failed){unread_files_note(args.input, output)}",
        file=sys.stderr,
    )
    return 0


@dataclass(frozen=True)
class _Kept:
    """A finished output of a smaller --limit, taken as a part of this run (`_keep_smaller_limit`)."""

    part: Path
    indices: range  # its documents: 0..n-1, as its merge checked


def _keep_smaller_limit(output: Path, writer: PartWriter, done: dict[int, str]) -> _Kept | None:
    """Make `output`, finished with a smaller --limit, a part of this run: its rows are this run's first
    (`limit_raised`), done. Not when the parts hold one of its documents already: an interrupted run of
    these settings took it before (or, begun before it was written, did those documents itself)."""
    indices, ids = writer.fmt.keys(output)
    if any(index in done for index in indices):
        return None
    part = writer.adopt(output)
    done.update(zip(indices, ids, strict=True))
    print(
        f"htmllm embed: {output} holds the first {len(indices)} documents (a smaller --limit): they are kept",
        file=sys.stderr,
    )
    return _Kept(part, range(min(indices, default=0), max(indices, default=-1) + 1))


def _stale_output(output: Path, kept: _Kept, exc: InputChanged) -> OptionError:
    """The refusal of a finished output of a smaller --limit whose rows are no longer the input's first
    pages: the input was rewritten with its size and modification time (`input_identity` passed it, the
    ids' check did not). Its part is removed again, and the parts directory where nothing else is in it:
    left there, it was refused as an interrupted run's ("delete the parts"), and the next run took the
    output again, to be refused again, for ever; --overwrite resumed it. Refused as an output written
    before its input changed, --overwrite starts over."""
    kept.part.unlink(missing_ok=True)
    parts = kept.part.parent
    if not holds_parts(parts):
        remove_parts(parts, output)
    return OptionError(
        f"{output} was written before its input changed ({exc.detail}; its size and modification time "
        "are as they were): a larger --limit goes on only over the same input; pass --overwrite to replace it"
    )


def _say_other_devices(parts: Path, fmt: ParquetParts, device: str) -> None:
    """Say so where the rows this run goes on from (an interrupted run's parts, a finished output of a
    smaller --limit) were embedded on another --device. Not pinned, so not refused: the same weights in
    the same (pinned) dtype give the same rows but for rounding, as other batch mates do on one device,
    and a run begun on a CPU may be finished on a GPU. Recorded all the same: each part and the output
    carry their devices (`embed_state.DEVICES_METADATA_KEY`), so an output of two is known as one."""
    earlier = {name for part in part_files(parts, fmt) for name in part_devices(part)}
    other = sorted(earlier - {device, UNRECORDED_DEVICE})
    if other:
        print(
            f"htmllm embed: the rows kept from earlier runs were embedded with --device {', '.join(other)}, "
            f"this run's with --device {device}: the same weights in the same dtype, they differ only by "
            "rounding (as with other batch mates); the output records each device",
            file=sys.stderr,
        )


async def _embed_all(
    args: argparse.Namespace, plan: _Plan, done: dict[int, str], writer: PartWriter
) -> _Outcome:
    """Embed every input document not in `done` and hand its row to `writer`."""
    from service.core.pages import count_pages, iter_pages, source_kind
    from service.core.progress import progress_bar
    from service.engine import Document, Engine
    from service.engine.collector import prepare_for_serving

    try:
        engine = Engine.from_checkpoint(args.checkpoint, plan.config)
    except ValueError as exc:  # an option only the backend can check (an attention it lacks...)
        raise OptionError(f"cannot run {args.checkpoint}: {exc}") from exc
    except OSError as exc:
        raise HtmllmError(f"cannot load {args.checkpoint}: {exc}", code=ErrorCode.CHECKPOINT_INVALID) from exc
    loaded = engine.info.checkpoint_sha256
    if loaded is not None and loaded != plan.settings["checkpoint_sha256"]:
        # The run's settings (and the parts' pin) name the checkpoint as it was when the command started;
        # one replaced before the load (a `heads train` into it) would have made rows under the old one's
        # fingerprint. The Engine fingerprints the files it loads, just before loading them.
        engine.close()
        raise HtmllmError(
            f"{args.checkpoint} changed while the command started (fingerprint "
            f"{plan.settings['checkpoint_sha256'][:16]} -> {loaded[:16]}): run the command again",
            code=ErrorCode.CHECKPOINT_INVALID,
        )
    outcome = _Outcome()
    parts = writer.parts
    jsonl = source_kind(args.input)[0] == "jsonl"  # no WARC page in it: see `response_fields`
    normalize = not args.no_normalize
    in_flight = asyncio.Semaphore(max(2 * args.batch_size, 8))
    progress = progress_bar(initial=len(done), unit="doc", desc="embed", disable=args.no_progress)
    # The total (and so an ETA) comes from counting the input beside the run: a JSONL file of millions
    # of rows takes a while to count, which the first batches need not wait for.
    stop_counting = threading.Event()
    if not args.no_progress:
        counting = asyncio.get_running_loop().run_in_executor(
            None,
            functools.partial(
                count_pages, args.input, limit=args.limit, stop=stop_counting, skip=own_files(args.output)
            ),
        )

        def set_total(future: asyncio.Future[int | None]) -> None:
            total = None if future.cancelled() or future.exception() else future.result()
            if total is not None:
                progress.total = total
                progress.refresh()

        counting.add_done_callback(set_total)

    # The first task that failed (a part that could not be written: a full disk) ends the run.
    failure: list[BaseException] = []
    tasks: set[asyncio.Task[None]] = set()

    def settle(task: asyncio.Task[None]) -> None:
        """A task's end: its slot freed (here, so that one cancelled before it started frees it too),
        and the first failure taken, every other task cancelled. A run that went on embedded for
        minutes into parts a full disk would not take, each failure a "Task exception was never
        retrieved" traceback, and only said why at its end."""
        tasks.discard(task)
        in_flight.release()
        if failure or task.cancelled() or (exc := task.exception()) is None:
            return
        failure.append(exc)
        for other in tasks:
            other.cancel()

    async def one(index: int, page: Page) -> None:
        row: dict[str, Any] = {"index": index, "id": page.id, "url": page.url}
        row.update(response_fields(page, jsonl=jsonl))
        try:
            if page.error is not None:
                raise HtmllmError(page.error, code=page.error_code)
            (result,) = await engine.embed(
                [Document(html=page.html, id=page.id, url=page.url)], heads=plan.heads, normalize=normalize
            )
        except HtmllmError as exc:
            if exc.code in TRANSIENT:
                outcome.deferred.note(exc.code, exc.message)
                return
            outcome.failures += 1
            row.update(
                embedding=None, tokens=None, truncated=None, error=str(exc.code), error_message=exc.message
            )
        else:
            row.update(
                embedding=result.embedding.tolist(),
                tokens=result.tokens,
                truncated=result.truncated,
                error=None,
                error_message=None,
            )
            for spec in plan.specs:
                score = result.scores[spec.name]
                if isinstance(score, dict):
                    row[spec.name] = max(score, key=score.__getitem__)
                    row[f"{spec.name}.probs"] = [score[label] for label in spec.labels]
                else:
                    row[spec.name] = score
        writer.add(row)
        outcome.written += 1
        progress.update(1)

    try:
        async with engine:
            prepare_for_serving()  # the model is loaded: set the garbage collector for serving
            walk = InputWalk(done, parts)
            pages = iter_pages(args.input, limit=args.limit, bad_rows="report", skip=own_files(args.output))
            for index, page in walk.todo(pages):
                await in_flight.acquire()
                if failure:
                    break  # no page more
                task = asyncio.create_task(one(index, page))
                tasks.add(task)
                task.add_done_callback(settle)
            # Every task's end awaited, its failure taken by `settle` (cancelled ones included).
            await asyncio.gather(*tasks, return_exceptions=True)
            if failure:
                raise failure[0]
            outcome.documents = walk.documents
    finally:
        stop_counting.set()
        progress.close()
    return outcome
