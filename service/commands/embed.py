"""`htmllm embed`: bulk-embed a page collection into one Parquet file, resumably, through the Engine.

Resumability (a restart after `kill -9` writes every document exactly once): results go to append-only
part files in `<output>.parts/`, each written to a temporary name and renamed, so a part is either
complete or absent. Every row carries its input position (`index`); on restart the union of the parts'
indices is the done-set and only the other documents are embedded. When all are done the parts are
merged, sorted by index, into `<output>` (again via a temporary name) and the parts directory removed;
a crash during the merge just merges again. `run.json` in the parts directory pins the checkpoint and
options, so a resumed run cannot mix embeddings from two models.

Rows: `index`, `id`, `url`, `embedding` (float32 list, null on error), `tokens`, `truncated`, `error`
(an ErrorCode, null on success), `error_message` (why, null on success), then per classification head
`<head>` (top label) and `<head>.probs` (float32 list in label order), per regression head `<head>` (float).

A document that fails (an input row that is not JSON or names a missing file, a page nested too deep, a
page over the token limit with truncation off) gets its row with the error and the run goes on: one bad
line in a crawl dump must not stop a run of millions. Only an input source that does not exist, an
unusable checkpoint or unwritable output stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.core.attention import ATTENTION_CHOICES, AUTO_ATTENTION, attention_option
from service.core.quantization import NO_QUANTIZATION, QUANTIZATION_CHOICES, quantization_option

if TYPE_CHECKING:
    import pyarrow as pa

    from service.core.modeling import HeadSpec

PART_GLOB = "part-*.parquet"
# Bumped when the rows change; run.json pins it, so parts of an older layout are never merged with new.
ROW_FORMAT = 2


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "embed", help="embed a collection of pages into a Parquet file (resumable after a crash)"
    )
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint directory")
    parser.add_argument(
        "--input",
        required=True,
        type=Path,
        help=(
            "pages: a JSONL(.gz) file, a WARC file (.warc, .warc.gz), a corpus directory with "
            "manifest.jsonl, or a directory of HTML and WARC files"
        ),
    )
    parser.add_argument("--output", required=True, type=Path, help="Parquet file to write")
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
        "--attention",
        choices=ATTENTION_CHOICES,
        default=AUTO_ATTENTION,
        help="torch backend: auto picks packed varlen batches on CUDA in half precision, padded SDPA on CPU",
    )
    parser.add_argument("--max-length", type=int, default=None, help="truncate documents to this many tokens")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="token budget per forward pass")
    parser.add_argument("--batch-size", type=int, default=64, help="documents per forward pass")
    parser.add_argument("--workers", type=int, default=2, help="pruning and tokenization workers")
    parser.add_argument(
        "--preprocess-pool",
        choices=("thread", "process"),
        default="thread",
        help="process: the workers are processes (pruning holds the GIL; use it on a GPU)",
    )
    parser.add_argument(
        "--inference-process",
        action="store_true",
        help="run the model in a child process with a GIL of its own (HTMLLM_INFERENCE_PROCESS)",
    )
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        default=None,
        help="CPU threads per forward pass (default OMP_NUM_THREADS, else the container's CPU limit or the "
        "CPUs in the affinity mask)",
    )
    parser.add_argument("--heads", default=None, help="comma-separated heads to score (default: all)")
    parser.add_argument("--no-normalize", action="store_true", help="write unnormalised embeddings")
    parser.add_argument("--limit", type=int, default=None, help="embed only the first N pages")
    parser.add_argument("--part-size", type=int, default=512, help="documents per part file (resume grain)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from service.core.errors import HtmllmError

    try:
        import pyarrow  # noqa: F401
    except ImportError:
        print("htmllm embed: needs pyarrow (pip install pyarrow)", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(args))
    except HtmllmError as exc:
        print(f"htmllm embed: {exc.code}: {exc}", file=sys.stderr)
        return 1


def parts_dir(output: Path) -> Path:
    return output.with_name(output.name + ".parts")


def _schema(dim: int, heads: list[HeadSpec]) -> pa.Schema:
    import pyarrow as pa

    fields = [
        pa.field("index", pa.int64(), nullable=False),
        pa.field("id", pa.string()),
        pa.field("url", pa.string()),
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


def _done_set(parts: Path) -> dict[int, str]:
    """Indices (and ids) already written by complete parts; leftovers of a killed writer are removed."""
    import pyarrow.parquet as pq

    from service.core.errors import HtmllmError

    done: dict[int, str] = {}
    for leftover in parts.glob(".part-*"):
        leftover.unlink()
    for part in sorted(parts.glob(PART_GLOB)):
        table = pq.read_table(part, columns=["index", "id"])
        for index, page_id in zip(table["index"].to_pylist(), table["id"].to_pylist(), strict=True):
            if index in done:
                raise HtmllmError(f"document {index} appears twice in {parts}; delete it to start over")
            done[index] = page_id
    return done


def _write_atomic(table: pa.Table, path: Path) -> None:
    import pyarrow.parquet as pq

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _check_run(parts: Path, settings: dict[str, Any]) -> None:
    """Pin the run's settings in run.json; a resume with other settings is refused."""
    from service.core.errors import ErrorCode, HtmllmError

    pin = parts / "run.json"
    if pin.is_file():
        previous = json.loads(pin.read_text(encoding="utf-8"))
        if previous != settings:
            changed = sorted(
                k for k in settings.keys() | previous.keys() if settings.get(k) != previous.get(k)
            )
            raise HtmllmError(
                f"{parts} holds a run with other settings ({', '.join(changed)}); delete it to start over",
                code=ErrorCode.VALIDATION,
            )
        return
    fd, tmp = tempfile.mkstemp(dir=parts, prefix=".run.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(settings, handle, sort_keys=True)
    os.replace(tmp, pin)


class _PartWriter:
    def __init__(self, parts: Path, schema: pa.Schema, heads: list[HeadSpec], part_size: int) -> None:
        self.parts = parts
        self.schema = schema
        self.heads = heads
        self.part_size = part_size
        self.rows: list[dict[str, Any]] = []
        self.next_part = 1 + max((int(p.stem.split("-")[1]) for p in parts.glob(PART_GLOB)), default=-1)

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.part_size:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if not self.rows:
            return
        table = pa.Table.from_pylist(self.rows, schema=self.schema)
        _write_atomic(table, self.parts / f"part-{self.next_part:06d}.parquet")
        self.next_part += 1
        self.rows = []


def _merge(parts: Path, output: Path, schema: pa.Schema) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(f) for f in sorted(parts.glob(PART_GLOB))]
    table = pa.concat_tables(tables).sort_by("index") if tables else schema.empty_table()
    _write_atomic(table, output)
    return int(table.num_rows)


async def _run(args: argparse.Namespace) -> int:
    output: Path = args.output
    parts = parts_dir(output)
    if output.exists() and not parts.exists():
        print(f"htmllm embed: {output} is complete (no unfinished parts); nothing to do", file=sys.stderr)
        return 0

    from tqdm import tqdm

    from service.core.errors import ErrorCode, HtmllmError
    from service.core.pages import Page, iter_pages
    from service.engine import Document, Engine, EngineConfig
    from service.engine.collector import prepare_for_serving

    config = EngineConfig(
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        onnx_quantize=quantization_option(args.onnx_quantize),
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
    engine = Engine.from_checkpoint(args.checkpoint, config)
    heads = engine.resolve_heads(args.heads.split(",") if args.heads else None)
    specs = [spec for spec in engine.info.heads if spec.name in heads]
    info = engine.info
    parts.mkdir(parents=True, exist_ok=True)
    _check_run(
        parts,
        {
            "row_format": ROW_FORMAT,
            "input": str(args.input.resolve()),
            "limit": args.limit,
            "model": info.name,
            "tokenizer_sha256": info.tokenizer_sha256,
            "embedding_dim": info.embedding_dim,
            "max_length": info.max_length,
            "heads": heads,
            "normalize": not args.no_normalize,
        },
    )
    done = _done_set(parts)
    writer = _PartWriter(parts, _schema(info.embedding_dim, specs), specs, args.part_size)
    in_flight = asyncio.Semaphore(max(2 * args.batch_size, 8))
    progress = tqdm(initial=len(done), unit="doc", desc="embed", disable=args.no_progress, file=sys.stderr)
    failures = 0

    async def one(index: int, page: Page) -> None:
        nonlocal failures
        row: dict[str, Any] = {"index": index, "id": page.id, "url": page.url}
        try:
            if page.error is not None:
                raise HtmllmError(page.error, code=ErrorCode.VALIDATION)
            (result,) = await engine.embed(
                [Document(html=page.html, id=page.id, url=page.url)],
                heads=heads,
                normalize=not args.no_normalize,
            )
        except HtmllmError as exc:
            failures += 1
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
            for spec in specs:
                score = result.scores[spec.name]
                if isinstance(score, dict):
                    row[spec.name] = max(score, key=score.__getitem__)
                    row[f"{spec.name}.probs"] = [score[label] for label in spec.labels]
                else:
                    row[spec.name] = score
        finally:
            in_flight.release()
        writer.add(row)
        progress.update(1)

    def todo() -> Iterator[tuple[int, Page]]:
        for index, page in enumerate(iter_pages(args.input, limit=args.limit, bad_rows="report")):
            if index in done:
                if done[index] != page.id:
                    raise HtmllmError(
                        f"input changed since the interrupted run: document {index} was {done[index]!r}, "
                        f"now {page.id!r}; delete {parts} to start over"
                    )
                continue
            yield index, page

    async with engine:
        prepare_for_serving()  # the model is loaded: set the garbage collector for serving
        tasks: set[asyncio.Task[None]] = set()
        for index, page in todo():
            await in_flight.acquire()
            task = asyncio.create_task(one(index, page))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    writer.flush()
    progress.close()
    rows = _merge(parts, output, writer.schema)
    shutil.rmtree(parts)
    print(f"wrote {rows} documents to {output} ({failures} failed this run)", file=sys.stderr)
    return 0
