"""Launching: every script parses, the example configs validate, and a real two-"node" job runs on
loopback (two deepspeed launchers with --no_ssh --node_rank 0|1, one CPU rank each)."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from launching import CONFIG, FAST, ROOT, WORKER, common, free_port  # noqa: E402  (tests/integration/launching.py)

SCRIPTS = sorted((ROOT / "launch").glob("*.sh")) + [ROOT / "launch" / "slurm.sbatch"]

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # two launcher 'nodes' on loopback


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("config", sorted((ROOT / "launch" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_validate(config):
    from glm_grpo_ds.config import load_config

    load_config(str(config))


def test_merge_script_usage():
    proc = subprocess.run(["bash", str(ROOT / "launch" / "merge.sh")], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_two_nodes_on_loopback_end_with_the_same_weights(tiny_model_dir, data64, tmp_path):
    data = data64
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=1\nlocalhost slots=1\n")  # two names for this machine = two nodes
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    out = tmp_path / "w"
    port = str(free_port())
    overrides = common(
        tiny_model_dir,
        data,
        tmp_path / "run",
        "max_steps=2",
        "rollout.height=64",
        "rollout.width=64",
        "logging.progress_bar=false",
    )
    procs, logs = [], []
    try:
        for node_rank in (0, 1):
            log = open(tmp_path / f"node{node_rank}.log", "w")
            logs.append(log)
            cmd = [
                launcher,
                "--hostfile",
                str(hostfile),
                "--no_ssh",
                "--num_nodes",
                "2",
                "--node_rank",
                str(node_rank),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                port,
                str(WORKER),
                "train",
                str(out),
                "--deepspeed",
                "ds_configs/zero3.json",
                "--config",
                str(CONFIG),
                *overrides,
            ]
            procs.append(
                subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:  # bounded: never leave launchers or ranks behind
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in logs:
            log.close()
    node0 = (tmp_path / "node0.log").read_text()
    assert codes == [0, 0], node0[-3000:] + (tmp_path / "node1.log").read_text()[-3000:]
    assert "world size 2 (2 node(s), CPU ranks, gloo), ZeRO stage 3" in node0
    a = torch.load(out / "trainable_rank0.pt", weights_only=True)
    b = torch.load(out / "trainable_rank1.pt", weights_only=True)
    result = torch.load(out / "result.pt", weights_only=False)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(result["trainable_before"][k], a[k]) for k in a)  # it did train


def two_nodes_in_own_dirs(tmp_path, overrides, timeout=420):
    """Two loopback "nodes" (deepspeed --no_ssh --node_rank 0|1, one CPU rank each) running the trainer, each
    launcher started in its own working directory ``tmp_path/node<r>``: a relative ``output_dir`` is then
    storage that only one node sees, like a node-local disk. Returns the exit codes (None: still running at
    ``timeout``, then killed - a hang) and each node's console output. The checks end ~20 s after the start;
    the timeout also covers a wait for DeepSpeed's CPU op being (re)built by another process on this
    machine (up to 2 minutes seen with other test runs in parallel)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=1\nlocalhost slots=1\n")
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    env["PYTHONFAULTHANDLER"] = "1"  # a hang killed at the timeout leaves every process's Python stack in its log
    port = str(free_port())
    procs, logs = [], []
    try:
        for node_rank in (0, 1):
            cwd = tmp_path / f"node{node_rank}"
            cwd.mkdir(exist_ok=True)
            logs.append(open(tmp_path / f"node{node_rank}.log", "w"))
            cmd = [
                launcher,
                *("--hostfile", str(hostfile), "--no_ssh", "--num_nodes", "2", "--node_rank", str(node_rank)),
                *("--master_addr", "127.0.0.1", "--master_port", port),
                *("--module", "glm_grpo_ds.train", "--config", str(CONFIG)),
                *("--deepspeed", str(ROOT / "ds_configs" / "zero3.json"), *overrides),
            ]
            procs.append(
                subprocess.Popen(
                    cmd, cwd=cwd, env=env, stdout=logs[-1], stderr=subprocess.STDOUT, start_new_session=True
                )
            )
        deadline, codes = time.monotonic() + timeout, []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        hung = [p for p in procs if p.poll() is None]
        for p in hung:  # SIGABRT first: faulthandler writes where each process of the group waits
            os.killpg(p.pid, signal.SIGABRT)
        if hung:
            time.sleep(3)
        for p in hung:  # bounded: never leave launchers or ranks behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for log in logs:
            log.close()
    return codes, [(tmp_path / f"node{r}.log").read_text() for r in (0, 1)]


SHARED_FIX = "output_dir must be on storage every node mounts (NFS, Lustre, GPFS, ...; on SLURM the submit directory"


def test_node_local_output_dir_is_refused_at_startup_on_every_node(tiny_model_dir, data64, tmp_path):
    # a relative output_dir in each launcher's own directory: two disks that do not share files
    overrides = common(tiny_model_dir, data64, "run", "max_steps=2", "save_steps=1", *FAST)
    codes, logs = two_nodes_in_own_dirs(tmp_path, overrides)
    assert codes == [2, 2], "\n".join(log[-3000:] for log in logs)  # every rank stops, none hangs
    errors = [line for line in logs[0].splitlines() if "glm-grpo train:" in line]  # rank 0 prints it
    assert len(errors) == 1, logs[0][-3000:]
    assert "output_dir run is not the same storage on every node: rank 1 on " in errors[0], errors[0]
    assert SHARED_FIX in errors[0]
    assert "Traceback" not in logs[0] + logs[1]
    assert not list((tmp_path / "node0" / "run").glob(".shared_check*"))  # the token is removed
    assert not (tmp_path / "node0" / "run" / "checkpoints").exists()  # refused before any model loaded


def test_latest_seen_by_one_node_only_stops_with_what_each_rank_saw(tiny_model_dir, data64, tmp_path):
    ckpt = tmp_path / "node0" / "run" / "checkpoints" / "step_000002"
    (ckpt / "ds").mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 2, "world_size": 2, "zero_stage": 3}))
    (ckpt.parent / "latest").write_text(ckpt.name)
    overrides = common(tiny_model_dir, data64, "run", "max_steps=3", "resume_from=auto", *FAST)
    codes, logs = two_nodes_in_own_dirs(tmp_path, overrides)
    assert codes == [2, 2], "\n".join(log[-3000:] for log in logs)
    errors = [line for line in logs[0].splitlines() if "glm-grpo train:" in line]
    assert len(errors) == 1, logs[0][-3000:]
    assert "ranks disagree on run/checkpoints/latest: rank 0 on " in errors[0], errors[0]
    assert " sees step_000002, rank 1 on " in errors[0] and " sees nothing; " in errors[0]
    assert SHARED_FIX in errors[0]
    assert "Traceback" not in logs[0] + logs[1]
