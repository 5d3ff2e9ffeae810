"""runtime/process_exit.py: a process entry point's normal return runs every atexit handler, flushes its output
and exits with its code, skipping the interpreter's teardown; with a non-daemon thread still running it keeps the
normal shutdown (which waits for the thread)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """import atexit, sys, threading, time
from glm_grpo_ds.runtime import process_exit
atexit.register(lambda: print("handler ran", flush=False))  # unflushed on purpose: exit_now flushes
sys.stdout.write("buffered ")
if "thread" in sys.argv:
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished"))).start()
raise SystemExit(process_exit.exit_now(3))
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=ROOT)


def test_exit_now_runs_the_atexit_handlers_flushes_and_keeps_the_code():
    proc = _run()
    assert proc.returncode == 3 and proc.stdout == "buffered handler ran\n" and proc.stderr == ""


def test_a_running_non_daemon_thread_keeps_the_normal_shutdown():
    proc = _run("thread")
    assert proc.returncode == 3 and "thread finished" in proc.stdout and "handler ran" in proc.stdout


def test_the_entry_points_exit_through_it():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "glm-grpo"]
    assert script.value == "glm_grpo_ds.commands.cli:console_main"
    assert "raise SystemExit(process_exit.exit_now(main()))" in (ROOT / "glm_grpo_ds/train.py").read_text()
    # the profilers run as processes too, the bench's 2-rank workers among them: a gloo thread in the interpreter's
    # teardown aborted one ("terminate called without an active exception", -6) in CI on 2026-12-01
    for name in ("bench", "decode_counts", "decode_timing", "dit_timing"):
        assert (
            "raise SystemExit(process_exit.exit_now(main()))" in (ROOT / f"glm_grpo_ds/profiling/{name}.py").read_text()
        )
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "glm-grpo"), "--version"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0 and proc.stdout.startswith("glm-grpo-ds ")
