"""The keys the model routes accept: `HTMLLM_API_KEY` and the lines of `HTMLLM_API_KEY_FILE`.

The file is how keys rotate without downtime: mount a Kubernetes Secret there, add the new key beside the
old one, move the clients over, remove the old key. A request looks at the file (at most once a second,
whatever the request rate) and re-reads it when it changed, with no restart and no moment when neither
key works. The two are additive: `HTMLLM_API_KEY`, when set, is accepted whatever the file holds, at
start too (a pod restarted while the file holds no key starts as its peers serve: with that key alone).

Every key is visible ASCII, with spaces or tabs inside it (`key_problem`), refused at start otherwise:
a key with a control character or a non-ASCII one is a key no client can send as `Bearer <key>` (httpx
and requests refuse to, others send bytes that never match), so every request got 401 "the API key is
not valid". Surrounding white space is no part of a key, in the variable as in the file: `echo` and
`kubectl create secret --from-file` leave a newline at the end, which had made the key itself unusable.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
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
# What a key is made of: visible ASCII (RFC 9110's VCHAR), a superset of RFC 6750's b64token, with spaces
# and tabs inside it (a header value may hold them; httpx, requests and curl send `Bearer crawl team key`
# unchanged, and the scheme is split off at the first space only, so such keys worked and must go on to).
_SENDABLE_KEY = re.compile(r"[!-~](?:[ \t!-~]*[!-~])?")


def key_problem(key: str) -> str | None:
    """Why `key` (surrounding white space stripped) can be no API key, never quoting it; None when it can."""
    if not key:
        return "is empty"
    if _SENDABLE_KEY.fullmatch(key) is None:
        return (
            "holds a character that is not visible ASCII, a space or a tab (a control character or a "
            "non-ASCII one), which no client can send as `Bearer <key>`: use letters, digits and "
            "punctuation, such as `openssl rand -hex 32` prints"
        )
    return None


class ApiKeys:
    """The keys the model routes accept: the fixed one and those in the key file, as the file is now.

    A key file that becomes unreadable or disappears keeps the keys last read (a Secret being re-mounted
    must not lock every client out, nor open the door); one that is readable but holds no key accepts no
    key of its own (the operator removed them all): only the fixed key, if there is one, still opens the
    model routes. Each change is logged, never a key.
    """

    def __init__(self, key: SecretStr | None = None, key_file: Path | None = None) -> None:
        fixed = None if key is None else key.get_secret_value().strip()
        problem = None if fixed is None else key_problem(fixed)
        if problem is not None:
            hint = " (unset it to turn auth off)" if not fixed else ""
            raise HtmllmError(f"HTMLLM_API_KEY {problem}{hint}", code=ErrorCode.VALIDATION)
        self._fixed = () if fixed is None else (fixed.encode("ascii"),)
        self._file = key_file
        self._lock = threading.Lock()
        self._file_keys: tuple[bytes, ...] = ()
        self._file_state: _FileState | None = None
        self._checked = 0.0
        if key_file is not None:
            state, keys = _read_key_file(key_file)  # at start an unusable file is an error, not a warning
            if not keys:
                # With the fixed key this is a running server's state after every file key was revoked
                # (a pod restarted mid-rotation must start as its peers serve); without it no request
                # could ever be let in, which is no server to start.
                if not self._fixed:
                    message = f"HTMLLM_API_KEY_FILE {key_file} holds no key, and HTMLLM_API_KEY is not set"
                    raise HtmllmError(message, code=ErrorCode.VALIDATION)
                logger.warning("API key file %s holds no key: %s", key_file, self._left_open())
            self._file_state, self._file_keys = state, keys
            self._checked = time.monotonic()

    @property
    def enabled(self) -> bool:
        """Whether the model routes need a key."""
        return bool(self._fixed) or self._file is not None

    def accepts(self, presented: str) -> bool:
        """Whether `presented` is one of the keys, compared in constant time against every one.

        `presented` is a header value as ASGI servers decode it, latin-1: encoded back so, it is the
        bytes the client sent, which are compared with the keys' (ASCII) bytes."""
        try:
            candidate = presented.encode("latin-1")
        except UnicodeEncodeError:  # no header decodes to it, and no key (visible ASCII) is it
            return False
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
    """(state, keys) of the key file: one key per line; blank lines and lines starting with # skipped.
    A line that is no key (`key_problem`) makes the file unusable, named by its number, never quoted:
    refused at start, and after a change the keys read before are kept (`_current_file_keys`)."""
    state = _file_state(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        message = f"HTMLLM_API_KEY_FILE {path} cannot be read: {exc}"
        raise HtmllmError(message, code=ErrorCode.VALIDATION) from exc
    keys: dict[bytes, None] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        problem = key_problem(key)
        if problem is not None:
            message = f"HTMLLM_API_KEY_FILE {path} line {number}: the key {problem}"
            raise HtmllmError(message, code=ErrorCode.VALIDATION)
        keys.setdefault(key.encode("ascii"))
    return state, tuple(keys)
