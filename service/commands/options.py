"""Option rules the commands share, so that the same option is refused, or taken, the same way in each:
integer bounds, where an output file may go and what "-" is (`htmllm embed`, `htmllm extract`). What a
checkpoint path must be is `service.core.checkpoint_path`'s (the server checks it too)."""

from __future__ import annotations

import argparse
import stat
from collections.abc import Callable
from pathlib import Path

from service.core.errors import ErrorCode, HtmllmError


class OptionError(HtmllmError):
    """A command line that cannot work: reported in one line before anything is loaded or created."""

    code = ErrorCode.VALIDATION


# What `path_or_stdio` makes of a bare "-" (standard input or output, as `htmllm extract` and `htmllm
# prune` take it): told apart by identity, since `Path("./-")`, a file named "-", is spelled "-" too.
STDIO = Path("-")
# Why neither bulk command reads its pages from standard input: `pages.iter_pages` reads a path, which a
# run looks at before it reads it (its kind, its first page, its identity) and reads again to resume.
STDIN_INPUT = (
    "--input -: the pages cannot come from standard input: a run looks at its page source before it "
    "reads it and reads it again to resume; save them to a file and name that (./- for a file named -)"
)


def path_or_stdio(text: str) -> Path:
    """An argparse type: `text` as a path, a bare "-" as `STDIO`, so that a command that reads or writes
    files only can refuse it saying so (`htmllm embed --output -` wrote a Parquet file named "-"), where
    "./-" still names a file."""
    return STDIO if text == "-" else Path(text)


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum` (a usage error, exit 2, otherwise). `--limit 0`
    is refused by `at_least(1)`: a run of no pages writes nothing worth a file, and some tools read 0 as
    "no limit"; either reading would surprise someone."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value

    return parse


# Names of compressed files: an --output so named that the bulk commands would write plain (JSONL, Parquet)
# is refused; `zcat` and `gzip.open` failed on it, and a `.jsonl.gz` input is read as gzip.
COMPRESSED_SUFFIXES = (".gz", ".gzip", ".zst", ".zstd", ".lz4", ".bz2", ".xz", ".lzma", ".br", ".zip")


def compressed_output_problem(output: str, command: str, writes: str) -> str | None:
    """Why `output` must not be the name of what `command` writes (`writes`: "plain JSONL"), or None: a
    name of a compressed file (`COMPRESSED_SUFFIXES`)."""
    if output == "-" or not output.lower().endswith(COMPRESSED_SUFFIXES):
        return None
    suffix = output[output.rindex(".") :]
    return (
        f"--output {output} names a compressed file, but htmllm {command} writes {writes}: name it "
        f"without {suffix} and compress the finished file if need be"
    )


def check_output_parent(output: Path) -> None:
    """Refuse an output under a file (`--output results.parquet/out.parquet`) before anything is read
    or loaded: found when the run's directory is made, it was a bare "[Errno 20] Not a directory" line
    with no code. A missing directory is fine: the commands make it (`resume_state.run_lock`), as
    `mkdir -p` would."""
    for parent in output.parents:
        try:
            mode = parent.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue  # missing (made with the parts directory), or under the file found further up
        except OSError:
            return  # EACCES, ELOOP: said, with the path, where the lock is taken
        if not stat.S_ISDIR(mode):
            raise OptionError(f"--output {output} is under {parent}, which is not a directory")
        return
