"""What a checkpoint path must be, checked without loading anything: `htmllm embed --checkpoint` and
`htmllm serve --model-path` (`HTMLLM_MODEL_PATH`) refuse a path that names no checkpoint directory in one
line before torch is imported (`service.core.checkpoint` imports it: seconds), and suggest the
checkpoint beside it where there is one."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import NoReturn

from service.core.errors import CheckpointError
from service.core.heads_stage import META_FILE

# Where `htmllm train --out DIR` exports a run's final model: the run's folder, named where a checkpoint
# is wanted, is the commonest wrong path.
RUN_MODEL_DIR = "model"


class CheckpointPathError(CheckpointError):
    """A path that names no checkpoint directory; `suggestion` is a directory beside it that is one."""

    def __init__(self, message: str, *, suggestion: Path | None = None) -> None:
        super().__init__(message)
        self.suggestion = suggestion


def check_checkpoint_path(path: Path, option: str) -> None:
    """Refuse a checkpoint path that is no checkpoint directory (missing, a file, a directory without
    htmllm.json) in one line, before torch is imported: `htmllm embed` and `htmllm serve` took 4-5 s
    of imports to say so, and named a missing `/nonexistent/htmllm.json` rather than a missing
    directory. Where the directory holds the checkpoint one level down (a training run's `model/`), or
    the path is a file inside one (`.../model.safetensors`), that checkpoint is suggested as `option`.
    Only the file's presence is checked: reading and validating it is `read_meta`'s."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointPathError(f"checkpoint directory {path} does not exist") from None
    except OSError as exc:  # EACCES on a directory above it, ELOOP
        raise CheckpointPathError(f"checkpoint {path} cannot be looked at: {exc.strerror}") from exc
    if not stat.S_ISDIR(mode):
        why = f"checkpoint {path} is not a directory (a checkpoint is the directory holding {META_FILE})"
        _refuse(why, path.parent, option)
    try:
        holds_meta = _holds_meta(path)
    except OSError as exc:  # a directory this user may not look into
        raise CheckpointPathError(
            f"checkpoint {path / META_FILE} cannot be looked at: {exc.strerror}"
        ) from exc
    if not holds_meta:
        _refuse(f"{path} is not an htmllm checkpoint (it holds no {META_FILE})", path / RUN_MODEL_DIR, option)


def _holds_meta(directory: Path) -> bool:
    """Whether `directory` holds an htmllm.json file; raises OSError when that cannot be told."""
    try:
        return stat.S_ISREG((directory / META_FILE).stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _refuse(why: str, candidate: Path, option: str) -> NoReturn:
    """Raise CheckpointPathError for `why`, suggesting `candidate` where it holds a checkpoint."""
    try:
        suggest = _holds_meta(candidate)
    except OSError:
        suggest = False  # only a suggestion: `why` stands without it
    if suggest:
        raise CheckpointPathError(f"{why}; did you mean {option} {candidate}?", suggestion=candidate)
    raise CheckpointPathError(why)
