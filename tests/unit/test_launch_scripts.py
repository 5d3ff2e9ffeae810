"""The launch scripts' environment, with fakes of what this machine lacks on PATH (``deepspeed``, which
records its arguments and environment; ``nvidia-smi``; SLURM's ``srun`` and ``scontrol``):

* launch/train.sh honours CUDA_VISIBLE_DEVICES (``--include localhost:IDS``, never ``--num_gpus``,
  which the launcher would turn into GPUs 0..N-1), refuses GPUs torch cannot use, and runs a node
  without GPUs as one CPU rank, saying so;
* launch/env.sh exports `.deepspeed_env` as DeepSpeed's ssh path would, and launch/slurm.sbatch hands
  it to the srun tasks (the real launcher on a rank: tests/integration/test_multinode.py)."""

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fake_gpu import FAKE_SMI  # noqa: E402  (tests/unit/fake_gpu.py)

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(sys.executable).parent)

FAKE_DEEPSPEED = """#!/bin/sh
printf '%s\\n' "$@" > "$RECORD/argv"
env > "$RECORD/env"
"""
FAKE_SRUN = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done  # srun's options; then the command, run here as one task
exec "$@"
"""


def fakes(tmp_path: Path, *names: str) -> Path:
    scripts = {
        "deepspeed": FAKE_DEEPSPEED,
        "nvidia-smi": FAKE_SMI,
        "srun": FAKE_SRUN,
        "scontrol": "#!/bin/sh\necho n1\n",
    }
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        (bin_dir / name).write_text(scripts[name])
        (bin_dir / name).chmod(0o755)
    return bin_dir


def run(
    script: str, tmp_path: Path, fake: tuple[str, ...], _args: tuple[str, ...] = (), **env: str
) -> tuple[subprocess.CompletedProcess, dict]:
    """``bash SCRIPT`` in the repository with the fakes first on PATH and HOME in tmp_path; returns the
    process and what the fake deepspeed recorded (argv, env)."""
    base = {k: v for k, v in os.environ.items() if k not in ("DS_ACCELERATOR", "CUDA_VISIBLE_DEVICES", "NUM_GPUS")}
    base.update(
        PATH=f"{fakes(tmp_path, 'deepspeed', *fake)}:{VENV_BIN}:/usr/bin:/bin",
        PYTHONPATH=str(ROOT),
        HOME=str(tmp_path),
        RECORD=str(tmp_path),
    )
    proc = subprocess.run(
        ["bash", script, *_args], cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120
    )
    seen = {}
    if (tmp_path / "argv").exists():
        seen["argv"] = (tmp_path / "argv").read_text().splitlines()
        seen["env"] = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    return proc, seen


@pytest.mark.parametrize(
    "visible, num_gpus, include",
    [("4,5", None, "localhost:4,5"), ("4,5", "1", "localhost:4"), ("3", None, "localhost:3")],
)
def test_train_sh_gives_the_ranks_the_gpus_of_cuda_visible_devices(tmp_path, visible, num_gpus, include):
    extra = {"NUM_GPUS": num_gpus} if num_gpus else {}
    proc, seen = run("launch/train.sh", tmp_path, (), DS_ACCELERATOR="cuda", CUDA_VISIBLE_DEVICES=visible, **extra)
    assert proc.returncode == 0, proc.stderr
    argv = seen["argv"]
    assert argv[argv.index("--include") + 1] == include and "--num_gpus" not in argv
    # unset for the launcher, which counts the node's GPUs to check the ids and then sets it per rank
    assert "CUDA_VISIBLE_DEVICES" not in seen["env"]


@pytest.mark.parametrize(
    "visible, num_gpus, message",
    [
        ("4,5", "3", "NUM_GPUS=3 but CUDA_VISIBLE_DEVICES=4,5 gives 2 GPU(s): ask for at most 2"),
        ("GPU-1a2b,GPU-3c4d", None, "the deepspeed launcher takes GPU indices (0,1,...), not 'GPU-1a2b'"),
    ],
)
def test_train_sh_refuses_what_cuda_visible_devices_cannot_give(tmp_path, visible, num_gpus, message):
    extra = {"NUM_GPUS": num_gpus} if num_gpus else {}
    proc, seen = run("launch/train.sh", tmp_path, (), DS_ACCELERATOR="cuda", CUDA_VISIBLE_DEVICES=visible, **extra)
    assert proc.returncode == 2 and not seen
    assert proc.stderr.startswith("glm-grpo launch/train.sh: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_train_sh_refuses_gpus_torch_cannot_use_and_runs_a_gpu_less_node_on_one_cpu_rank(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch can use CUDA here: nothing to refuse")
    proc, seen = run("launch/train.sh", tmp_path, ("nvidia-smi",), NUM_GPUS="8")
    assert proc.returncode == 2 and not seen, proc.stderr
    assert proc.stderr.startswith("glm-grpo: NUM_GPUS=8: this node has 1 NVIDIA GPU(s) (NVIDIA H100 80GB HBM3), but")
    assert len(proc.stderr.strip().splitlines()) == 1 and "DS_ACCELERATOR=cpu" in proc.stderr

    no_gpu = tmp_path / "no_gpu"  # no nvidia-smi on PATH
    no_gpu.mkdir()
    proc, seen = run("launch/train.sh", no_gpu, ())
    assert proc.returncode == 0, proc.stderr
    assert "glm-grpo launch/train.sh: no NVIDIA GPU on this node: 1 CPU rank (DS_ACCELERATOR=cpu)" in proc.stderr
    assert seen["env"]["DS_ACCELERATOR"] == "cpu" and seen["argv"][:2] == ["--num_gpus", "1"]


DEEPSPEED_ENV = """# NCCL on this cluster
NCCL_SOCKET_IFNAME=eth0

  HF_HOME = "/shared/hf cache"
MARKER=from-the-file
URL=http://host/?a=b
"""


def test_deepspeed_env_is_exported_home_first_then_the_working_directory(tmp_path):
    (tmp_path / ".deepspeed_env").write_text("MARKER=home\nONLY_HOME=1\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / ".deepspeed_env").write_text(DEEPSPEED_ENV)
    code = f"source {ROOT}/launch/env.sh; export_deepspeed_env; env"
    env = dict(os.environ, HOME=str(tmp_path), MARKER="already-set", DS_ENV_FILE=".deepspeed_env")
    proc = subprocess.run(["bash", "-euc", code], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert got["MARKER"] == "from-the-file"  # the file wins over the environment, as on DeepSpeed's ssh path
    assert got["ONLY_HOME"] == "1" and got["NCCL_SOCKET_IFNAME"] == "eth0"
    assert got["HF_HOME"] == "/shared/hf cache" and got["URL"] == "http://host/?a=b"
    assert "glm-grpo: exported from ./.deepspeed_env: NCCL_SOCKET_IFNAME HF_HOME MARKER URL" in proc.stderr
    assert "from-the-file" not in proc.stderr  # names only: a value may be a token

    (work / ".deepspeed_env").write_text("NCCL_DEBUG=WARN\nexport NCCL_DEBUG WARN\n")
    proc = subprocess.run(["bash", "-euc", code], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "glm-grpo: ./.deepspeed_env line 2: expected VAR=value, got: export NCCL_DEBUG WARN"
    )


def test_slurm_job_hands_deepspeed_env_to_the_srun_tasks(tmp_path):
    """sbatch's batch shell exports `$HOME/.deepspeed_env`; srun (here a fake that runs its command as
    the one task) starts `deepspeed --no_ssh` with it in the environment."""
    (tmp_path / ".deepspeed_env").write_text("MARKER=reached-the-task\n")
    slurm = dict(SLURM_JOB_NODELIST="n1", SLURM_JOB_ID="7", SLURM_NODEID="0", SLURM_JOB_NUM_NODES="1")
    proc, seen = run(
        "launch/slurm.sbatch", tmp_path, ("srun", "scontrol"), HOSTFILE=str(tmp_path / "hostfile"), **slurm
    )
    assert proc.returncode == 0, proc.stderr
    assert "--no_ssh" in seen["argv"] and seen["env"]["MARKER"] == "reached-the-task"
    assert seen["env"]["SLURM_EXPORT_ENV"] == "ALL"


def test_gpu_check_refuses_a_bad_num_gpus(tmp_path):
    proc, seen = run("launch/gpu_check.sh", tmp_path, (), _args=("--num-gpus", "two", "model"))
    assert proc.returncode == 2 and not seen
    assert proc.stderr.startswith("glm-grpo launch/gpu_check.sh: --num-gpus takes a positive number; usage: ")


@pytest.mark.parametrize(
    "env, line",
    [
        ({"ROWS": "16,many"}, "gpu_timing.sh: ROWS=16,many: many is not a number of rows; give e.g. ROWS=16,64"),
        ({"MERGE_DRIFT_STEPS": "fifty"}, "gpu_timing.sh: MERGE_DRIFT_STEPS=fifty is not a number of steps; give e.g."),
        ({"ONE_STEP_OFF": "yes"}, "gpu_timing.sh: ONE_STEP_OFF=yes: give 0 (serial steps), 1 (one step off) or both"),
    ],
)
def test_gpu_timing_refuses_a_bad_setting_before_it_runs_or_writes_anything(tmp_path, env, line):
    out = tmp_path / "out"
    proc, seen = run("launch/gpu_timing.sh", tmp_path, (), OUT=str(out), **env)
    assert proc.returncode == 2 and proc.stderr.startswith(line) and len(proc.stderr.splitlines()) == 1
    assert not out.exists() and not seen


def test_the_rendezvous_port_is_the_preferred_one_unless_it_is_taken():
    from glm_grpo_ds.runtime.ports import is_free, rendezvous_port

    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        taken = held.getsockname()[1]
        assert not is_free(taken)
        other = rendezvous_port(taken)
        assert other != taken and is_free(other)
    assert rendezvous_port(taken) == taken  # given back


def test_a_free_port_lies_below_the_ephemeral_range_where_no_outgoing_connection_can_take_it():
    """CI lost a bench run to EADDRINUSE: free_port() handed out an ephemeral port (bind(0)) that another test's
    gloo connection took before the launcher's rank 0 listened on it."""
    from glm_grpo_ds.runtime.ports import ephemeral_range, free_port, is_free

    lo, hi = ephemeral_range()
    assert 1024 < lo < hi
    ports = {free_port() for _ in range(50)}
    assert all(20000 <= p < lo and is_free(p) for p in ports), sorted(ports)
    assert len(ports) > 40  # drawn at random, not one fixed port that two concurrent launches would share


def test_train_sh_moves_off_a_taken_29500_and_keeps_a_given_master_port(tmp_path):
    """A second run on a shared node (other GPUs of CUDA_VISIBLE_DEVICES) found 29500 held by the first and died at
    its first collective (torch's EADDRINUSE); now it rendezvous on a free port and says so in one line."""
    with socket.socket() as held:
        with contextlib.suppress(OSError):  # already held by something else: the same case
            held.bind(("", 29500))
            held.listen()
        proc, seen = run("launch/train.sh", tmp_path, (), DS_ACCELERATOR="cpu")
    assert proc.returncode == 0, proc.stderr
    port = seen["argv"][seen["argv"].index("--master_port") + 1]
    assert port != "29500"
    assert f"launch/train.sh: port 29500 is taken (another run on this node?): rendezvous on port {port}" in proc.stderr
    given = tmp_path / "given"
    given.mkdir()
    proc, seen = run("launch/train.sh", given, (), DS_ACCELERATOR="cpu", MASTER_PORT="31234")
    assert seen["argv"][seen["argv"].index("--master_port") + 1] == "31234" and "rendezvous" not in proc.stderr
