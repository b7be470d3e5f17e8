"""What /ready and /health read of the worker pools beside the backend (`PreprocessingReadiness`): tries in a
row refused because no preprocessing process could start, a job stuck on a preprocessing thread, and the
code replaced on disk under the server, which only a restart cures; and the rules /health applies to both
pools' refused starts, the extractor pool's too (`start_outage`, `PreprocessingReadiness.restart_needed`):
one rule for both, as /ready's is one (`service.core.worker_health.start_trouble`).

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
from service.core.worker_health import StartHealth, start_check_due, start_trouble
from service.core.workers import START_BOUND_S
from service.engine import Engine
from service.engine.preprocessing import Phase

logger = logging.getLogger("service.api.runtime")

# How many changed files a message names.
_CHANGED_SHOWN = 3
# With processes, a page's try on a preprocessing process ends by its process's time limit (within the
# request timeout: `Settings.engine_config`), counted from when a process took the page
# (`RunningJobs.taken`); this much more is left for the kill and the reaping (up to 5 s for the process
# to exit, 1 s for one dying on its own: `WorkerPool`) before the call is stuck. The start of a process
# where none was idle comes before, and has its own bound (`START_BOUND_S`, which the pool holds it to:
# a slow start that succeeds is no stuck pool), with this much more for a start that failed to be killed.
# Counted from the try's start, the start had to be allowed to every page: a page stuck in a live
# process was seen only after the request timeout, a whole start and this. Per try: a page whose process
# was killed from outside is tried again in a fresh one (up to twice), each try with its own limit, and
# it waits for that process again (`RunningJobs.retried`).
PROCESS_KILL_GRACE_S = 10.0
# What a job on a preprocessing thread is held to, as a forward pass is (`Settings.stalled_pass_s`).
_READY_KNOB = "HTMLLM_UNREADY_AFTER_PASS_S, the request timeout unless set"


def start_outage(run: StartHealth, refused: bool, now: float, limit: float, workers: str) -> str | None:
    """Why a liveness probe should restart the server for a pool none of whose `workers` can start, or
    None: `refused` (past /ready's threshold: `start_trouble`), and since `limit` s ago
    (`unhealthy_after_s`; probes included). The one rule for the preprocessing and the extractor pools:
    an extractor pool that could not start had kept the pod unready for ever, and live."""
    since = run.failing_since
    if not refused or since is None or now - since < limit:
        return None
    tried = f"{run.start_failures} tries refused; {run.last_error}"
    return f"no {workers} has started for {now - since:.0f} s ({tried})"


@dataclass
class PreprocessingReadiness:
    """The preprocessing pools' side of one server's readiness and liveness, and the code stamp both pools'
    refused starts are read against; `Runtime.preprocessing`.

    The methods without `observe` in their name have no side effects (`Runtime.unready_reason` asks them
    for every answer); `observe` is /ready's, which starts probes and logs. Times are the runtime's clock
    (`now`), which tests move on."""

    # The code as the server started with it (`CodeStamp`): looked at again only while a process that
    # imports it anew cannot start (`code_changes`), and what it found, once it found a change.
    code: CodeStamp = field(default_factory=CodeStamp.of_running)
    _code_changes: list[str] | None = None
    _refusals_logged: bool = False  # the processes' refusals have been logged, their end not yet
    _stuck_logged: bool = False  # a stuck job has been logged, its end not yet

    def refusals(self, engine: Engine, settings: Settings, now: float) -> str | None:
        """Why pages cannot be preprocessed now (`unready_after_failures` tries in a row refused because
        no preprocessing process could start; the pages refused together count once:
        `Preprocessing._start_failed`), or None: `start_trouble`, the extractor pool's rule too."""
        run = engine.preprocessing_health
        after = settings.unready_after_failures
        return start_trouble(run, after, now, workers="preprocessing process", jobs="pages")

    def stuck(self, engine: Engine, settings: Settings, now: float) -> str | None:
        """Why a preprocessing worker is taken to be stuck (alive, not answering), or None.

        Each job by its phase (`Phase`). On its thread (every job with `preprocess_pool="thread"`; with
        processes, what still runs on one: a /tokenize listing, the result cache's key hash), a job that has
        run past `Settings.stalled_pass_s` (`HTMLLM_UNREADY_AFTER_PASS_S`, the knob a forward pass is held to:
        the request timeout by default, 0 never) serves no one (its request has been answered 504) and holds
        its thread for as long as it runs: one that never ends (an endless loop in C code) had kept every page
        behind it waiting until its request timed out, /ready and /health 200 for good; a thread cannot be
        stopped, so `unhealthy` asks for a restart once it has lasted. An operator whose legitimate pages take
        longer than the request timeout (big pages, few CPUs) raises the knob: fixed at the request timeout,
        four 9.5 MB pages at once on a 2 s timeout had turned /ready 503. A page's call to the processes is
        another matter: the pool kills a page's process at its time limit and starts another, and the page's
        try ends with it: one on its process past its time limit and PROCESS_KILL_GRACE_S (counted from when
        the process took it), or one that has waited for a process's start past the start's bound
        (`START_BOUND_S`) and that, says the pool itself is stuck. With processes, a job on a thread had been
        held to a process's rule (its time limit and the kill, neither of which it has) and named as a
        process: the knob did not bound it, and /ready named the wrong cause. It clears as soon as the job
        ends."""
        for phase, began in self._phases(engine):
            limit = self._stuck_after(settings, phase)
            if began is None or limit is None or now - began < limit:
                continue
            return self._stuck_message(phase, now - began, limit, _READY_KNOB)
        return None

    def observe(
        self,
        engine: Engine,
        settings: Settings,
        now: float,
        start_probe: Callable[[], None],
        probe_interval_s: float,
    ) -> str | None:
        """`refusals` or else `stuck`, for /ready. While tries are refused a probe page goes through the
        processes now and then (`start_probe`, paced by the runtime), so that a pod no traffic reaches
        sees them start again; so does a run of refusals below the threshold once it has lasted
        `probe_interval_s` (`start_check_due`: its success ends the run, its refusal counts, as the
        backend's check pass does), where it had stayed counted until a page got a process, and blips
        days apart added up. Each page refused had been a 503 while /ready said 200: the pod stayed in
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
        else:
            if self._refusals_logged:
                self._refusals_logged = False
                logger.info("preprocessing processes start again: /ready no longer answers 503 for them")
            run, after = engine.preprocessing_health, settings.unready_after_failures
            if start_check_due(run, after, now, probe_interval_s):
                start_probe()
        return refused or stuck

    def restart_needed(self, refused: str | None) -> str | None:
        """Why only a restart cures the server now although nothing has failed for long: no worker of a
        pool can start (`refused`: /ready's reason for the preprocessing or the extractor pool, past its
        threshold) and the code on disk changed since the server started (`code_changes`): each new
        process imports the new code, the server runs the old. Such a server had answered every page
        503 for ever, /ready and /health 200; /health's first 503 logs it (`Runtime.observe_health`)."""
        if refused is None:
            return None
        changed = self.code_changes()
        if not changed:
            return None
        return f"{refused}; {self._changed_code(changed)}: restart the server to run them"

    def unhealthy(self, engine: Engine, settings: Settings, now: float, limit: float) -> str | None:
        """Why a liveness probe should restart the server for the preprocessing pools, or None: no
        process could start for `limit` s (`unhealthy_after_s`; `start_outage`), or a job has been stuck
        that long (a thread cannot be stopped: a restart frees it). A job's age counts whether or not
        /ready's limit for it is off (`HTMLLM_UNREADY_AFTER_PASS_S=0`), as a forward pass's does."""
        refused = self.refusals(engine, settings, now) is not None
        outage = start_outage(engine.preprocessing_health, refused, now, limit, "preprocessing process")
        if outage is not None:
            return outage
        for phase, began in self._phases(engine):
            if began is None or now - began < limit:
                continue
            stuck_after = self._stuck_after(settings, phase)
            if stuck_after is None:  # /ready's limit off: this one alone
                return self._stuck_message(phase, now - began, limit, "HTMLLM_UNHEALTHY_AFTER_S")
            if now - began >= stuck_after:
                return self._stuck_message(phase, now - began, stuck_after, _READY_KNOB)
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

    def _phases(self, engine: Engine) -> tuple[tuple[Phase, float | None], ...]:
        """Since when the oldest preprocessing job of each phase (`Phase`) has been in it: on its thread,
        a page's try on the process that took it, and a page waiting for a process to start."""
        phases = (Phase.THREAD, Phase.ON_PROCESS, Phase.WAITING)
        return tuple((phase, engine.preprocessing_since(phase)) for phase in phases)

    def _stuck_after(self, settings: Settings, phase: Phase) -> float | None:
        """How long a preprocessing job may stay in `phase` before it is stuck; None: never (on its thread,
        `HTMLLM_UNREADY_AFTER_PASS_S=0`)."""
        if phase is Phase.WAITING:
            return START_BOUND_S + PROCESS_KILL_GRACE_S
        if phase is Phase.ON_PROCESS:
            return settings.request_timeout_s + PROCESS_KILL_GRACE_S
        return settings.stalled_pass_s

    def _stuck_message(self, phase: Phase, running: float, limit: float, knob: str) -> str:
        """What /ready and /health say of a job that has been in `phase` for `running` s, past its `limit`
        (on its thread, the setting `knob`)."""
        if phase is Phase.WAITING:
            return (
                f"a page has waited {running:.0f} s for a preprocessing process to start (the limit is "
                f"{limit:g} s: a process's start, tried twice, and the kill): the pool is stuck"
            )
        if phase is Phase.ON_PROCESS:
            return (
                f"a page's try on a preprocessing process has run for {running:.0f} s (the limit is "
                f"{limit:g} s: its time limit, the kill and the reaping): the pool is stuck"
            )
        return (
            f"a preprocessing thread has run one job for {running:.0f} s (the limit is {limit:g} s, "
            f"{knob}): a thread cannot be stopped, and the pages behind it wait"
        )

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
