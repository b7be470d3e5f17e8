"""The option rules the commands share: one bound, one output check, what "-" is (`htmllm embed` and
`htmllm extract`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from service.commands.options import STDIO, OptionError, at_least, check_output_parent, path_or_stdio
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


def test_a_bare_dash_is_told_from_a_file_named_so() -> None:
    """`Path` spells "./-" as "-": only the text given tells standard input or output from that file."""
    assert path_or_stdio("-") is STDIO
    assert path_or_stdio("./-") == Path("-") and path_or_stdio("./-") is not STDIO
    assert path_or_stdio("out.parquet") == Path("out.parquet")


@pytest.mark.parametrize(
    ("command", "option", "message"),
    [
        ("embed", "--output", "--output -: embed writes a Parquet file"),  # it wrote one named "-"
        ("embed", "--input", "--input -: the pages cannot come from standard input"),  # "does not exist"
        ("extract", "--input", "--input -: the pages cannot come from standard input"),
    ],
)
def test_standard_input_or_output_a_command_cannot_use_is_one_line_and_a_usage_error(
    command: str,
    option: str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from service.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text('{"id": "a"}\n')
    paths = {"--input": "in.jsonl", "--output": "out.jsonl", option: "-"}
    args = [command, "--input", paths["--input"], "--output", paths["--output"], "--no-progress"]
    if command == "embed":
        args += ["--checkpoint", str(tmp_path / "not-read")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"htmllm {command}: {message}") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
