"""Files written whole or not at all: a hidden temporary beside the target, renamed onto it.

Checkpoints, ONNX graphs, `htmllm embed`'s parts and merged output and `htmllm extract`'s output are
all read by something that must never see half a file (a server loading a model, a resume, the next job
in a pipeline), while their writer may be killed at any moment. `os.replace` within one directory is
atomic; `tempfile.mkstemp` creates the temporary 0600, so it gets its final mode before the rename.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def current_umask() -> int:
    """The process's umask, read without setting it where Linux allows: `os.umask` is process-wide, and
    threads (an engine's, a pool's) may be creating files while it is briefly changed."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def replaced_atomically(
    path: Path, *, mode: int | None = None, suffix: str = "", durable: bool = False
) -> Iterator[Path]:
    """A temporary `.<name>.<8 random characters><suffix>` beside `path` to write; renamed onto `path`
    when the block ends without an exception, removed otherwise, so `path` is complete or as it was.

    `mode`: the file's permissions (default: what creating it the ordinary way gives, 0o666 less the
    umask). `durable`: fsync before the rename, for files a resume trusts after a power loss.
    """
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~current_umask() if mode is None else mode)
        if durable:
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
