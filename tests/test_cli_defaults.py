"""Every command's `--help` gives each option's default (`service.cli.DefaultsHelpFormatter`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest
from pydantic_core import PydanticUndefined

from service.api import main as api_main
from service.api.settings import Settings
from service.cli import DefaultsHelpFormatter, build_parser


def _parsers(
    parser: argparse.ArgumentParser, name: str = "htmllm"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """`parser` and every subcommand's parser below it, by command line."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def _help(parser: argparse.ArgumentParser, option: str) -> str:
    """The help text `parser --help` prints for `option`, unwrapped."""
    (action,) = [action for action in parser._actions if option in action.option_strings]
    return parser._get_formatter()._expand_help(action)


def _command(name: str) -> argparse.ArgumentParser:
    return dict(_parsers(build_parser()))[name]


def test_embed_help_gives_the_defaults() -> None:
    """`htmllm embed --help` said nothing of --part-size's 512, --batch-size's 64 and the others."""
    embed = _command("htmllm embed")
    for option, default in (
        ("--part-size", "512"),
        ("--batch-size", "64"),
        ("--batch-tokens", "16384"),
        ("--workers", "2"),
        ("--backend", "torch"),
        ("--dtype", "float32"),
        ("--attention", "auto"),
    ):
        assert _help(embed, option).endswith(f"(default: {default})"), option
    assert "kill -9" in _help(embed, "--part-size")  # and what the part size costs a killed run
    assert "the checkpoint's max_length" in _help(embed, "--max-length")


def test_every_option_with_a_default_says_it_and_none_says_none() -> None:
    """Every command, the training ones (entry points) and nested ones (`htmllm tokenizer train`) too: an
    option that has a default names it, where its help did not already; a flag or an option without
    one gets no "(default: False)" or "(default: None)"."""
    seen = 0
    for name, parser in _parsers(build_parser()):
        text = parser.format_help()
        assert "(default: None)" not in text and "(default: False)" not in text, name
        for action in parser._actions:
            default = action.default
            if not action.option_strings or action.nargs == 0 or action.help in (None, argparse.SUPPRESS):
                continue
            if default is None or default is argparse.SUPPRESS or default in ([], ()):
                continue
            seen += 1
            assert "default" in _help(parser, action.option_strings[0]), f"{name} {action.option_strings[0]}"
    assert seen > 20  # the walk reached the commands


def _settings_default(field: str) -> object:
    default = Settings.model_fields[field].default
    return None if default is PydanticUndefined else default


@pytest.mark.parametrize("field", api_main._FLAG_FIELDS)
def test_each_serve_flag_names_its_setting_and_its_default(field: str) -> None:
    """`htmllm serve`'s flags default to None, so that only those given override HTMLLM_*; their help
    gives the setting's default, which must be the Settings class's."""
    serve = _command("htmllm serve")
    text = _help(serve, "--" + field.replace("_", "-"))
    assert f"HTMLLM_{field.upper()}" in text and "default" in text
    default = _settings_default(field)
    if default is not None:
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        assert f"default {shown}" in text, (text, default)


def test_a_list_default_is_written_as_the_option_takes_it() -> None:
    """A tuple or list default had printed as Python writes it ("(default: ('html',))"): it reads as the
    option is given, comma-separated, for any command whose option has one."""
    parser = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--views", default=("html", "text"), help="views")
    parser.add_argument("--percent", default=["50%"], help="cut")
    assert _help(parser, "--views") == "views (default: html,text)"
    assert _help(parser, "--percent") == "cut (default: 50%)"
    for name, command in _parsers(build_parser()):
        assert "(default: (" not in command.format_help() and "(default: [" not in command.format_help(), name
