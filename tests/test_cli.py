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


class _EntryPoint:
    def __init__(self, module: str, error: ModuleNotFoundError) -> None:
        self.module, self._error = module, error

    def load(self) -> object:
        raise self._error


def test_a_plugin_whose_package_is_absent_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The service image ships the metadata of `model_training` commands but not the package."""
    import service.cli as cli

    missing = _EntryPoint("model_training.cli", ModuleNotFoundError("no", name="model_training"))
    monkeypatch.setattr(cli, "entry_points", lambda group: [missing])
    assert "prune" in cli.build_parser().format_help()

    broken = _EntryPoint("model_training.cli", ModuleNotFoundError("no", name="tokenizers"))
    monkeypatch.setattr(cli, "entry_points", lambda group: [broken])
    with pytest.raises(ModuleNotFoundError):
        cli.build_parser()
