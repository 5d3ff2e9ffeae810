"""What the integration tests share to start training processes: paths, the tiny config and its quickest
step (FAST), `deepspeed --num_gpus N` CPU launches (launch / launch_cmd), the trainer's command line
(train_args for the launcher, train_cmd / run_train for one process), its key=value arguments for the tiny
model (common) and 2-rank runs of tests/integration/ds_worker.py (worker). One-process runs (run_train) and the
ranks of launcher-less launches (spawn_ranks) are forked from a parent that imported the libraries once
(tests/forkserver.py: each is still its own process; GLM_GRPO_TESTS_FRESH=1 starts every one as a new `python`).

    from launching import CONFIG, FAST, ROOT, common, launch, run_train   # a test module in tests/integration/
    proc = run_train(*common(tiny_model_dir, data64, tmp_path / "run", "max_steps=1", *FAST))
    launch(2, train_args(*common(...), ds_config="zero3.json"))
"""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import forkserver  # tests/forkserver.py: runs forked from a parent that imported the libraries once
import pytest
import torch

from glm_grpo_ds.runtime.local_launch import deepspeed_command
from glm_grpo_ds.runtime.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "integration" / "ds_worker.py"
CONFIG = ROOT / "launch" / "configs" / "tiny_cpu.yaml"
ENV = forkserver.BASE_ENV  # a one-process CPU run: PYTHONPATH, offline, the CPU accelerator (tests/forkserver.py)
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


def launch_cmd(nprocs: int, args: list[str]) -> tuple[list[str], dict, int]:
    """(command, environment, master port) of a `deepspeed --num_gpus N` CPU run."""
    port = free_port()
    cmd, env = deepspeed_command(nprocs, args, cpu=True, port=port)
    return cmd, dict(env, PYTHONPATH=str(ROOT)), port


def spawn_ranks(nprocs: int, args: list[str], timeout: int) -> tuple[subprocess.CompletedProcess, int]:
    """(the run, its master port): the ranks ``deepspeed --num_gpus N ARGS`` starts on a CPU node, started here
    without the launcher's two Python processes (~7 s of a 2-core machine per run): the environment the
    launcher gives each rank (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, MASTER_ADDR / PORT, CROSS_RANK / SIZE,
    CUDA_VISIBLE_DEVICES) and its ``--local_rank=N`` argument, both ranks' output on one stdout and one stderr,
    and, as the launcher does, the other ranks stopped when one fails (its status is the run's). The tests of
    the launcher itself (a bad input or SIGTERM under it, hostfiles, launch/*.sh) start the real one."""
    # ENV as the test modules were collected, not os.environ now: libraries a test ran in this process add
    # variables to it (cv2's QT_*, torch's inductor and profiler settings), and a run whose environment differs
    # from the fork server's starts as a new `python` (tests/forkserver.py)
    env, port = dict(ENV), free_port()
    module = args[0] == "--module"
    script, rest = (["-m", args[1]], args[2:]) if module else ([args[0]], args[1:])
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nprocs), LOCAL_SIZE=str(nprocs))
    env.update(CROSS_RANK="0", CROSS_SIZE="1", CUDA_VISIBLE_DEVICES=",".join(map(str, range(nprocs))))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        ranks = [
            forkserver.popen(
                [sys.executable, "-u", *script, f"--local_rank={r}", *rest],
                dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                ROOT,
                out,
                err,
            )
            for r in range(nprocs)
        ]
        deadline, status = time.monotonic() + timeout, 0
        try:
            while any(p.poll() is None for p in ranks):
                failed = [p.returncode for p in ranks if p.returncode]
                if failed and not status:  # the launcher's reaction: stop the others (else they wait in a collective)
                    status = failed[0]
                    for p in ranks:
                        if p.poll() is None:
                            p.terminate()
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(args, timeout)
                time.sleep(0.05)
        finally:
            for p in ranks:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        status = status or next((p.returncode for p in ranks if p.returncode), 0)  # failed before a poll saw it
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(args, status, out.read(), err.read()), port


def launch(
    nprocs: int, args: list[str], timeout: int = 600, check: bool = True, launcher: bool = True
) -> subprocess.CompletedProcess:
    """``deepspeed --num_gpus N ARGS`` on CPU ranks; ``launcher=False``: the same ranks started by
    :func:`spawn_ranks` (for the tests of what the ranks compute, not of the launcher)."""
    if launcher:
        cmd, env, port = launch_cmd(nprocs, args)
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    else:
        proc, port = spawn_ranks(nprocs, args, timeout)
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
    """A tests/integration/ds_worker.py SCENARIO on ``nprocs`` CPU ranks (started by :func:`spawn_ranks`); rank
    0's result.pt. ``ds_config``: a file name in ds_configs/ or a path."""
    launch(
        nprocs,
        [
            str(WORKER),
            scenario,
            str(out),
            "--deepspeed",
            ds_config if "/" in str(ds_config) else f"ds_configs/{ds_config}",
            "--config",
            str(CONFIG),
            *extra,
            *overrides,
        ],
        launcher=False,
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
    captured as text; forked from tests/forkserver.py's parent unless ``env`` changes what a library reads at
    import."""
    return run_cmd(train_cmd(*overrides, **kwargs), env, timeout)


def run_cmd(cmd: list, env=None, timeout: int = 600) -> subprocess.CompletedProcess:
    """A ``python ...`` command run from the checkout with ``env`` (default ENV), output captured as text; forked
    from tests/forkserver.py's parent unless ``env`` changes what a library reads at import."""
    return forkserver.run([str(c) for c in cmd], ENV if env is None else env, ROOT, timeout)
