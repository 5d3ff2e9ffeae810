"""Progress of a tool's count (prompts evaluated, images rendered) that reads well in a terminal and in a log.

On a terminal: a tqdm bar, redrawn every second so its clock runs while one item takes minutes. Elsewhere (a log
file, SLURM, a pipe) tqdm's carriage-return redraws would be one garbled line, so :class:`Count` prints a plain
line at most every ``every_s`` seconds and when the count is done: ``evaluate: 8/16 prompts, 00:12, eta 00:12``
(tqdm's clock, as training's progress lines). A count that does not move still prints one every ``every_s``
(``eta ?`` before the first item): a 1024x1024 evaluation batch can take minutes, and minutes of silence read
as a hang. Training's step progress is observability/metrics.py's ``Progress``.
"""

from __future__ import annotations

import sys
import threading
import time

BAR_REFRESH_S = 1.0  # the terminal bar's redraw between updates (its elapsed clock)


class Count:
    """``update(n)`` adds ``n`` of ``total``; a context manager (the bar is closed, the last line printed, the
    clock's thread stopped)."""

    def __init__(self, total: int, desc: str, unit: str, enabled: bool = True, stream=None, every_s: float = 30.0):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.done, self.bar, self.lines = 0, None, False
        self.t0 = self.last = time.perf_counter()
        self._lock, self._stop, self._clock = threading.Lock(), threading.Event(), None
        if enabled and self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True)
        elif enabled:
            self.lines = True
        period = BAR_REFRESH_S if self.bar is not None else every_s if self.lines and every_s > 0 else None
        if period is not None:
            self._clock = threading.Thread(target=self._tick, args=(period,), name="progress-clock", daemon=True)
            self._clock.start()

    def _tick(self, period: float) -> None:
        """Between updates: redraw the bar, or print the line once ``every_s`` has passed without one."""
        while not self._stop.wait(period):
            with self._lock:
                if self.bar is not None:
                    self.bar.refresh()
                elif time.perf_counter() - self.last >= self.every_s:
                    self._print()

    def _print(self) -> None:
        from tqdm import tqdm

        now = time.perf_counter()
        self.last, elapsed = now, now - self.t0
        clock = tqdm.format_interval
        eta = clock(elapsed / self.done * (self.total - self.done)) if self.done else "?"
        print(
            f"{self.desc}: {self.done}/{self.total} {self.unit}, {clock(elapsed)}, eta {eta}",
            file=self.stream,
            flush=True,
        )

    def update(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self.bar is not None:
                self.bar.update(n)
            elif self.lines and (self.done >= self.total or time.perf_counter() - self.last >= self.every_s):
                self._print()

    def __enter__(self) -> Count:
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._clock is not None:
            self._clock.join()
        if self.bar is not None:
            self.bar.close()
