"""What the integration tests share to start training processes: paths, the tiny config and its quickest
step (FAST), `deepspeed --num_gpus N` CPU launches (launch / launch_cmd), the trainer's command line
(train_args for the launcher, train_cmd / run_train for one process), its key=value arguments for the tiny
model (common) and 2-rank runs of tests/integration/ds_worker.py (worker).

    from launching import CONFIG, FAST, ROOT, common, launch, run_train   # a test module in tests/integration/
    proc = run_train(*common(tiny_model_dir, data64, tmp_path / "run", "max_steps=1", *FAST))
    launch(2, train_args(*common(...), ds_config="zero3.json"))
"""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "integration" / "ds_worker.py"
CONFIG = ROOT / "launch" / "configs" / "tiny_cpu.yaml"
ENV = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", DS_ACCELERATOR="cpu")  # a one-process CPU run
# the quickest meaningful step of the tiny model (other test files add their own options)
FAST = [
    "rollout.height=64",
    "rollout.width=64",
    "grpo.group_size=4",
    "batch.micro_batch_size=4",
    "optimizer.name=adamw",
    "logging.progress_bar=false",
    "logging.plot=false",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_cmd(nprocs: int, args: list[str]) -> tuple[list[str], dict, int]:
    """(command, environment, master port) of a `deepspeed --num_gpus N` CPU run."""
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), DS_ACCELERATOR="cpu")
    port = free_port()
    return [launcher, "--num_gpus", str(nprocs), "--master_port", str(port)] + args, env, port


def launch(nprocs: int, args: list[str], timeout: int = 600, check: bool = True) -> subprocess.CompletedProcess:
    cmd, env, port = launch_cmd(nprocs, args)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
        pytest.fail(f"deepspeed run failed ({proc.returncode}):\n{tail}")
    # DeepSpeed's CPU all-reduce leaves a 64 MiB /dev/shm file per rank unless engine unlinks it.
    leaked = list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
    assert not leaked, f"shared-memory buffers left behind: {leaked}"
    return proc


def common(tiny_model_dir, tiny_data, out_dir, *extra):
    return [f"model.path={tiny_model_dir}", f"data.train_file={tiny_data}", f"output_dir={out_dir}", *extra]


def worker(nprocs, scenario, out, ds_config, overrides, extra=()):
    launch(
        nprocs,
        [
            str(WORKER),
            scenario,
            str(out),
            "--deepspeed",
            f"ds_configs/{ds_config}",
            "--config",
            str(CONFIG),
            *extra,
            *overrides,
        ],
    )
    return torch.load(out / "result.pt", weights_only=False)


def train_args(*overrides, ds_config: str = "zero2.json", config=CONFIG, flags=()) -> list[str]:
    """What the deepspeed launcher runs for a training run: ``--module glm_grpo_ds.train --config CONFIG
    --deepspeed ds_configs/DS_CONFIG [FLAGS] OVERRIDES`` (``ds_config``: a file name in ds_configs/ or a path)."""
    ds = ds_config if "/" in str(ds_config) else f"ds_configs/{ds_config}"
    return ["--module", "glm_grpo_ds.train", "--config", str(config), "--deepspeed", str(ds), *flags, *overrides]


def train_cmd(*overrides, **kwargs) -> list[str]:
    """One training process without the launcher: ``python -m glm_grpo_ds.train ...`` (:func:`train_args`)."""
    return [sys.executable, "-m", *train_args(*overrides, **kwargs)[1:]]


def run_train(*overrides, env=None, timeout: int = 600, **kwargs) -> subprocess.CompletedProcess:
    """:func:`train_cmd` run from the checkout with ``env`` (default ENV: one CPU process, offline), output
    captured as text."""
    cmd = train_cmd(*overrides, **kwargs)
    return subprocess.run(
        cmd, cwd=ROOT, env=ENV if env is None else env, capture_output=True, text=True, timeout=timeout
    )
