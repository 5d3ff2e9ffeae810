"""A per-rank watchdog: when a phase of a step (rollout, decode, reward, advantages, update, record, checkpoint save,
eval ...) runs far longer than it did last time on this rank, every rank that is late says so in its own log
(``logs/rank_<r>.log``) and on stderr, with the Python stacks of all its threads - long before a collective's
timeout (``dist_timeout_minutes``, default 60) ends a hung run with a message that names no rank and no line.

A hang in a data-parallel run shows on every rank: the rank that is stuck (a reward that never returns, a dead
NFS read) is late in its own phase, and the others are late in the next collective, waiting for it. Each rank's
report names its phase and step and shows its stacks, so reading the ranks' logs side by side finds the one that
is not where the others are (docs/troubleshooting.md#a-run-that-hangs).

A phase is reported once it has run longer than ``max(logging.watchdog_factor x its last duration on this rank,
logging.watchdog_min_seconds)`` (the floor alone at its first occurrence), never later than half of the collective
timeout; once per occurrence; a reported phase that then ends says so in one line. It never stops the run nor
changes what it computes. Telling it where the step is costs a clock read and a lock (no device sync, no
collective); one daemon thread per rank does the checking, ten times per ``watchdog_min_seconds`` (at most every
5 s). The clock and the report can be injected, so tests need no sleeps.

    watchdog = for_run(cfg.logging, rank, cfg.dist_timeout_minutes)   # NO_WATCHDOG with logging.watchdog false
    status = watched(status, watchdog)    # the step status's phases (rollout, decode, reward, update) reach it too
    with watchdog:                        # its thread runs inside (start / close)
        watchdog.begin(3)                 # step 3 starts (labels the phases that follow)
        watchdog.phase("advantages")      # a phase starts; the one before ends (its seconds: its next expectation)
"""

from __future__ import annotations

import dataclasses
import faulthandler
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

# A phase is reported by half of the collective timeout at the latest: the ranks waiting in a collective for the
# late one must still be alive (and able to dump their stacks) when the report is due.
BEFORE_TIMEOUT = 0.5
PY_SPY_TIMEOUT_S = 60.0  # py-spy dump --native on a large process takes seconds; never let it hold the thread longer
# What to rerun with to see the collectives themselves (NCCL's own log; torch's flight recorder, dumped on timeout;
# torch >= 2.15 also reads them as TORCH_FR_*), checked against torch 2.11 and 2.15.
NCCL_SETTINGS = (
    "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL TORCH_NCCL_ASYNC_ERROR_HANDLING=1 TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
    "TORCH_NCCL_TRACE_BUFFER_SIZE=2000"
)
_LOGGER = logging.getLogger("glm_grpo.watchdog")
_LOGGER.setLevel(logging.WARNING)  # written whatever --log-level the console has (it goes to the run's file too)


def _seconds(s: float) -> str:
    if s < 0.1:
        return f"{s * 1000:.1f} ms"
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


@dataclasses.dataclass
class Running:
    """The phase running now on this rank: its name, the step it belongs to, when it started (the clock's
    seconds), whether it was reported."""

    name: str
    step: int | None
    started: float
    reported: bool = False


@dataclasses.dataclass(frozen=True)
class Alarm:
    """A phase running past its limit: ``elapsed`` seconds so far, ``last`` its last normal duration on this rank
    (None at its first occurrence), ``limit`` the seconds after which it was reported."""

    phase: str
    step: int | None
    elapsed: float
    last: float | None
    limit: float


@dataclasses.dataclass(frozen=True)
class Ended:
    """A reported phase that ended after ``seconds``."""

    phase: str
    step: int | None
    seconds: float


class Watchdog:
    """This rank's watchdog: the trainer tells it where the step is (:meth:`begin`, :meth:`phase`, :meth:`idle`);
    :meth:`due` decides whether the running phase is late (the thread calls it; tests call it with their clock);
    :meth:`start` / :meth:`close` run the thread that reports."""

    def __init__(
        self,
        factor: float,
        min_seconds: float,
        rank: int = 0,
        timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        report: Callable[[str], None] | None = None,
        host: str | None = None,
        pid: int | None = None,
    ):
        self.factor, self.min_seconds, self.timeout_s = factor, min_seconds, timeout_s
        self.rank, self.clock = rank, clock
        self.report = _log if report is None else report
        self.host = socket.gethostname() if host is None else host
        self.pid = os.getpid() if pid is None else pid
        self.last: dict[str, float] = {}  # phase -> its last normal duration on this rank (its pace)
        self.step: int | None = None
        self.running: Running | None = None
        self._ended: list[Ended] = []  # reported phases that ended since the thread last looked
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # wake often enough to report within ~10 % of the floor, and at least every 5 s
        self.poll_s = min(max(min_seconds / 10, 0.05), 5.0)

    # ------------------------------------------------------------------ where the step is (the training thread)
    def begin(self, step: int) -> None:
        """Step ``step`` starts: the phase running ends; the phases that follow are this step's."""
        now = self.clock()
        with self._lock:
            self._end(now)
            self.step = step

    def phase(self, name: str) -> None:
        """Phase ``name`` starts now; the one running ends."""
        now = self.clock()
        with self._lock:
            self._end(now)
            self.running = Running(name, self.step, now)

    def idle(self) -> None:
        """The phase running ends; nothing is watched until the next :meth:`phase`."""
        now = self.clock()
        with self._lock:
            self._end(now)

    def _end(self, now: float) -> None:
        running, self.running = self.running, None
        if running is None:
            return
        seconds = now - running.started
        if running.reported:
            self._ended.append(Ended(running.name, running.step, seconds))
        # A reported (slow) occurrence does not raise the bar when a normal one is known: one stall must not hide the
        # next behind factor x its length. Without one it is the pace (a phase always longer than the floor - a big
        # checkpoint save - is reported at its first occurrence only).
        if not running.reported or running.name not in self.last:
            self.last[running.name] = seconds

    # ------------------------------------------------------------------ the decision
    def limit(self, name: str) -> float:
        """The seconds after which phase ``name`` is reported: ``max(factor x last, min_seconds)``, the floor alone
        without a last duration, never more than half of the collective timeout."""
        last = self.last.get(name)
        limit = self.min_seconds if last is None else max(self.factor * last, self.min_seconds)
        return limit if self.timeout_s is None else min(limit, BEFORE_TIMEOUT * self.timeout_s)

    def due(self, now: float | None = None) -> Alarm | None:
        """The running phase's alarm if it is past its limit and not yet reported (it is then marked reported:
        once per occurrence), else None."""
        now = self.clock() if now is None else now
        with self._lock:
            running = self.running
            if running is None or running.reported:
                return None
            elapsed, limit = now - running.started, self.limit(running.name)
            if elapsed < limit:
                return None
            running.reported = True
            return Alarm(running.name, running.step, elapsed, self.last.get(running.name), limit)

    def ended(self) -> list[Ended]:
        """The reported phases that ended since the last call."""
        with self._lock:
            ended, self._ended = self._ended, []
        return ended

    # ------------------------------------------------------------------ the report
    def alarm_line(self, alarm: Alarm) -> str:
        where = alarm.phase if alarm.step is None else f"{alarm.phase} of step {alarm.step}"
        if alarm.last is None and alarm.limit < self.min_seconds:  # the timeout's cap, under the floor
            pace = f"its first on this rank; the limit is half of dist_timeout_minutes={self.timeout_s / 60:g}"
        elif alarm.last is None:
            pace = f"its first on this rank; the floor is logging.watchdog_min_seconds={self.min_seconds:g}"
        else:
            times = alarm.elapsed / max(alarm.last, 1e-9)
            pace = f"{times:.1f} x" if times < 10 else f"{times:.0f} x"
            pace += f" its last {_seconds(alarm.last)}"
        timeout = "" if self.timeout_s is None else f" (dist_timeout_minutes={self.timeout_s / 60:g})"
        return (
            f"glm-grpo: watchdog: rank {self.rank} (host {self.host}, pid {self.pid}) has been in {where} for "
            f"{_seconds(alarm.elapsed)} ({pace}); its Python stacks follow; compare them with the other ranks' "
            f"(logs/rank_<r>.log): the rank not where the others are holds them up; the run goes on, and ends when "
            f"a collective times out{timeout} if nothing moves"
        )

    def ended_line(self, ended: Ended) -> str:
        where = ended.phase if ended.step is None else f"{ended.phase} of step {ended.step}"
        return f"glm-grpo: watchdog: rank {self.rank}: {where} ended after {_seconds(ended.seconds)} (reported above)"

    def check(self) -> None:
        """One look (the thread's): report the reported phases that ended, then the running one if it is late."""
        for ended in self.ended():
            self.report(self.ended_line(ended))
        alarm = self.due()
        if alarm is not None:
            self.report(
                f"{self.alarm_line(alarm)}\n{python_stacks(self.pid)}"
                f"glm-grpo: watchdog: to see the collectives, rerun with {NCCL_SETTINGS} on every rank (in "
                ".deepspeed_env: DeepSpeed's ssh launch forwards only NCCL* of the shell) and a shorter "
                "dist_timeout_minutes (e.g. 15) so a hang fails sooner; docs/troubleshooting.md#a-run-that-hangs"
            )

    # ------------------------------------------------------------------ the thread
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="glm-grpo-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.check()

    def close(self) -> None:
        """Stop the thread (a report under way finishes first); a reported phase that ended since its last look gets
        its line now (a slow final save, closed within one poll of its end, left "has been in" without a sequel)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            for ended in self.ended():
                self.report(self.ended_line(ended))

    def __enter__(self) -> Watchdog:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _log(text: str) -> None:
    """Every rank: the run's log file and stderr (runtime/log.py lets ``all_ranks`` records through on any rank)."""
    _LOGGER.warning(text, extra={"all_ranks": True})


def python_stacks(pid: int) -> str:
    """The Python stacks of every thread of this process, ending in a newline: ``py-spy dump --native`` when
    py-spy is on PATH (native frames too: a collective's C++ / NCCL calls), else (or when it fails: tracing a
    process needs ptrace rights) faulthandler's dump, the threads' names first (faulthandler names ids only)."""
    note = ""
    spy = shutil.which("py-spy")
    if spy is not None:
        try:
            done = subprocess.run(
                [spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S
            )
        except (OSError, subprocess.SubprocessError) as err:
            why = f"{type(err).__name__}: {err}"
        else:
            if done.returncode == 0 and done.stdout.strip():
                return f"py-spy dump --native --pid {pid}:\n{done.stdout.rstrip()}\n"
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0]
        note = f"(py-spy dump failed: {why}; Python's own dump instead)\n"
    # as faulthandler writes the ids (0x00007f...), so a reader can match them
    names = ", ".join(f"{t.ident:#018x} {t.name}" for t in threading.enumerate() if t.ident is not None)
    try:
        with tempfile.TemporaryFile("w+") as dump:  # faulthandler writes to a file descriptor, not a Python stream
            faulthandler.dump_traceback(dump, all_threads=True)
            dump.seek(0)
            stacks = dump.read()
    except OSError as err:  # no room for a temporary file: the line is still worth reporting
        stacks = f"(the stacks could not be dumped: {err})\n"
    return f"{note}threads: {names}\n{stacks}"


class NoWatchdog:
    """``logging.watchdog: false``: every call does nothing."""

    def begin(self, step: int) -> None:
        pass

    def phase(self, name: str) -> None:
        pass

    def idle(self) -> None:
        pass

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> NoWatchdog:
        return self

    def __exit__(self, *exc) -> None:
        pass


NO_WATCHDOG = NoWatchdog()


def for_run(logging_cfg, rank: int, dist_timeout_minutes: float | None = None) -> Watchdog | NoWatchdog:
    """The watchdog of a run's rank from its ``logging`` config section (``watchdog``, ``watchdog_factor``,
    ``watchdog_min_seconds``; :data:`NO_WATCHDOG` when off), limited by the collective timeout."""
    if not logging_cfg.watchdog:
        return NO_WATCHDOG
    timeout_s = None if dist_timeout_minutes is None else dist_timeout_minutes * 60
    return Watchdog(logging_cfg.watchdog_factor, logging_cfg.watchdog_min_seconds, rank, timeout_s)


class WatchedStatus:
    """A step status (glm_grpo_ds/observability/step_status.py) whose phases the watchdog is told too, as
    ``prefix + name`` (``"eval "``: an evaluation's rollout is not held to a training rollout's pace); everything
    else is the status's own."""

    def __init__(self, status, watchdog: Watchdog, prefix: str = ""):
        self.status, self.watchdog, self.prefix = status, watchdog, prefix

    @property
    def in_place(self) -> bool:
        return self.status.in_place

    def phase(self, name: str, total: int | None = None, unit: str = "") -> None:
        self.watchdog.phase(self.prefix + name)
        self.status.phase(name, total, unit)

    def begin(self, where: str) -> None:
        self.status.begin(where)

    def advance(self, n: int = 1) -> None:
        self.status.advance(n)

    def on_tokens(self, done: int, total: int) -> None:
        self.status.on_tokens(done, total)

    def idle(self) -> None:
        self.status.idle()

    def show_in(self, bar) -> None:
        self.status.show_in(bar)

    def printed(self) -> None:
        self.status.printed()

    def close(self) -> None:
        self.status.close()


def watched(status, watchdog, prefix: str = ""):
    """``status`` with its phases told to ``watchdog`` too (``status`` itself when there is no watchdog)."""
    return status if isinstance(watchdog, NoWatchdog) else WatchedStatus(status, watchdog, prefix)
