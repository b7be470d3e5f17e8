"""benchmarks/options.py: a benchmark refuses a command line or an input in one line, exit status 2, and
still shows the traceback of its own bugs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

from benchmarks import options
from service.core.errors import CheckpointError
from service.core.pages import PageSourceError


@pytest.mark.parametrize(
    "error",
    [
        PageSourceError("page source /nowhere does not exist"),
        CheckpointError("/nowhere/htmllm.json is missing"),
        options.OptionError("no pages in /empty"),
    ],
)
def test_a_refused_input_is_one_line_and_status_2(
    error: Exception, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["/x/benchmarks/prune.py", "--corpus", "/nowhere"])

    def main() -> int:
        raise error

    assert options.run(main) == options.USAGE_STATUS == 2
    err = capsys.readouterr().err
    assert err == f"prune.py: error: {error}\n"


def test_a_bug_keeps_its_traceback_and_a_status_passes_through() -> None:
    def buggy() -> int:
        raise ValueError("the benchmark's own bug")

    with pytest.raises(ValueError, match="own bug"):
        options.run(buggy)
    assert options.run(lambda: 1) == 1
    assert options.run(lambda: None) == 0


def test_list_and_number_types_refuse_as_argparse_does() -> None:
    lengths = options.comma_list(options.at_least(1))
    assert lengths("256, 512,2048") == [256, 512, 2048]
    for bad in ("abc", "256,x", "0", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            lengths(bad)
    assert options.comma_list(options.positive_float)("0.5,1") == [0.5, 1.0]
    for bad in ("0", "-1", "nan", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            options.positive_float(bad)


def test_a_cpu_outside_the_affinity_mask_is_refused() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    assert options.affinity_cpu(str(allowed[0])) == allowed[0]
    for bad in (str(max(allowed) + 1), "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            options.affinity_cpu(bad)


def test_a_page_source_is_checked_at_its_first_page(tmp_path: Path) -> None:
    with pytest.raises(PageSourceError, match="does not exist"):
        options.check_page_source(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(options.OptionError, match="no pages in"):
        options.check_page_source(tmp_path / "empty")
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "a.html").write_bytes(b"<p>x</p>")
    options.check_page_source(tmp_path / "pages")


def test_a_child_that_refused_is_refused_in_its_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/x/benchmarks/memory.py"])
    refuse = "import sys; print('memory.py: error: no pages in /empty', file=sys.stderr); sys.exit(2)"
    with pytest.raises(options.OptionError) as refused:
        options.child_output([sys.executable, "-c", refuse])
    assert str(refused.value) == "no pages in /empty"  # not "memory.py: error: memory.py: error: ..."

    crash = "raise RuntimeError('a bug in the child')"
    with pytest.raises(SystemExit) as failed:
        options.child_output([sys.executable, "-c", crash])
    assert "exit status 1" in str(failed.value) and "RuntimeError: a bug in the child" in str(failed.value)

    assert options.child_output([sys.executable, "-c", "print('{}')"]) == "{}\n"
