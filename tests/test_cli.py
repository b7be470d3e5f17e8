"""The console script's dispatch."""

from __future__ import annotations

import pytest

from service.cli import build_parser, main


def test_help_lists_prune(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "prune" in capsys.readouterr().out


def test_no_command_is_an_error() -> None:
    assert main([]) == 2


def test_parser_builds_every_command() -> None:
    parser = build_parser()
    assert parser.prog == "htmllm"
