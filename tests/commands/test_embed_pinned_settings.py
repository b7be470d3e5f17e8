"""`htmllm embed`: settings a resume (or a finished output) must share with the run that goes on from it,
the one that may grow and the one only recorded: the preprocessing pool is pinned, a larger --limit goes
on from a smaller, --device is recorded and a change of it said."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from service.cli import main
from service.engine import Document, DocumentResult, Engine
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.factories.cli import stop_before_merge, write_pages


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("embed") / "tiny")


def _args(checkpoint: Path, source: Path, output: Path, *options: str) -> list[str]:
    return ["embed", "--checkpoint", str(checkpoint), "--input", str(source), "--output", str(output),
            "--no-progress", "--workers", "1", "--part-size", "1", *options]  # fmt: skip


def _not_loaded(*_: object, **__: object) -> object:
    raise AssertionError("the model was loaded for a run that is refused")


def _settings(output: Path) -> dict[str, Any]:
    settings: dict[str, Any] = json.loads(pq.read_schema(output).metadata[b"htmllm.run"])
    return settings


def test_a_resume_or_finished_output_of_the_other_preprocessing_pool_is_refused(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Processes make a page past 20 s or 1024 MiB an error row, threads embed it: a resume with the
    other pool had mixed both answers in one output, and a finished output passed for complete."""
    write_pages(tmp_path / "pages.jsonl", 2)
    out = tmp_path / "out.parquet"
    thread = _args(checkpoint, tmp_path / "pages.jsonl", out, "--preprocess-pool", "thread")
    process = _args(checkpoint, tmp_path / "pages.jsonl", out, "--preprocess-pool", "process")
    stop_before_merge(monkeypatch, thread)
    capsys.readouterr()
    with monkeypatch.context() as patch:
        patch.setattr(Engine, "from_checkpoint", _not_loaded)
        assert main(process) == 1
    assert "holds a run with other settings (preprocess_pool thread -> process); delete it" in (
        capsys.readouterr().err
    )
    assert main(thread) == 0
    assert _settings(out)["preprocess_pool"] == "thread"
    capsys.readouterr()
    with monkeypatch.context() as patch:
        patch.setattr(Engine, "from_checkpoint", _not_loaded)
        assert main(process) == 1
        assert "written with other settings (preprocess_pool thread -> process); pass --overwrite" in (
            capsys.readouterr().err
        )
        # An older htmllm's output, which did not record the pool: another version's, as for the
        # pruner's version (whichever pool made its rows).
        table = pq.read_table(out)
        metadata = dict(table.schema.metadata)
        settings = json.loads(metadata[b"htmllm.run"])
        del settings["preprocess_pool"]
        metadata[b"htmllm.run"] = json.dumps(settings, sort_keys=True).encode()
        pq.write_table(table.replace_schema_metadata(metadata), out)
        assert main(thread) == 1
        assert "(preprocess_pool unset -> thread; written by an older htmllm); pass --overwrite" in (
            capsys.readouterr().err
        )


def _counting_embed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the pages embedded from now on."""
    embed, ids = Engine.embed, []

    async def counted(self: Engine, docs: list[Document], **kw: Any) -> list[DocumentResult]:
        ids.extend(str(doc.id) for doc in docs)
        return await embed(self, docs, **kw)

    monkeypatch.setattr(Engine, "embed", counted)
    return ids


def test_a_larger_limit_or_none_goes_on_from_a_finished_output_of_a_smaller_one(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "Try 1000 pages, then all": the second run was refused ("limit 1000 -> none") and --overwrite
    embedded the first 1000 again. Their rows are kept, the rest embedded; a smaller limit is refused."""
    n = 8
    write_pages(tmp_path / "pages.jsonl", n)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out, "--preprocess-pool", "thread")
    assert main([*args, "--limit", "3"]) == 0
    first = pq.read_table(out)
    capsys.readouterr()
    embedded = _counting_embed(monkeypatch)
    assert main([*args, "--limit", "6"]) == 0
    assert embedded == ["p3", "p4", "p5"]
    assert capsys.readouterr().err == (
        f"htmllm embed: {out} holds the first 3 documents (a smaller --limit): they are kept\n"
        f"wrote 6 documents to {out}: 3 resumed from earlier runs, 3 embedded this run (0 failed)\n"
    )
    table = pq.read_table(out)
    assert table["id"].to_pylist() == [f"p{i}" for i in range(6)]
    assert table.slice(0, 3).equals(first.replace_schema_metadata(table.schema.metadata))
    assert _settings(out)["limit"] == 6

    assert main(args) == 0  # no limit: the rest of the input
    assert embedded == ["p3", "p4", "p5", "p6", "p7"]
    assert capsys.readouterr().err.endswith("6 resumed from earlier runs, 2 embedded this run (0 failed)\n")
    assert pq.read_table(out)["index"].to_pylist() == list(range(n)) and _settings(out)["limit"] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "pages.jsonl"]

    assert main([*args, "--limit", "4"]) == 1  # its rows past 4 would stay: refused, as it was
    assert "was written with other settings (limit none -> 4); pass --overwrite" in capsys.readouterr().err
    assert main([*args, "--limit", "4", "--overwrite"]) == 0
    assert embedded[5:] == ["p0", "p1", "p2", "p3"]  # --overwrite starts over
    assert main([*args, "--limit", "6", "--overwrite"]) == 0
    assert embedded[9:] == [f"p{i}" for i in range(6)]  # from a smaller limit too
    assert "0 resumed from earlier runs, 6 embedded this run" in capsys.readouterr().err


def test_an_interrupted_run_of_a_smaller_limit_goes_on_under_a_larger_one(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_pages(tmp_path / "pages.jsonl", 8)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out, "--preprocess-pool", "thread")
    stop_before_merge(monkeypatch, [*args, "--limit", "3"])
    capsys.readouterr()
    embedded = _counting_embed(monkeypatch)
    stop_before_merge(monkeypatch, [*args, "--limit", "5"])
    assert embedded == ["p3", "p4"]
    assert main([*args, "--limit", "4"]) == 1
    assert "holds a run with other settings (limit 5 -> 4); delete it, or pass --overwrite" in (
        capsys.readouterr().err
    )
    assert main(args) == 0
    assert embedded == ["p3", "p4", "p5", "p6", "p7"]
    assert capsys.readouterr().err.endswith("5 resumed from earlier runs, 3 embedded this run (0 failed)\n")
    assert pq.read_table(out)["id"].to_pylist() == [f"p{i}" for i in range(8)]


def test_a_run_that_kept_a_smaller_output_and_was_stopped_keeps_it_once(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped before its merge, the run holds the finished output as a part (a hard link): its resume
    must not take the output again, which would hold each of its documents twice."""
    write_pages(tmp_path / "pages.jsonl", 6)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out, "--preprocess-pool", "thread")
    assert main([*args, "--limit", "3"]) == 0
    capsys.readouterr()
    embedded = _counting_embed(monkeypatch)
    stop_before_merge(monkeypatch, args)
    assert embedded == ["p3", "p4", "p5"]
    assert pq.read_table(out).num_rows == 3  # the output is as it was until the merge
    capsys.readouterr()
    assert main(args) == 0
    assert embedded == ["p3", "p4", "p5"]
    assert capsys.readouterr().err == (
        f"wrote 6 documents to {out}: 6 resumed from earlier runs, 0 embedded this run (0 failed)\n"
    )
    assert pq.read_table(out)["id"].to_pylist() == [f"p{i}" for i in range(6)]


def test_overwrite_starts_an_interrupted_smaller_limit_over_as_it_does_a_finished_one(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --overwrite an interrupted --limit 3 run had been kept under --limit 5 (its rows resumed),
    where a finished one was started over."""
    write_pages(tmp_path / "pages.jsonl", 8)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out, "--preprocess-pool", "thread")
    stop_before_merge(monkeypatch, [*args, "--limit", "3"])
    capsys.readouterr()
    embedded = _counting_embed(monkeypatch)
    assert main([*args, "--limit", "5", "--overwrite"]) == 0
    assert embedded == [f"p{i}" for i in range(5)]
    err = capsys.readouterr().err
    discarded = "discarded the 3 part(s) of an interrupted run with other settings (limit 3 -> 5)"
    assert discarded in err, err
    assert "0 resumed from earlier runs, 5 embedded this run" in err


def test_a_larger_limit_over_a_changed_input_is_refused_for_the_input(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal was right and its reason wrong: "other settings (limit 3 -> 5)", a continuation the
    docs allow, where the input had grown since."""
    source = tmp_path / "pages.jsonl"
    write_pages(source, 8)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, source, out, "--preprocess-pool", "thread")
    assert main([*args, "--limit", "3"]) == 0
    stop_before_merge(monkeypatch, [*_args(checkpoint, source, tmp_path / "run.parquet"), "--limit", "3"])
    with source.open("a", encoding="utf-8") as pages:
        pages.write(json.dumps({"id": "late", "html": "<p>one more page</p>"}) + "\n")
    capsys.readouterr()
    monkeypatch.setattr(Engine, "from_checkpoint", _not_loaded)
    assert main([*args, "--limit", "5"]) == 1
    err = capsys.readouterr().err
    assert "was written before its input changed (" in err and "goes on only over the same input" in err
    assert "limit 3 -> 5" not in err
    assert main([*_args(checkpoint, source, tmp_path / "run.parquet"), "--limit", "5"]) == 1
    err = capsys.readouterr().err
    assert "input changed since the interrupted run (" in err and "limit 3 -> 5" not in err


def test_a_larger_limit_over_an_input_rewritten_with_its_size_and_mtime_is_refused_for_the_output(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Such an input passes `input_identity`; the id check then found the finished output's rows (kept as
    a part) changed and said to delete the parts: the next run kept the output again, to be refused
    again, for ever, and --overwrite resumed those very parts. The output is refused, as for an input
    changed in another way, nothing is left behind, and --overwrite starts over."""
    source = tmp_path / "pages.jsonl"
    write_pages(source, 6)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, source, out, "--preprocess-pool", "thread")
    assert main([*args, "--limit", "2"]) == 0
    before = source.stat()
    rewritten = source.read_text(encoding="utf-8").replace('"id": "p1"', '"id": "q1"')
    source.write_text(rewritten, encoding="utf-8")
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert source.stat().st_size == before.st_size
    capsys.readouterr()
    for _ in range(2):  # the same answer each time: the run changes nothing the next one reads
        assert main([*args, "--limit", "4"]) == 1
        err = capsys.readouterr().err
        assert f"{out} was written before its input changed (document 1 was 'p1', now 'q1';" in err, err
        assert err.endswith(
            "a larger --limit goes on only over the same input; pass --overwrite to replace it\n"
        )
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "pages.jsonl"]
        assert pq.read_table(out)["id"].to_pylist() == ["p0", "p1"]
    embedded = _counting_embed(monkeypatch)
    assert main([*args, "--limit", "4", "--overwrite"]) == 0
    assert sorted(embedded) == ["p0", "p2", "p3", "q1"]
    assert pq.read_table(out)["id"].to_pylist() == ["p0", "q1", "p2", "p3"]


def _devices(path: Path) -> list[str]:
    devices: list[str] = json.loads(pq.read_schema(path).metadata[b"htmllm.devices"])
    return devices


def _as_if_embedded_on(part: Path, devices: list[str] | None) -> None:
    """Give `part` the devices record of rows embedded on `devices` (None: of a version before the
    record), as a run on a GPU writes it: this machine may have none."""
    table = pq.read_table(part)
    metadata = {k: v for k, v in table.schema.metadata.items() if k != b"htmllm.devices"}
    if devices is not None:
        metadata[b"htmllm.devices"] = json.dumps(devices).encode()
    pq.write_table(table.replace_schema_metadata(metadata), part)


def test_the_device_is_recorded_and_a_run_going_on_from_another_says_so(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--device is not pinned: the same weights in the same (pinned) dtype differ only by rounding, as
    with other batch mates, and a run begun on a CPU may be finished on a GPU. But a resume on another
    device mixed both in one output without a word or a record: it is said, and every part and the
    output record the devices their rows were embedded on (`htmllm.devices`)."""
    write_pages(tmp_path / "pages.jsonl", 8)
    out = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out, "--preprocess-pool", "thread")
    stop_before_merge(monkeypatch, [*args, "--limit", "3"])
    first, second, _ = sorted(parts.glob("part-*.parquet"))
    assert _devices(first) == ["cpu"]
    _as_if_embedded_on(first, ["cuda"])
    _as_if_embedded_on(second, None)  # an older version's part: nothing to say of it
    capsys.readouterr()
    assert main([*args, "--limit", "5"]) == 0
    said = (
        "htmllm embed: the rows kept from earlier runs were embedded with --device cuda, this run's with "
        "--device cpu: the same weights in the same dtype, they differ only by rounding (as with other "
        "batch mates); the output records each device\n"
    )
    assert capsys.readouterr().err.startswith(said)
    assert _devices(out) == ["cpu", "cuda", "unrecorded"]
    assert main([*args, "--limit", "6"]) == 0  # from a finished output of a smaller --limit too
    err = capsys.readouterr().err
    assert said in err and "holds the first 5 documents" in err
    assert _devices(out) == ["cpu", "cuda", "unrecorded"]
    assert main([*args, "--limit", "4", "--overwrite"]) == 0  # one device: nothing to say
    assert "--device" not in capsys.readouterr().err
    assert _devices(out) == ["cpu"]
    assert main(args) == 0
    assert "--device" not in capsys.readouterr().err
    assert _devices(out) == ["cpu"] and pq.read_table(out).num_rows == 8
