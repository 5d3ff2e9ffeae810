"""tests/forkserver.py: a forked run is its own process as a new `python` would be (pid, argv, cwd, environment,
stdout / stderr, exit status, a signal's status), and a command whose environment changes what a library reads
at import starts as a new `python` instead."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import forkserver  # tests/forkserver.py

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "rank", os.environ.get("RANK"), "parent", os.getppid())
    print("main", __name__, "path0", sys.path[0], file=sys.stderr)
    if sys.argv[1] == "sleep":
        time.sleep(60)
    sys.exit(int(sys.argv[1]))
    """
)


def test_a_forked_run_is_its_own_process(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    env = dict(forkserver.BASE_ENV, RANK="1")  # a per-rank variable: still forked
    proc = forkserver.run([sys.executable, "-u", str(script), "3"], env, tmp_path, 120)
    assert proc.returncode == 3, proc.stderr
    # forked by the server (a new `python` would be this process's child)
    assert proc.stdout.split() == [
        "argv",
        "['3']",
        "cwd",
        str(tmp_path),
        "rank",
        "1",
        "parent",
        str(forkserver._server["proc"].pid),
    ]
    assert proc.stderr.split() == ["main", "__main__", "path0", str(tmp_path)]
    # a module, as `python -m`: sys.path[0] is the working directory
    proc = forkserver.run(
        [sys.executable, "-m", "glm_grpo_ds", "--version"], env, forkserver.BASE_ENV["PYTHONPATH"], 60
    )
    assert proc.returncode == 0 and proc.stdout.startswith("glm-grpo-ds "), proc.stderr
    # signals reach it and its status is the signal's, as subprocess.Popen reports it
    with (tmp_path / "out").open("w+") as out:
        forked = forkserver.popen([sys.executable, str(script), "sleep"], env, tmp_path, out, out)
        assert isinstance(forked, forkserver.Forked) and forked.poll() is None
        forked.terminate()
        assert forked.wait(30) == -signal.SIGTERM


def test_a_signal_to_a_run_that_ended_unreported_is_no_error(tmp_path):
    """The race a 2-rank stop met (spawn_ranks stopping the other rank): the server reaped the run, its status not
    yet read; terminate() then passes, as subprocess.Popen's does, and the status is the run's own."""
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    with (tmp_path / "out").open("w+") as out:
        forked = forkserver.popen([sys.executable, str(script), "3"], forkserver.BASE_ENV, tmp_path, out, out)
        deadline = time.monotonic() + 60
        while _alive(forked.pid):  # reaped by the server (a zombie still takes signals)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert forked.returncode is None  # unread: the window the race fell in
        forked.terminate()
        assert forked.wait(30) == 3


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_environment_read_at_import_starts_a_new_python(tmp_path):
    env = dict(forkserver.BASE_ENV, HF_ENDPOINT="http://127.0.0.1:9")
    with (tmp_path / "out").open("w+") as out:
        proc = forkserver.popen([sys.executable, "-c", "pass"], env, tmp_path, out, out)  # -c: never forked
        assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 0
        proc = forkserver.popen([sys.executable, "-m", "glm_grpo_ds", "--version"], env, tmp_path, out, out)
        assert isinstance(proc, subprocess.Popen) and proc.wait(120) == 0
