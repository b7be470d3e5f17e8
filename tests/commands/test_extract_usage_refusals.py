"""`htmllm extract`: options that cannot work, or would change nothing, are usage errors (exit code 2)
before any page is extracted, and leave nothing behind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from service.cli import main
from tests.factories.cli import write_pages


def _args(source: Path, output: Path | str, *options: str) -> list[str]:
    return ["extract", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress",
            *options]  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--seed", "7"], "--seed seeds --order random's per-page shuffle"),
        (["--order", "trafilatura,resiliparse", "--seed", "7"], "--seed seeds --order random's"),
        (["--extractor", "trafilatura", "--order", "random"], "--order is the union's preference order"),
        (["--extractor", "all", "--order", "justext"], "--order is the union's preference order"),
        (["--extractor", "resiliparse", "--language", "de"], "--language is jusText's: resiliparse reads"),
        (["--order", "resiliparse,trafilatura", "--language", "de"], "which --order resiliparse,trafilatura"),
        # A bad value is said as such, not as an option its run would not read.
        (["--order", "JUSTEXT,resiliparse", "--language", "de"], "unknown extractor 'JUSTEXT'"),
        (["--order", "resiliparse, justext", "--language", "de"], "unknown extractor ' justext'"),
    ],
)
def test_an_option_that_would_change_nothing_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    """`--seed 7` without `--order random` gave the default order's rows, exit code 0, and the user took
    them for seeded ones; so did an --order or --language that no extractor of the run reads."""
    write_pages(tmp_path / "in.jsonl", 2)
    output = tmp_path / "out.jsonl"
    assert main(_args(tmp_path / "in.jsonl", output, *options)) == 2
    err = capsys.readouterr().err
    assert err.startswith("htmllm extract: ") and message in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


@pytest.mark.parametrize(
    "options",
    [
        ["--order", "random", "--seed", "7"],
        ["--extractor", "justext", "--language", "en"],
        ["--extractor", "all", "--language", "en"],
        ["--order", "random", "--language", "en"],
    ],
)
def test_the_options_that_work_together_are_taken(tmp_path: Path, options: list[str]) -> None:
    write_pages(tmp_path / "in.jsonl", 1)
    assert main(_args(tmp_path / "in.jsonl", tmp_path / "out.jsonl", *options)) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA bounds mmap on Linux only")
@pytest.mark.parametrize(("output", "limit"), [("out.jsonl", "16"), ("-", "16"), ("out.jsonl", "112")])
def test_a_memory_limit_no_extractor_process_can_work_under_is_refused_before_any_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str, limit: str
) -> None:
    """Under a limit below what an extractor process needs for its libraries, every page failed: each row
    an `extraction_failed` (or, in the union, another extractor's text in silence), exit code 0, and the
    rows done for a resume. A test page of a large real page's size is tried first, in the run's own
    pool: 112 MiB, 5 over what a worker holds once started, had passed a 1 KB test page, and then most
    real pages failed."""
    write_pages(tmp_path / "in.jsonl", 3)
    target = tmp_path / output if output != "-" else "-"
    assert main(_args(tmp_path / "in.jsonl", target, "--memory-limit-mb", limit)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    last = captured.err.splitlines()[-1]  # after the pool's warnings of the workers that died
    assert last.startswith(
        f"htmllm extract: validation_error: --memory-limit-mb {limit} is less than an extractor process "
        "needs: resiliparse failed on a test page of "
    ), captured.err
    assert last.endswith(
        "raise it (128 is about the least that works; the default is 2048), or pass 0 for no limit"
    ), last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no output, no parts, no lock
