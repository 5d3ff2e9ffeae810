"""Preemption: SIGTERM / SIGINT become a checkpoint at the next step boundary, then an exit.

Every rank installs :class:`StopSignals` for the training loop. A handler only records the signal
(a collective may be in flight; nothing is safe to do inside it). After each step the trainer
all-reduces the recorded signal (max over ranks), so all ranks agree to stop even when only some
received it: the ``deepspeed`` launcher, for one, forwards SIGTERM to one rank at a time and
waits up to 30 s for it before sending SIGKILL. Then every rank saves the checkpoint and exits
with ``128 + signal`` (143 for SIGTERM, 130 for SIGINT), the shell convention for "killed by".
"""

from __future__ import annotations

import signal

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Context manager: while active, SIGTERM/SIGINT set ``received`` instead of killing."""

    def __init__(self):
        self.received = 0
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        self.received = self.received or signum

    def __enter__(self) -> "StopSignals":
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Stopped(Exception):
    """Training stopped early with a checkpoint; ``exit_code`` is the process exit status."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


# Exit status of a run stopped after max_consecutive_skips non-finite steps (2 = bad input).
EXIT_NONFINITE = 3


def exit_code(signum: int) -> int:
    return 128 + signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name
