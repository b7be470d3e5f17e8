"""The `htmllm` console script.

Service subcommands live in `service.commands` and are listed here; training subcommands are
contributed through the `htmllm.commands` entry-point group (by `model_training.cli`), so the
service never imports the training stack and the service image works without it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from service import __version__
from service.commands.exits import ignore_late_stops

# Each module exposes `register(subparsers)`, which adds its parser and sets `func`.
SERVICE_COMMANDS: tuple[str, ...] = (
    "service.commands.prune",
    "service.commands.extract",
    "service.commands.serve",
    "service.commands.embed",
    "service.commands.export_onnx",
)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Ends an option's help with "(default: N)" where it has a default worth saying: not for flags
    (`store_true`), options without one (None), or help that speaks of its default already. Unlike
    argparse's ArgumentDefaultsHelpFormatter, it never prints "(default: None)" or "(default: False)":
    `htmllm serve`'s flags default to None so that only the flags given override `HTMLLM_*`, and say
    the settings' defaults in their help."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help
        if help_text is None or not action.option_strings or action.nargs == 0:
            return help_text
        default = action.default
        empty = isinstance(default, list | tuple) and not default
        if default is None or default is argparse.SUPPRESS or empty or "default" in help_text:
            return help_text
        if isinstance(default, list | tuple):  # as the option is written (a,b), not Python's ('a', 'b')
            listed = ",".join(str(item) for item in default).replace("%", "%%")
            return f"{help_text} (default: {listed})"
        return f"{help_text} (default: %(default)s)"


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Give `parser` and every subcommand's parser below it (`htmllm tokenizer train` too) the defaults
    formatter: subparsers get argparse's plain one whatever their parent's, and the training commands
    add theirs through entry points, so it is set here, once, for all."""
    parser.formatter_class = DefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in set(action.choices.values()):
                _show_defaults(subparser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="htmllm", description="Embed raw HTML pages; train and evaluate the models behind them."
    )
    parser.add_argument("--version", action="version", version=f"htmllm {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SERVICE_COMMANDS:
        importlib.import_module(name).register(subparsers)
    for ep in entry_points(group="htmllm.commands"):
        try:
            register = ep.load()
        except ModuleNotFoundError as exc:
            # The service image installs the distribution's metadata but ships only `service/`: a
            # plug-in whose top-level package is absent is skipped; any other import error is a bug.
            if exc.name != ep.module.split(".")[0]:
                raise
            continue
        register(subparsers)
    _show_defaults(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    result = func(args)
    ignore_late_stops()  # a Ctrl-C as the interpreter exits no longer turns the command's status into 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
