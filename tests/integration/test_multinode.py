"""Launching: every script parses, the example configs validate, and a real two-"node" job runs on
loopback (two deepspeed launchers with --no_ssh --node_rank 0|1, one CPU rank each)."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_trainer_deepspeed import CONFIG, ROOT, WORKER, _port, common  # noqa: E402  (same directory)

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


def test_two_nodes_on_loopback_end_with_the_same_weights(tiny_model_dir, tmp_path):
    from glm_grpo_ds.config import DecoderConfig
    from glm_grpo_ds.testing.tiny_data import write_tiny_dataset

    data = write_tiny_dataset(tiny_model_dir, tmp_path / "data", 64, 64, DecoderConfig(num_inference_steps=2))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=1\nlocalhost slots=1\n")  # two names for this machine = two nodes
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    out = tmp_path / "w"
    port = str(_port())
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
    assert "world size 2 (2 node(s)), ZeRO stage 3" in node0
    a = torch.load(out / "trainable_rank0.pt", weights_only=True)
    b = torch.load(out / "trainable_rank1.pt", weights_only=True)
    result = torch.load(out / "result.pt", weights_only=False)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(result["trainable_before"][k], a[k]) for k in a)  # it did train
