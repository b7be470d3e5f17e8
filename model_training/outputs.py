"""Output directories a training command makes for one run, removed again when the run fails.

`htmllm data prepare`, `teacher embed`, `tokenizer train`, `eval run` and `tasks derive` make their
`--out` (with its parents) before the long work, so that a path that cannot be written is refused at once
rather than after an hour. A run that then failed (a bad input, Ctrl-C, SIGTERM, a full disk) had left
the empty directory it made, or one of part of its files, which looks like a finished run's output to
whoever lists it later. `output_dir` takes such a directory away again, and only such a one: never a
directory that existed before the run, nor anything in it the run did not write, nor a complete output.

`tokenizer eval` writes single files (`--json`, `--markdown`): it takes away only the parent
directories it made for them (`directories_to_make`, `service.core.made_directories.remove_empty`) when it
fails.

Not for `htmllm train` nor `heads train`: what they write (checkpoints, heads) is what a rerun resumes
from, or the checkpoint itself.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

from model_training.data import DataError, writable_dir
from service.core import made_directories
from service.core.made_directories import missing_before_parent_step, remove_empty


def file_names(*names: str) -> re.Pattern[str]:
    """A `written` pattern for a run whose files are known by name (none: a run that keeps all it wrote)."""
    return re.compile("|".join(re.escape(name) for name in names))


@contextlib.contextmanager
def output_dir(
    out: str | Path,
    *,
    written: re.Pattern[str],
    complete: str | None = None,
    subdirs: Collection[str] = (),
) -> Iterator[Path]:
    """`writable_dir(out)` for one run, removed again when the run fails having made it.

    `written` matches the names (relative to `out`, with `/`) of the files the run writes there; `complete`
    names the file whose presence says the run's output was complete when the failure came (a Ctrl-C on
    the way out): it is kept whole. `subdirs` are the directories the run makes inside `out`, removed only
    where the run's files taken out leave them empty (what else is in one, a cache, keeps it).

    Removed on a failure (any exception, KeyboardInterrupt and so SIGTERM included): the run's files in
    `out`, then `out` and each parent the run made, deepest first, while they are empty. Kept: a
    directory that existed before the run (a user's files, an earlier run's output), one holding anything
    else (put there meanwhile, or a cache the run keeps there for the next one), and one holding `complete`.
    """
    path = Path(out)
    made = directories_to_make(path)
    try:
        yield writable_dir(path)
    except BaseException:
        if made and not (complete is not None and (path / complete).exists()):
            _remove_made(made, written, subdirs)
        raise


def directories_to_make(path: Path, *, flag: str = "--out") -> list[Path]:
    """The directories that making `path` (with its parents) would create, deepest first
    (`service.core.made_directories`); DataError for a `path` in which `..` follows a directory that does
    not exist (`new/../kept`). `flag` names the option in that error."""
    missing = missing_before_parent_step(path)
    if missing is not None:
        raise DataError(
            f"{flag} {path}: '..' after {missing}, which does not exist; give the path without it"
        )
    return made_directories.directories_to_make(path)


def _remove_made(made: Sequence[Path], written: re.Pattern[str], subdirs: Collection[str]) -> None:
    """Remove the run's files (and `subdirs` left empty) from `made[0]`, then the directories of `made`
    that are left empty."""
    with contextlib.suppress(OSError):  # best effort: the run's own failure is what is reported
        _remove_files(made[0], written)
        for name in subdirs:
            sub = made[0] / name
            if sub.is_dir() and not sub.is_symlink():
                _remove_files(sub, written, prefix=f"{name}/")
                with contextlib.suppress(OSError):  # not empty: kept
                    sub.rmdir()
    remove_empty(made)


def _remove_files(directory: Path, written: re.Pattern[str], *, prefix: str = "") -> None:
    for entry in directory.iterdir():
        if written.fullmatch(prefix + entry.name) and not entry.is_dir():
            entry.unlink()
