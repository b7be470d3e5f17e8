"""The keys the model routes accept: `HTMLLM_API_KEY` and the lines of `HTMLLM_API_KEY_FILE`.

The file is how keys rotate without downtime: mount a Kubernetes Secret there, add the new key beside the
old one, move the clients over, remove the old key. A request looks at the file (at most once a second,
whatever the request rate) and re-reads it when it changed, with no restart and no moment when neither
key works. The two are additive: `HTMLLM_API_KEY`, when set, is accepted whatever the file holds.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from pathlib import Path

from pydantic import SecretStr

from service.core.errors import ErrorCode, HtmllmError

logger = logging.getLogger(__name__)

# How often the key file is looked at (a stat): at most once a second, whatever the request rate.
RECHECK_INTERVAL_S = 1.0
# (device, inode, size, mtime): a Secret volume swaps a symlink, an editor rewrites in place.
_FileState = tuple[int, int, int, int]


class ApiKeys:
    """The keys the model routes accept: the fixed one and those in the key file, as the file is now.

    A key file that becomes unreadable or disappears keeps the keys last read (a Secret being re-mounted
    must not lock every client out, nor open the door); one that is readable but holds no key accepts no
    key of its own (the operator removed them all): only the fixed key, if there is one, still opens the
    model routes. Each change is logged, never a key.
    """

    def __init__(self, key: SecretStr | None = None, key_file: Path | None = None) -> None:
        if key is not None and not key.get_secret_value().strip():
            raise HtmllmError(
                "HTMLLM_API_KEY is empty (unset it to turn auth off)", code=ErrorCode.VALIDATION
            )
        self._fixed = () if key is None else (key.get_secret_value().encode(),)
        self._file = key_file
        self._lock = threading.Lock()
        self._file_keys: tuple[bytes, ...] = ()
        self._file_state: _FileState | None = None
        self._checked = 0.0
        if key_file is not None:
            state, keys = _read_key_file(key_file)  # at start an unusable file is an error, not a warning
            if not keys:
                raise HtmllmError(f"HTMLLM_API_KEY_FILE {key_file} holds no key", code=ErrorCode.VALIDATION)
            self._file_state, self._file_keys = state, keys
            self._checked = time.monotonic()

    @property
    def enabled(self) -> bool:
        """Whether the model routes need a key."""
        return bool(self._fixed) or self._file is not None

    def accepts(self, presented: str) -> bool:
        """Whether `presented` is one of the keys, compared in constant time against every one."""
        candidate = presented.encode()
        keys = self._fixed + self._current_file_keys()
        return any([hmac.compare_digest(candidate, key) for key in keys])  # a list: no early exit

    def _current_file_keys(self) -> tuple[bytes, ...]:
        """The key file's keys, re-read when its identity, size or modification time changed."""
        if self._file is None:
            return ()
        now = time.monotonic()
        if now - self._checked < RECHECK_INTERVAL_S:
            return self._file_keys
        with self._lock:
            if now - self._checked < RECHECK_INTERVAL_S:
                return self._file_keys
            self._checked = now
            try:
                state = _file_state(self._file)
                if state != self._file_state:
                    state, keys = _read_key_file(self._file)
                    logger.info("API key file %s changed: %d key(s)", self._file, len(keys))
                    if not keys:
                        logger.warning("API key file %s holds no key: %s", self._file, self._left_open())
                    self._file_state, self._file_keys = state, keys
            except HtmllmError as exc:
                logger.warning("%s; keeping the %d key(s) read before", exc, len(self._file_keys))
            return self._file_keys

    def _left_open(self) -> str:
        """What a model request needs while the key file holds no key."""
        if self._fixed:
            return "only HTMLLM_API_KEY is accepted"
        return "every model request gets 401"


def _file_state(path: Path) -> _FileState:
    """What tells a changed file (`_FileState`), following symlinks."""
    try:
        info = os.stat(path)
    except OSError as exc:
        message = f"HTMLLM_API_KEY_FILE {path} cannot be read: {exc.strerror}"
        raise HtmllmError(message, code=ErrorCode.VALIDATION) from exc
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def _read_key_file(path: Path) -> tuple[_FileState, tuple[bytes, ...]]:
    """(state, keys) of the key file: one key per line; blank lines and lines starting with # skipped."""
    state = _file_state(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        message = f"HTMLLM_API_KEY_FILE {path} cannot be read: {exc}"
        raise HtmllmError(message, code=ErrorCode.VALIDATION) from exc
    lines = (line.strip() for line in text.splitlines())
    keys = tuple(dict.fromkeys(line.encode() for line in lines if line and not line.startswith("#")))
    return state, keys
