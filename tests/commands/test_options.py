"""The option rules the commands share: one bound, one output check (`htmllm embed` and `htmllm extract`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from service.commands.options import OptionError, at_least, check_output_parent
from service.core.errors import ErrorCode


def test_at_least_takes_the_bound_and_refuses_below_it_or_a_non_integer() -> None:
    assert at_least(1)("1") == 1 and at_least(0)("0") == 0
    for text, message in (("0", "must be at least 1, not 0"), ("-3", "not -3"), ("2.5", "invalid integer")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            at_least(1)(text)


def test_an_output_under_a_file_is_refused_and_a_missing_directory_is_not(tmp_path: Path) -> None:
    (tmp_path / "pages.jsonl").write_text("{}\n")
    check_output_parent(tmp_path / "out.jsonl")
    check_output_parent(tmp_path / "missing" / "deeper" / "out.jsonl")  # made by the run
    with pytest.raises(OptionError, match="which is not a directory") as refused:
        check_output_parent(tmp_path / "pages.jsonl" / "deeper" / "out.jsonl")
    assert refused.value.code is ErrorCode.VALIDATION
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("command", ["embed", "extract"])
def test_both_commands_refuse_limit_zero_as_a_usage_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    (tmp_path / "in.jsonl").write_text('{"id": "a"}\n')
    args = [command, "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out"), "--limit", "0"]
    if command == "embed":
        args += ["--checkpoint", str(tmp_path / "not-read")]
    with pytest.raises(SystemExit) as usage:
        main(args)
    assert usage.value.code == 2 and "--limit: must be at least 1, not 0" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
