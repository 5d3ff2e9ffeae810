"""glm_grpo_ds/runtime/hostfile.py: DeepSpeed's hostfile read as its launcher reads it (checked against
deepspeed.launcher.runner._parse_hostfile itself), and each thing the launcher would refuse, or run on this node
only, as one line naming the file, the line and the fix; `python -m glm_grpo_ds.runtime.hostfile` prints the
summary launch/train_multinode.sh reads, or that line with exit 2."""

import subprocess
import sys
from pathlib import Path

import pytest

from glm_grpo_ds.runtime.hostfile import HostfileError, main, read_hostfile, summary

ROOT = Path(__file__).resolve().parents[2]

GOOD = {
    "two nodes": ("node-0 slots=8\nnode-1 slots=8\n", [("node-0", 8), ("node-1", 8)]),
    "comments, blanks, tabs, CRLF, no final newline": (
        "# the cluster\n\n  node-0\tslots=8  \r\n   # node-9 slots=8\nnode-1 slots=4",
        [("node-0", 8), ("node-1", 4)],
    ),
    # DeepSpeed's re.search("^(\S+)\s+slots=(\d+)") ignores what follows the count
    "text after the count": ("10.0.0.1 slots=8 # rack 3\n10.0.0.2 slots=2,extra\n", [("10.0.0.1", 8), ("10.0.0.2", 2)]),
    "the loopback twice (tests/integration/test_multinode.py)": (
        "127.0.0.1 slots=1\nlocalhost slots=1\n",
        [("127.0.0.1", 1), ("localhost", 1)],
    ),
}


@pytest.mark.parametrize("text, hosts", GOOD.values(), ids=GOOD.keys())
def test_a_good_hostfile_reads_as_deepspeeds_launcher_reads_it(tmp_path, text, hosts):
    from deepspeed.launcher.runner import _parse_hostfile

    path = tmp_path / "hostfile"
    path.write_bytes(text.encode())
    assert read_hostfile(path) == hosts
    with open(path) as fd:  # what runner.fetch_hostfile hands _parse_hostfile
        assert list(_parse_hostfile(fd.readlines()).items()) == hosts


BAD = {
    "empty": ("", "hostfile {p}: no host in it (empty, or only comments and blank lines); add one line per node"),
    "comments only": (
        "# node-0 slots=8\n\n   \n",
        "hostfile {p}: no host in it (empty, or only comments and blank lines); add one line per node",
    ),
    "no slots": ("node-0 slots=8\nnode-1\n", "hostfile {p} line 2: expected 'HOST slots=N', e.g. 'node-0 slots=8'"),
    "slots with spaces": ("node-0 slots = 8\n", "hostfile {p} line 1: expected 'HOST slots=N', e.g. 'node-0 slots=8'"),
    "slots first": ("\nslots=8 node-0\n", "hostfile {p} line 2: expected 'HOST slots=N'"),
    "a duplicate host": (
        "node-0 slots=8\n# spare\nnode-0 slots=4\n",
        "hostfile {p} line 3: node-0 is listed again (first on line 1); one line per node, with all its GPUs in "
        "slots=N",
    ),
}


@pytest.mark.parametrize("text, line", BAD.values(), ids=BAD.keys())
def test_each_hostfile_deepspeed_refuses_is_one_line_naming_the_file_and_the_fix(tmp_path, text, line):
    from deepspeed.launcher.runner import _parse_hostfile

    path = tmp_path / "hostfile"
    path.write_text(text)
    with pytest.raises(HostfileError) as e:
        read_hostfile(path)
    message = str(e.value)
    assert message.startswith(line.format(p=path)) and "\n" not in message
    with pytest.raises(ValueError):  # the launcher refuses it too (with a 15-line traceback)
        _parse_hostfile(text.splitlines(keepends=True))


def test_a_bad_line_is_quoted_and_slots_0_is_refused_though_deepspeed_takes_it(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("node-0 slots=8\nnode-1 gpus=8\n")
    with pytest.raises(HostfileError, match=r"line 2: expected 'HOST slots=N', e.g. .*; got: node-1 gpus=8$"):
        read_hostfile(path)
    path.write_text("node-0 slots=8\nnode-1 slots=0\n")
    with pytest.raises(HostfileError) as e:
        read_hostfile(path)
    assert str(e.value) == (
        f"hostfile {path} line 2: node-1 has slots=0 (no GPU, no rank); give its number of GPUs (e.g. slots=8) "
        "or remove the line"
    )


def test_a_missing_hostfile_is_an_error_not_deepspeeds_run_on_this_node_only(tmp_path):
    with pytest.raises(HostfileError) as e:
        read_hostfile(tmp_path / "hostfile")
    assert str(e.value).startswith(
        f"hostfile {tmp_path / 'hostfile'}: no such file (the deepspeed launcher would run on this node only); "
        "write one line per node, e.g. 'node-0 slots=8'"
    )
    with pytest.raises(HostfileError, match="not a file"):
        read_hostfile(tmp_path)
    (tmp_path / "binary").write_bytes(b"node-0 slots=8\n\xff\xfe\n")
    with pytest.raises(HostfileError, match="not UTF-8 text"):
        read_hostfile(tmp_path / "binary")


def test_the_summary_counts_nodes_and_slots():
    assert summary([("a", 8), ("b", 8)]) == "2 nodes, 16 slots"
    assert summary([("a", 1)]) == "1 node, 1 slot"


def test_the_command_prints_the_summary_or_one_line_with_exit_2(tmp_path, capsys):
    path = tmp_path / "hostfile"
    path.write_text((ROOT / "launch/hostfile.example").read_text())
    assert main([str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == "2 nodes, 16 slots\n" and err == ""

    path.write_text("# nothing yet\n")
    assert main([str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"glm-grpo hostfile: hostfile {path}: no host in it") and err.count("\n") == 1

    assert main([]) == 2 and capsys.readouterr().err.startswith("glm-grpo hostfile: usage: ")
    assert main(["--help"]) == 0 and "usage: python -m glm_grpo_ds.runtime.hostfile" in capsys.readouterr().out


def test_the_module_runs_as_a_script_without_torch(tmp_path):
    """The launch scripts call it on every node before the launcher: it must not import torch (seconds)."""
    path = tmp_path / "hostfile"
    path.write_text("node-0 slots=8\nnode-0 slots=8\n")
    code = (
        "import sys, runpy; sys.argv = ['hostfile', sys.argv[1]]\n"
        "try:\n    runpy.run_module('glm_grpo_ds.runtime.hostfile', run_name='__main__')\n"
        "except SystemExit as e:\n    assert 'torch' not in sys.modules, 'imports torch'; raise"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"glm-grpo hostfile: hostfile {path} line 2: node-0 is listed again (first on line 1); " + (
        "one line per node, with all its GPUs in slots=N\n"
    )


def test_num_gpus_beyond_a_nodes_slots_fails_the_check_as_deepspeeds_launcher_would_start_them(tmp_path):
    """deepspeed --num_gpus N with a hostfile starts N ranks on every node (runner.apply_num_nodes_and_gpus), whatever
    its slots: --num-gpus 8 on two slots=4 nodes was planned as 16 ranks, "ok". Now a FAIL naming the node and the
    fix; fewer than the slots is a note (the launcher takes that many of each node's)."""
    from glm_grpo_ds.preflight import Report, cluster_shape

    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-0 slots=4\nnode-1 slots=2\n")
    report = Report()
    cluster_shape(8, None, str(hostfile), None, report)
    assert [kind for kind, _ in report.lines] == ["FAIL", "ok"] and report.lines[0][1] == (
        f"--num-gpus 8 but hostfile {hostfile} gives node-1 slots=2: the launcher would start 8 ranks there; give "
        "--num-gpus 2 or leave it out (the slots decide)"
    )
    report = Report()
    est = cluster_shape(2, None, str(hostfile), None, report)
    assert report.lines[0] == ("note", f"--num-gpus 2: 2 of each node's slots in hostfile {hostfile}")
    assert report.failed == 0 and (est.num_gpus, est.num_nodes) == (2, 2)
    report = Report()
    est = cluster_shape(None, None, str(hostfile), None, report)
    assert report.failed == 0 and est.ranks == 6  # the slots decide: 4 + 2
