"""Where a running step is, on rank 0, at a calm rate: its phase (rollout, decode, reward, advantages, rollout wait,
update, record) and how far along it is (the rollout's tokens, the decode's images, the rewards done, the update's
micro-batches), and the stage of the load before the first step (process group, policy, DeepSpeed engine, decoder,
...).

On a terminal it is shown in place: in the step bar's description (``grpo [step 3/10: decode 8/16 images]: 20%|``),
and during the load on a line of its own, cleared before the startup summary (a log line meanwhile lifts it:
glm_grpo_ds/runtime/log.py ``ConsoleHandler``). When stderr is not a terminal (a
log file, SLURM, the ``deepspeed`` launcher) it is a line at most every ``logging.status_interval_s`` seconds,
the first one that long after the start (a quick run shows none), e.g.::

    grpo [load] DeepSpeed engine, 47 s into the load (policy took 45 s)
    grpo [step 1/100] decode: 8/16 images, 62 s into the step (rollout took 41 s)

``logging.progress_bar`` rules it as it rules the step bar (glm_grpo_ds/observability/metrics.py ``Progress``);
other ranks, and callers given none, hold :data:`NO_STATUS`, which does nothing. Reporting costs a clock read
and a comparison when nothing is due and never touches a device tensor (no host sync): the counts are the
callers' Python integers. The clock can be injected, so tests need no sleeps.

    status = for_rank(rank, cfg.logging)          # rank 0 with logging.progress_bar: a StepStatus, else NO_STATUS
    status.begin("step 3/100")                    # a new unit of work: its clock starts
    status.phase("decode", total=16, unit="images")
    status.advance(4)                             # 4 more images done
    status.on_tokens(640, 1280)                   # the rollout's decode loop, every ~64 tokens
    status.idle()                                 # between units: nothing running
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

INTERVAL_S = 30.0  # logging.status_interval_s's default: a log file gets a line at most this often
REFRESH_S = 1.0  # a terminal's in-place status is redrawn at most this often (a phase change at once)
NAME = "grpo"  # the step bar's description (Progress), which the in-place status extends


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class StepStatus:
    """Rank 0's status: what runs now (``begin`` / ``phase``) and how far it is (``advance`` / ``on_tokens``),
    shown in place on a terminal or as throttled lines on ``stream`` (default stderr)."""

    def __init__(
        self,
        stream=None,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        refresh_s: float = REFRESH_S,
    ):
        self.stream = sys.stderr if stream is None else stream
        self.in_place = _is_terminal(self.stream)
        self.interval_s, self.refresh_s, self.clock = interval_s, refresh_s, clock
        self.bar = None  # the step bar (show_in), or during the load a line of our own (_own)
        self._own = False
        now = clock()
        self._last_line = now  # the first line comes interval_s after the start: a quick run prints none
        self._last_draw = -math.inf
        self.where: str | None = None
        self._started = now
        self._clear_phase(now)

    def _clear_phase(self, now: float) -> None:
        self.name: str | None = None
        self.total: int | None = None
        self.unit, self.done = "", 0
        self._phase_started = now
        self._previous: tuple[str, float] | None = None  # the phase before this one and its seconds, until shown

    # ------------------------------------------------------------------ what runs
    def begin(self, where: str) -> None:
        """A new unit of work, e.g. ``"load"``, ``"step 3/100"``, ``"eval at step 2"``: its clock starts."""
        now = self.clock()
        self.where, self._started = where, now
        self._clear_phase(now)

    def phase(self, name: str, total: int | None = None, unit: str = "") -> None:
        """A phase of the unit starts: ``total`` ``unit`` to do (None: no count, or not known yet)."""
        now = self.clock()
        previous = (self.name, now - self._phase_started) if self.name is not None else None
        self._clear_phase(now)
        self.name, self.total, self.unit, self._previous = name, total, unit, previous
        self._show(now, changed=True)

    def advance(self, n: int = 1) -> None:
        """``n`` more of the phase's ``unit`` done."""
        self.done += n
        self._show(self.clock())

    def on_tokens(self, done: int, total: int) -> None:
        """The rollout's decode loop: ``done`` of ``total`` tokens per sequence drawn (host-side counts)."""
        self.done, self.total = done, total
        self._show(self.clock())

    def idle(self) -> None:
        """Nothing runs (between steps, after the load): the in-place status goes, no line is due."""
        self.where = None
        self._clear_phase(self.clock())
        if self.bar is not None:
            if self._own:
                self._close_own()
            else:
                self.bar.set_description_str(NAME, refresh=False)  # shown at the bar's next refresh

    # ------------------------------------------------------------------ where it shows
    def show_in(self, bar) -> None:
        """Show the status in ``bar``'s description from now on (the step bar; None: no bar)."""
        if self._own:
            self._close_own()
        self.bar = bar

    def printed(self) -> None:
        """A line of the caller's just went to the stream (the step line): the next status line is due
        ``interval_s`` from now."""
        self._last_line = self.clock()

    def close(self) -> None:
        if self._own:
            self._close_own()
        self.bar = None

    def _close_own(self) -> None:
        self.bar.close()  # leave=False: the line is cleared
        self.bar, self._own = None, False

    # ------------------------------------------------------------------ text
    def what(self) -> str:
        """The phase and its count, e.g. ``decode: 8/16 images``, ``rollout: 640/1280 tokens``, ``decoder``."""
        if self.name is None:
            return "starting"
        if self.total is not None:
            return f"{self.name}: {self.done}/{self.total} {self.unit}".rstrip()
        if self.done:
            return f"{self.name}: {self.done} {self.unit}".rstrip()
        return self.name

    def line(self, now: float | None = None) -> str:
        """The line a log file gets, e.g. ``grpo [step 1/100] decode: 8/16 images, 62 s into the step (rollout
        took 41 s)``; the phase before is named on the first line of a phase only."""
        now = self.clock() if now is None else now
        where = self.where or "run"
        text = f"{NAME} [{where}] {self.what()}, {_seconds(now - self._started)} into the {where.split()[0]}"
        if self._previous is not None:
            text += f" ({self._previous[0]} took {_seconds(self._previous[1])})"
        return text

    def in_place_text(self) -> str:
        """The terminal's in-place status, e.g. ``grpo [step 1/100: decode 8/16 images]``."""
        return f"{NAME} [{self.where or 'run'}: {self.what().replace(': ', ' ', 1)}]"

    # ------------------------------------------------------------------ showing
    def _show(self, now: float, changed: bool = False) -> None:
        if self.in_place:
            if changed or now - self._last_draw >= self.refresh_s:
                self._draw(now)
        elif now - self._last_line >= self.interval_s:
            print(self.line(now), file=self.stream, flush=True)
            self._last_line, self._previous = now, None  # the phase before: on the phase's first line only

    def _draw(self, now: float) -> None:
        if self.bar is None:  # the load, before the step bar: a status line of our own
            from tqdm import tqdm

            self.bar = tqdm(bar_format="{desc} {elapsed}", file=self.stream, leave=False, dynamic_ncols=True)
            self._own = True
        self.bar.set_description_str(self.in_place_text(), refresh=True)
        self._last_draw = now


class NoStatus:
    """The status of other ranks and of callers given none: every call does nothing."""

    in_place = False

    def begin(self, where: str) -> None:
        pass

    def phase(self, name: str, total: int | None = None, unit: str = "") -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def on_tokens(self, done: int, total: int) -> None:
        pass

    def idle(self) -> None:
        pass

    def show_in(self, bar) -> None:
        pass

    def printed(self) -> None:
        pass

    def close(self) -> None:
        pass


NO_STATUS = NoStatus()


def for_rank(rank: int, logging_cfg, stream=None) -> StepStatus | NoStatus:
    """Rank 0 with ``logging.progress_bar``: a :class:`StepStatus` (lines every ``logging.status_interval_s``
    when ``stream`` is not a terminal); else :data:`NO_STATUS`."""
    if rank != 0 or not logging_cfg.progress_bar:
        return NO_STATUS
    return StepStatus(stream, logging_cfg.status_interval_s)
