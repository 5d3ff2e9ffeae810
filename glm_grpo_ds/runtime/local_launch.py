"""The command line of a one-node ``deepspeed --num_gpus N`` launch started from Python (the benchmark workers,
the sweeps, the test launches): one spelling of where the launcher is and what its ranks' environment needs.

    cmd, env = deepspeed_command(2, ["--module", "glm_grpo_ds.train", "--config", "run.yaml"], cpu=True)
    subprocess.run(cmd, env=env)
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from .ports import free_port


def deepspeed_command(nprocs: int, args: list[str], cpu: bool, port: int | None = None) -> tuple[list[str], dict]:
    """(command, environment): the launcher beside this interpreter (a virtual environment's bin/ need not be on
    PATH), a free rendezvous port unless ``port`` (the launcher's default 29500 may be another job's), the Hub
    offline, and ``cpu``: CPU ranks (``DS_ACCELERATOR=cpu``, said explicitly rather than left to detection)."""
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"
    port = free_port() if port is None else port
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if cpu:
        env["DS_ACCELERATOR"] = "cpu"
    return [launcher, "--num_gpus", str(nprocs), "--master_port", str(port), *args], env
