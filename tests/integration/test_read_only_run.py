"""`glm-grpo check-run` and `glm-grpo plot` on a run they may only read, or with a --out they cannot use: one line
each, the checks' verdict unchanged (found by an audit: a traceback, exit 1 like a failed check; a path printed
that named no file)."""

import shutil
import subprocess

import pytest
from in_process import glm_grpo  # noqa: E402  (tests/in_process.py)


def _read_only_copy(run, where):
    """``run`` copied onto a tmpfs then remounted read-only (root writes through file modes), or a skip."""
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here: a read-only run folder needs one")
    shutil.copytree(run, where / "run")
    if subprocess.run(["mount", "-o", "remount,ro", str(where)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(where)], check=False)
        pytest.skip("cannot remount a tmpfs read-only here")
    return where / "run"


def test_check_run_and_plot_on_a_read_only_run(short_run, tmp_path, capfd):
    ro = _read_only_copy(short_run, tmp_path / "ro")
    try:
        code, out, err = glm_grpo(["check-run", ro], capfd)
        assert code == 0 and err == "", err  # the checks passed: not drawing the curve again fails nothing
        assert out.splitlines()[-1].startswith("INFO  curves: not drawn again (Read-only file system: ")
        code, out, err = glm_grpo(["plot", ro], capfd)
        assert code == 2 and err.startswith("glm-grpo plot: cannot write the curves (Read-only file system: ")
        assert err.count("\n") == 1, err
    finally:
        subprocess.run(["umount", "-l", str(tmp_path / "ro")], check=False)


def test_plot_writes_where_its_line_says(short_run, tmp_path, capfd):
    code, out, _ = glm_grpo(["plot", short_run, "--out", tmp_path / "curves"], capfd)  # no suffix: .png added
    assert code == 0 and out.strip() == str(tmp_path / "curves.png") and (tmp_path / "curves.png").is_file()
    code, out, _ = glm_grpo(["plot", short_run, "--out", tmp_path], capfd)  # a folder: the curve in it
    assert code == 0 and out.strip() == str(tmp_path / "reward_curve.png") and (tmp_path / "reward_curve.png").is_file()
    code, _, err = glm_grpo(["plot", short_run, "--out", tmp_path / "no" / "c.png"], capfd)
    assert code == 2 and err.startswith("glm-grpo plot: cannot write the curves (No such file or directory: "), err
