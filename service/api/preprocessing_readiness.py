"""What /ready and /health read of the Engine's preprocessing pools (`PreprocessingReadiness`): tries in a
row refused because no preprocessing process could start, a job stuck on a preprocessing thread, and the
code replaced on disk under the server, which only a restart cures.

Apart from `service.api.runtime`, which holds one and asks it on each probe, because it is one concern
with its own state (the code stamp, what has been logged); the backend's passes stay there. It logs under
`service.api.runtime`'s name, where /ready's and /health's other lines are (docs name it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from service.api.code_stamp import CodeStamp
from service.api.settings import Settings
from service.engine import Engine

logger = logging.getLogger("service.api.runtime")

# How many changed files a message names.
_CHANGED_SHOWN = 3
# With processes, a page's call on a preprocessing thread ends by its process's time limit (within the
# request timeout: `Settings.engine_config`); this much more is left for the kill and the reaping (up to
# 5 s for the process to exit, 1 s for one dying on its own: `WorkerPool`) before the call is stuck.
PROCESS_KILL_GRACE_S = 10.0


@dataclass
class PreprocessingReadiness:
    """The preprocessing pools' side of one server's readiness and liveness; `Runtime.preprocessing`.

    The methods without `observe` in their name have no side effects (`Runtime.unready_reason` asks them
    for every answer); `observe` is /ready's, which starts probes and logs. Times are the runtime's clock
    (`now`), which tests move on."""

    # The code as the server started with it (`CodeStamp`): looked at again only while a process that
    # imports it anew cannot start (`code_changes`), and what it found, once it found a change.
    code: CodeStamp = field(default_factory=CodeStamp.of_running)
    _code_changes: list[str] | None = None
    _refusals_logged: bool = False  # the processes' refusals have been logged, their end not yet
    _stuck_logged: bool = False  # a stuck job has been logged, its end not yet
    _restart_logged: bool = False  # /health has logged that only a restart cures the server

    def refusals(self, engine: Engine, settings: Settings, now: float) -> str | None:
        """Why pages cannot be preprocessed now (`unready_after_failures` tries in a row refused because
        no preprocessing process could start; the pages refused together count once:
        `Preprocessing._start_failed`), or None."""
        pool = engine.preprocessing_health
        if pool.start_failures < settings.unready_after_failures:
            return None
        since = pool.failing_since
        over = "" if since is None else f" over {now - since:.0f} s"
        return (
            f"no preprocessing process could start for the last {pool.start_failures} tries{over}, "
            f"the pages refused together counted once ({pool.last_error}); probing it"
        )

    def stuck(self, engine: Engine, settings: Settings, now: float) -> str | None:
        """Why a preprocessing worker is taken to be stuck (alive, not answering), or None.

        On a thread (`preprocess_pool="thread"`), a page that has run past the request timeout serves no
        one (its request has been answered 504) and holds its thread for as long as it runs: one that
        never ends (an endless loop in C code) had kept every page behind it waiting until its request
        timed out, /ready and /health 200 for good; a thread cannot be stopped, so `unhealthy` asks for a
        restart once it has lasted. With processes the pool kills a page's process at its time limit
        and starts another, and the page's call ends with it: one that outlives the limit by
        PROCESS_KILL_GRACE_S says the pool itself is stuck. It clears as soon as the job ends."""
        began = engine.preprocessing_running_since
        if began is None:
            return None
        running = now - began
        limit = settings.request_timeout_s
        if engine.config.preprocess_pool == "process":
            limit += PROCESS_KILL_GRACE_S
            if running < limit:
                return None
            return (
                f"a page's call to a preprocessing process has run for {running:.0f} s (the limit is "
                f"{limit:g} s: the process's time limit, the kill and the reaping): the pool is stuck"
            )
        if running < limit:
            return None
        return (
            f"a preprocessing thread has run one job for {running:.0f} s (the limit is {limit:g} s, the "
            "request timeout): a thread cannot be stopped, and the pages behind it wait"
        )

    def observe(
        self, engine: Engine, settings: Settings, now: float, start_probe: Callable[[], None]
    ) -> str | None:
        """`refusals` or else `stuck`, for /ready. While tries are refused a probe page goes through the
        processes now and then (`start_probe`, paced by the runtime), so that a pod no traffic reaches
        sees them start again. Each page refused had been a 503 while /ready said 200: the pod stayed in
        rotation, and with processes that can never start again (the code replaced on disk) answered
        503 for ever. The onset and the end of each are logged once (the kubelet's event for a failed
        probe has no body), both looked at on every probe so that one's lines do not hang on the other."""
        stuck = self.stuck(engine, settings, now)
        if stuck is not None and not self._stuck_logged:
            self._stuck_logged = True
            logger.warning("a preprocessing job is stuck, /ready answers 503 until it ends: %s", stuck)
        elif stuck is None and self._stuck_logged:
            self._stuck_logged = False
            logger.info("no preprocessing job is stuck any more: /ready no longer answers 503 for it")
        refused = self.refusals(engine, settings, now)
        if refused is not None:
            start_probe()
            if not self._refusals_logged:
                self._refusals_logged = True
                logger.warning(
                    "/ready answers 503 until a preprocessing process starts again: %s%s",
                    refused,
                    self._restart_hint(),
                )
        elif self._refusals_logged:
            self._refusals_logged = False
            logger.info("preprocessing processes start again: /ready no longer answers 503 for them")
        return refused or stuck

    def restart_needed(self, engine: Engine, settings: Settings, now: float) -> str | None:
        """Why only a restart cures the server now although nothing has failed for long: no preprocessing
        process can start (past /ready's threshold) and the code on disk changed since the server
        started (`code_changes`): each new process imports the new code, the server runs the old.
        Logged once, as an error: the line an operator finds when the liveness probe restarts the pod.
        Such a server had answered every page 503 for ever, /ready and /health 200."""
        refused = self.refusals(engine, settings, now)
        if refused is None:
            return None
        changed = self.code_changes()
        if not changed:
            return None
        reason = f"{refused}; {self._changed_code(changed)}: restart the server to run them"
        if not self._restart_logged:
            self._restart_logged = True
            logger.error("a restart is needed, /health answers 503 until then: %s", reason)
        return reason

    def unhealthy(self, engine: Engine, settings: Settings, now: float, limit: float) -> str | None:
        """Why a liveness probe should restart the server for the preprocessing pools, or None: no
        process could start for `limit` s (`unhealthy_after_s`; probes included), or a job has been
        stuck that long (a thread cannot be stopped: a restart frees it)."""
        pool = engine.preprocessing_health
        since = pool.failing_since
        if since is not None and self.refusals(engine, settings, now) is not None and now - since >= limit:
            refused = f"{pool.start_failures} tries refused; {pool.last_error}"
            return f"no preprocessing process has started for {now - since:.0f} s ({refused})"
        began = engine.preprocessing_running_since
        stuck = self.stuck(engine, settings, now)
        if began is not None and stuck is not None and now - began >= limit:
            return stuck
        return None

    def code_changes(self) -> list[str]:
        """The files of the code replaced on disk since the server started (`CodeStamp`), [] if none.
        Looked at only while a process cannot start; once a change is found it is kept (it does not
        undo itself), and a restart is the one cure."""
        if self._code_changes is None:
            changed = self.code.changed()
            if not changed:
                return []
            self._code_changes = changed
        return self._code_changes

    def _restart_hint(self) -> str:
        """What the log adds to a process that cannot start: the code changed under the server (restart
        it), or what to look at otherwise."""
        changed = self.code_changes()
        if changed:
            return f"; {self._changed_code(changed)}: restart the server"
        return "; if it does not pass, restart the server"

    def _changed_code(self, changed: list[str]) -> str:
        shown = ", ".join(changed[:_CHANGED_SHOWN]) + (", ..." if len(changed) > _CHANGED_SHOWN else "")
        return (
            f"the code on disk changed since the server started ({len(changed)} files under "
            f"{self.code.root}: {shown}; a package upgraded in place?), and new processes import it"
        )
