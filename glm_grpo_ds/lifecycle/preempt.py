"""Signals: SIGTERM / SIGINT become a checkpoint at the next step boundary, then an exit; a second
Ctrl-C aborts at once; an interrupt during startup is one line.

During training every rank installs :class:`StopSignals`. A Python signal handler runs only when
the main thread is back in the interpreter, which can take a whole collective or CUDA
synchronisation (minutes, if a peer is gone), so the signals are also written to a wakeup pipe
(``signal.set_wakeup_fd``, from the C-level handler) that a watcher thread reads at once. The
watcher records the first signal, prints on rank 0 that the run will checkpoint and stop after the
current step (and about when), and on a second SIGINT prints one line and ends the process with
``os._exit`` (130): no cleanup that could wait on a peer, and nothing half-written is ever loaded
(checkpoints are written to ``.tmp`` and renamed, ``latest`` is replaced atomically). A repeated
SIGTERM does not abort: schedulers and the ``deepspeed`` launcher send SIGTERM more than once while
the run is saving.

After each step the trainer all-reduces the recorded signal (max over ranks), so all ranks agree to
stop even when only some received it: the ``deepspeed`` launcher, for one, forwards SIGTERM to one
rank at a time and sends SIGKILL 30 s later. Then every rank saves the checkpoint and exits with
``128 + signal`` (143 for SIGTERM, 130 for SIGINT), the shell convention for "killed by".

Before training (config, data, model loading) :func:`startup_signals` turns SIGINT / SIGTERM into
:class:`Interrupted`, which the entry point reports as one line (no traceback), exit ``128 + signal``.
The signal is also recorded, and leaving the block raises :class:`Interrupted` again: library code that
swallows the exception (a bare ``except:``, ``except BaseException``) cannot let the run go on training.

A SIGINT that the process inherited as ignored (``nohup``, ``cmd &`` in a script, a job runner that starts
jobs that way) stays ignored, in training and during startup: that is how its parent asked for it not to
be interrupted by a Ctrl-C meant for something else (Python itself then installs no KeyboardInterrupt).
SIGTERM is always handled. Both restore, on leaving, the handlers that were there before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Callable

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def handled_signals() -> tuple[int, ...]:
    """The signals to handle now: SIGTERM always; SIGINT unless this process inherited it ignored
    (the parent asked for that: ``nohup``, ``cmd &`` in a script), see the module docstring."""
    return tuple(sig for sig in SIGNALS if sig != signal.SIGINT or signal.getsignal(sig) is not signal.SIG_IGN)


class StopSignals:
    """Context manager: while active, SIGTERM/SIGINT set ``received`` instead of killing; a SIGINT
    after a first signal ends the process at once.

    ``notice(signum)`` -> the line to print at the first signal (rank 0), or None to print nothing
    (other ranks; then the abort prints nothing either)."""

    JOIN_S = 5.0  # how long leaving the block waits for the watcher thread

    def __init__(self, notice: Callable[[int], str] | None = None):
        self.received = 0
        self._notice = notice
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        # Needed for the C-level handler to write the wakeup pipe; the watcher thread acts on it.
        self.received = self.received or signum

    def _watch(self, read_fd: int) -> None:
        try:
            self._watch_pipe(read_fd)
        finally:  # closed here, not by __exit__: a watcher still printing would read whatever file reused the number
            os.close(read_fd)

    def _watch_pipe(self, read_fd: int) -> None:
        while True:
            data = os.read(read_fd, 64)
            if not data:  # the write end closed: __exit__
                return
            for signum in data:
                if signum not in SIGNALS:
                    continue
                if not self._first:
                    self._first = signum
                    self.received = self.received or signum
                    if self._notice is not None:
                        _say(self._notice(signum))
                elif signum == signal.SIGINT:
                    if self._notice is not None:
                        _say(
                            "glm-grpo train: second Ctrl-C: aborted at once, without a checkpoint; the last complete "
                            "checkpoint (checkpoints/latest) is intact"
                        )
                    os._exit(exit_code(signal.SIGINT))

    def __enter__(self) -> "StopSignals":
        self._first = 0
        self._previous = {sig: signal.signal(sig, self._handle) for sig in handled_signals()}
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # the C-level handler must never block on it
        self._previous_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._watcher = threading.Thread(target=self._watch, args=(self._read_fd,), name="stop-signals", daemon=True)
        self._watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        # wakeup fd first: the C handler must not write to a closed (or reused) descriptor
        signal.set_wakeup_fd(self._previous_wakeup)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        os.close(self._write_fd)  # the watcher reads EOF, closes its end and returns
        self._watcher.join(timeout=self.JOIN_S)  # a notice blocked on a full stderr pipe: the daemon thread is left


@contextlib.contextmanager
def terms_ignored():
    """Inside the block a SIGTERM is passed over (the run is already stopping: its checkpoint is saved and the ranks
    wait for rank 0's upload). Out of :class:`StopSignals`, SIGTERM's default handler was back, and a scheduler's
    repeated SIGTERM (launch/signals.sh forwards each) killed every rank silently mid-upload, exit -15.
    Ctrl-C keeps its KeyboardInterrupt (the caller's one line)."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _say(line: str) -> None:
    """One line on stderr from the watcher thread: os.write, unbuffered, cannot collide with a
    buffered write the main thread was in the middle of."""
    os.write(2, (line + "\n").encode("utf-8", "replace"))


class Interrupted(BaseException):
    """SIGINT / SIGTERM before training started (see :func:`startup_signals`).

    A BaseException, like KeyboardInterrupt: startup runs library code (imports of datasets, DeepSpeed's
    op loading, transformers) with ``except Exception`` fallbacks that would otherwise swallow the
    signal and let the run go on training."""

    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum


@contextlib.contextmanager
def startup_signals():
    """Inside the block SIGINT / SIGTERM raise :class:`Interrupted` (SIGTERM's default would kill the
    process without a word; SIGINT's KeyboardInterrupt would print a traceback). The first one is also
    recorded, and a block that ends normally after it raises :class:`Interrupted` then: the exception
    raised by the handler lands wherever the main thread is, possibly in library code that swallows it."""
    received = []

    def interrupt(signum, frame):
        received.append(signum)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in handled_signals()}
    try:
        yield
    except BaseException as err:
        if received and not isinstance(err, Interrupted):  # swallowed, and startup then failed for it
            raise Interrupted(received[0]) from err
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:  # the block ended normally although a signal came: its exception was swallowed
        raise Interrupted(received[0])


class Stopped(Exception):
    """Training stopped early, with a checkpoint (none when the disk has no room for one: lifecycle/disk_space.py);
    ``exit_code`` is the process exit status."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


# Exit status of a run stopped after max_consecutive_skips skipped steps (2 = bad input).
EXIT_NONFINITE = 3
# Exit status of a run stopped by an alarm with monitor.stop_on_alarm (4 = an upload failed).
EXIT_ALARM = 5


def exit_code(signum: int) -> int:
    return 128 + signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name
