"""Progress of a tool's count (prompts evaluated, images rendered) that reads well in a terminal and in a log.

On a terminal: a tqdm bar. Elsewhere (a log file, SLURM, a pipe) tqdm's carriage-return redraws would be one
garbled line, so :class:`Count` prints a plain line at most every ``every_s`` seconds and when the count is done:
``evaluate: 8/16 prompts, 00:12, eta 00:12`` (tqdm's clock, as training's progress lines). Training's step
progress is observability/metrics.py's ``Progress``.
"""

from __future__ import annotations

import sys
import time


class Count:
    """``update(n)`` adds ``n`` of ``total``; a context manager (the bar is closed, the last line printed)."""

    def __init__(self, total: int, desc: str, unit: str, enabled: bool = True, stream=None, every_s: float = 30.0):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.done, self.bar, self.lines = 0, None, False
        self.t0 = self.last = time.perf_counter()
        if enabled and self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True)
        elif enabled:
            self.lines = True

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.perf_counter()
        if self.lines and (self.done >= self.total or now - self.last >= self.every_s):
            from tqdm import tqdm

            self.last = now
            elapsed = now - self.t0
            eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
            clock = tqdm.format_interval
            print(
                f"{self.desc}: {self.done}/{self.total} {self.unit}, {clock(elapsed)}, eta {clock(eta)}",
                file=self.stream,
                flush=True,
            )

    def __enter__(self) -> Count:
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
