"""Signals (glm_grpo_ds/lifecycle/preempt.py), in child processes: the first SIGINT / SIGTERM is recorded and
announced at once, a second SIGINT ends the process at once (exit 130, one line) even while the main
thread is busy, a repeated SIGTERM does not, a SIGINT inherited as ignored stays ignored, and signals
during startup raise Interrupted, even when library code swallows the exception.

The children start with SIGINT's default (or ignored, where that is the case under test) whatever this
process has: `make test &` or nohup starts the suite with SIGINT ignored, which the children inherit.
The in-process startup tests use SIGTERM, which is always handled."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, signal, sys, time
from glm_grpo_ds.lifecycle.preempt import StopSignals
before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
with StopSignals(lambda s: f"notice {signal.Signals(s).name}") as signals:
    print("ready", flush=True)
    for sig in sys.argv[1:]:
        os.kill(os.getpid(), getattr(signal, sig))
        time.sleep(0.5)
    time.sleep(float(os.environ.get("BUSY", "0")))  # the main thread busy: the step goes on
    print("received", signals.received, flush=True)
print("handlers restored:", all(signal.getsignal(s) is h for s, h in before.items()), flush=True)
print("SIGINT ignored:", before[signal.SIGINT] is signal.SIG_IGN, flush=True)
"""


def run(*signals, busy=0.0, sigint=signal.SIG_DFL):
    """SCRIPT in a child that starts with SIGINT's disposition ``sigint``, as if inherited from its parent."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), BUSY=str(busy))
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *signals],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )
    return proc, time.monotonic() - start


def test_first_signal_is_recorded_and_announced_at_once():
    proc, _ = run("SIGTERM")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["notice SIGTERM"]
    assert f"received {int(signal.SIGTERM)}" in proc.stdout and "handlers restored: True" in proc.stdout
    assert "SIGINT ignored: False" in proc.stdout


def test_an_inherited_ignored_sigint_stays_ignored_and_sigterm_is_still_handled():
    # nohup / `cmd &` in a script: the parent asked that a Ctrl-C meant for something else not stop this
    proc, _ = run("SIGINT", "SIGINT", "SIGTERM", sigint=signal.SIG_IGN)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["notice SIGTERM"]
    assert f"received {int(signal.SIGTERM)}" in proc.stdout
    assert "SIGINT ignored: True" in proc.stdout and "handlers restored: True" in proc.stdout  # still ignored


def test_second_ctrl_c_aborts_at_once_with_one_line():
    proc, seconds = run("SIGINT", "SIGINT", busy=60)
    assert proc.returncode == 130
    assert proc.stderr.splitlines() == [
        "notice SIGINT",
        "glm-grpo train: second Ctrl-C: aborted at once, without a checkpoint; the last complete checkpoint "
        "(checkpoints/latest) is intact",
    ]
    assert "received" not in proc.stdout and seconds < 30  # did not wait for the 60 s of work


def test_a_repeated_sigterm_does_not_abort():
    # schedulers and the deepspeed launcher send SIGTERM more than once while the run saves
    proc, _ = run("SIGTERM", "SIGTERM", "SIGTERM")
    assert proc.returncode == 0 and proc.stderr.splitlines() == ["notice SIGTERM"]
    assert f"received {int(signal.SIGTERM)}" in proc.stdout


def test_signals_during_startup_raise_interrupted():
    import pytest

    from glm_grpo_ds.lifecycle.preempt import Interrupted, startup_signals

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as err, startup_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert err.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_during_startup_is_not_swallowed_by_library_code_catching_exception():
    """Startup runs library code with ``except Exception`` fallbacks; a Ctrl-C landing in one must still
    stop the run (it went on training once: the fresh-clone CI of 2026-11-23)."""
    import pytest

    from glm_grpo_ds.lifecycle.preempt import Interrupted, startup_signals

    with pytest.raises(Interrupted) as err, startup_signals():
        try:  # what e.g. an optional-import check in a library does
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except Exception:  # noqa: BLE001 - the library's fallback under test
            pass
    assert err.value.signum == signal.SIGTERM


def test_a_signal_whose_exception_library_code_swallowed_still_stops_startup():
    """Even a library path that swallows every exception (a bare ``except:``, ``except BaseException``)
    cannot let the run train on: the signal is recorded, and leaving the startup block raises it."""
    import pytest

    from glm_grpo_ds.lifecycle.preempt import Interrupted, startup_signals

    with pytest.raises(Interrupted) as err, startup_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except BaseException:  # noqa: BLE001 - the library path under test
            pass
        time.sleep(0.2)  # the rest of startup goes on
    assert err.value.signum == signal.SIGTERM


def test_a_swallowed_startup_signal_wins_over_the_error_it_caused_later():
    import pytest

    from glm_grpo_ds.lifecycle.preempt import Interrupted, startup_signals

    with pytest.raises(Interrupted) as err, startup_signals():
        try:  # e.g. an import interrupted half-way and swallowed ...
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except BaseException:  # noqa: BLE001 - the library path under test
            pass
        raise ImportError("cannot import name 'x'")  # ... fails the next use
    assert err.value.signum == signal.SIGTERM


LATE_WATCHER = """
import os, signal, tempfile, threading, time
from glm_grpo_ds.lifecycle.preempt import StopSignals

StopSignals.JOIN_S = 0.2  # leaving the block gives up on the watcher, still printing its notice


def slow_notice(signum):
    time.sleep(1.0)  # os.write(2) blocked on a full stderr pipe (srun / pdsh stalled)
    return "notice"


stop = StopSignals(slow_notice)
with stop:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
with tempfile.TemporaryFile() as f:  # opened next: took the number of the pipe's read end when __exit__ closed it
    f.write(bytes([signal.SIGINT]) * 4 + b"payload")
    f.flush()
    f.seek(0)
    time.sleep(1.5)  # the watcher wakes up and reads again
    print("left", f.read(), flush=True)
"""


def test_a_watcher_still_printing_when_the_block_ends_reads_no_other_file():
    """Leaving StopSignals closed the pipe's read end after giving up on the watcher; the next file opened took its
    number and the watcher read it: its bytes were gone, and a byte 2 (SIGINT) aborted the process at once."""
    proc = subprocess.run([sys.executable, "-c", LATE_WATCHER], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout.strip()) == (0, "left b'\\x02\\x02\\x02\\x02payload'"), proc.stderr[-2000:]
