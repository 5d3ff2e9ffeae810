"""The launch scripts' environment, with fakes of what this machine lacks on PATH (``deepspeed``, which
records its arguments and environment; ``nvidia-smi``; SLURM's ``srun`` and ``scontrol``):

* launch/train.sh honours CUDA_VISIBLE_DEVICES (``--include localhost:IDS``, never ``--num_gpus``,
  which the launcher would turn into GPUs 0..N-1), refuses GPUs torch cannot use, and runs a node
  without GPUs as one CPU rank, saying so;
* launch/env.sh exports `.deepspeed_env` as DeepSpeed's ssh path would, and launch/slurm.sbatch hands
  it to the srun tasks (the real launcher on a rank: tests/integration/test_multinode.py);
* every launch script answers --help / -h with its header and launches nothing; train.sh, train_multinode.sh and
  slurm.sbatch default to the LoRA config at ZeRO-2, and slurm.sbatch's --mem is the memory tool's figure for it;
* launch/train_multinode.sh refuses a bad hostfile, NUM_NODES or NODE_RANK in one line (exit 2);
* the preflight (`python -m glm_grpo_ds.train --check`) runs before the launcher and its failure is the script's
  exit status; PREFLIGHT=0 skips it. The tests marked NEEDS_CHECK need that flag (glm_grpo_ds/train.py)."""

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_gpu import FAKE_SMI  # noqa: E402  (tests/unit/fake_gpu.py)

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(sys.executable).parent)

FAKE_DEEPSPEED = """#!/bin/sh
printf '%s\\n' "$@" > "$RECORD/argv"
env > "$RECORD/env"
"""
# anything a --help must not start: it records that it ran
FAKE_RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "$RECORD/called"
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
        "python": FAKE_RECORDER,
        "glm-grpo": FAKE_RECORDER,
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
    process and what the fake deepspeed recorded (argv, env). PREFLIGHT=0 unless ``env`` sets it: the tests of
    what reaches the launcher need no valid config."""
    ours = ("DS_ACCELERATOR", "CUDA_VISIBLE_DEVICES", "NUM_GPUS", "CONFIG", "DS_CONFIG", "HOSTFILE", "MASTER_ADDR")
    ours += ("NUM_NODES", "NODE_RANK", "MASTER_PORT", "DS_ENV_FILE", "GPUS_PER_NODE", "JOB_HOSTFILE")
    base = {k: v for k, v in os.environ.items() if k not in ours}
    base.update(
        PATH=f"{fakes(tmp_path, 'deepspeed', *fake)}:{VENV_BIN}:/usr/bin:/bin",
        PYTHONPATH=str(ROOT),
        HOME=str(tmp_path),
        RECORD=str(tmp_path),
        PREFLIGHT="0",
        JOB_HOSTFILE=str(tmp_path / "job_hostfile"),  # slurm.sbatch's default is the working directory: the repo
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
        "launch/slurm.sbatch", tmp_path, ("srun", "scontrol"), JOB_HOSTFILE=str(tmp_path / "hostfile"), **slurm
    )
    assert proc.returncode == 0, proc.stderr
    assert "--no_ssh" in seen["argv"] and seen["env"]["MARKER"] == "reached-the-task"
    assert seen["env"]["SLURM_EXPORT_ENV"] == "ALL"


SLURM = dict(SLURM_JOB_NODELIST="n1", SLURM_JOB_ID="7", SLURM_NODEID="0", SLURM_JOB_NUM_NODES="1")
RECORDING_SRUN = """#!/bin/sh
echo "$*" >> "$RECORD/srun"
while [ "${1#-}" != "$1" ]; do shift; done
exec "$@"
"""


def test_slurm_gives_each_node_the_jobs_gpus_and_cpus(tmp_path):
    """The hostfile's slots are the allocation's GPUs per node (SLURM_GPUS_ON_NODE), not a fixed 8, and srun asks
    for the job's CPUs per task again (Slurm 22.05's srun does not inherit them); a GPUS_PER_NODE the job lacks is
    one line and exit 2, before anything starts."""
    bin_dir = fakes(tmp_path, "scontrol")
    (bin_dir / "srun").write_text(RECORDING_SRUN)
    (bin_dir / "srun").chmod(0o755)
    env = dict(SLURM, JOB_HOSTFILE=str(tmp_path / "hostfile"), SLURM_GPUS_ON_NODE="4", SLURM_CPUS_PER_TASK="32")
    (tmp_path / "mine").write_text("node-0 slots=8\nnode-1 slots=8\n")  # exported for train_multinode.sh
    proc, seen = run("launch/slurm.sbatch", tmp_path, (), HOSTFILE=str(tmp_path / "mine"), **env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "hostfile").read_text() == "n1 slots=4\n"
    assert (tmp_path / "mine").read_text() == "node-0 slots=8\nnode-1 slots=8\n"  # not the job's to overwrite
    # one launcher per node even where the job asked for more tasks (--ntasks-per-node=8: 8 launchers, one port)
    assert (
        "--kill-on-bad-exit=1 --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=32 bash -c"
        in (tmp_path / "srun").read_text()
    )
    (tmp_path / "argv").unlink()
    proc, seen = run("launch/slurm.sbatch", tmp_path, (), GPUS_PER_NODE="8", **env)
    assert proc.returncode == 2 and not seen, proc.stderr
    assert proc.stderr.splitlines() == [
        "glm-grpo launch/slurm.sbatch: GPUS_PER_NODE=8 but this job has 4 GPU(s) per node; unset GPUS_PER_NODE, or "
        "submit with --gpus-per-node=8"
    ]


# a rank as the batch shell's trap finds it (`glm_grpo_ds.train --local_rank=` in its command line, the job's id in its
# environment): it records the SIGTERM it gets and exits 143, as a rank does after its step and save
FAKE_RANK_DEEPSPEED = """#!/bin/sh
exec bash -c 'trap "echo TERM >> $RECORD/term; exit 143" TERM; touch $RECORD/rank_up; while :; do sleep 0.1; done' \\
  glm_grpo_ds.train --local_rank=0
"""


def test_the_time_limits_sigterm_reaches_the_jobs_ranks_once_and_the_job_exits_143(tmp_path):
    """`--signal=B:TERM@900` signals the batch shell only; its trap passes SIGTERM to this job's ranks on every node
    through one more srun, which names its layout: the job's (`--ntasks-per-node=8` in sbatch's environment) made
    it a step Slurm cannot place, failing silently, and the time limit's SIGKILL came mid-step."""
    bin_dir = fakes(tmp_path, "scontrol")
    (bin_dir / "srun").write_text(RECORDING_SRUN)
    (bin_dir / "deepspeed").write_text(FAKE_RANK_DEEPSPEED)
    for name in ("srun", "deepspeed"):
        (bin_dir / name).chmod(0o755)
    job = str(random.SystemRandom().randint(10**8, 10**9))  # the trap signals the ranks of this job id only
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in ("MASTER_PORT", "HOSTFILE")}
    env.update(SLURM, SLURM_JOB_ID=job, SLURM_NTASKS="8", SLURM_NTASKS_PER_NODE="8", RECORD=str(tmp_path))
    env.update(PATH=f"{bin_dir}:{VENV_BIN}:/usr/bin:/bin", PYTHONPATH=str(ROOT), HOME=str(tmp_path), PREFLIGHT="0")
    env.update(JOB_HOSTFILE=str(tmp_path / "job_hostfile"))
    shell = subprocess.Popen(["bash", "launch/slurm.sbatch"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if (tmp_path / "rank_up").exists() or shell.poll() is not None:
                break
            time.sleep(0.1)
        assert (tmp_path / "rank_up").exists(), shell.communicate(timeout=5)
        shell.send_signal(signal.SIGTERM)
        _, err = shell.communicate(timeout=60)
    finally:
        shell.kill()
    assert shell.returncode == 143, err
    assert (tmp_path / "term").read_text() == "TERM\n"  # once: the launcher is not in the way
    assert "glm-grpo: time limit near: the ranks checkpoint and stop after their current step" in err
    forward = [line for line in (tmp_path / "srun").read_text().splitlines() if "--overlap" in line]
    assert len(forward) == 1 and forward[0].startswith("--overlap --nodes=1 --ntasks=1 --ntasks-per-node=1 "), forward


@pytest.mark.parametrize(
    "script, fake, env",
    [
        ("launch/train.sh", (), dict(DS_ACCELERATOR="cpu", NUM_GPUS="2", MASTER_PORT="29533")),
        ("launch/slurm.sbatch", ("srun", "scontrol"), SLURM),
    ],
)
def test_the_preflight_plans_for_the_nodes_gpu_memory(tmp_path, script, fake, env):
    """The check plans against the node's smallest GPU as nvidia-smi reports it, less what its driver reserves (which
    torch never sees): 39.5 GiB of a 40 GB GPU, where the default 80 would pass a plan that cannot load, and 40.0
    where the driver has no such field; or GPU_MEMORY_GB when set."""
    env = dict(env, HOSTFILE=str(tmp_path / "hostfile"), JOB_HOSTFILE=str(tmp_path / "hostfile"), PREFLIGHT="1")
    cases = [(dict(FAKE_GPU_MIB="40960"), "39.5"), (dict(FAKE_GPU_MIB="40960", FAKE_GPU_RESERVED_MIB="none"), "40.0")]
    for extra, want in (*cases, (dict(GPU_MEMORY_GB="141"), "141")):
        (tmp_path / "called").unlink(missing_ok=True)
        proc, _ = run(script, tmp_path, (*fake, "nvidia-smi", "python"), **env, **extra)
        assert proc.returncode == 0, proc.stderr
        check = [line.split() for line in (tmp_path / "called").read_text().splitlines() if "--check" in line]
        assert len(check) == 1 and check[0][check[0].index("--gpu-memory-gb") + 1] == want, check


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
        ({"PARTS": "train,lunch"}, "gpu_timing.sh: PARTS=train,lunch: lunch is not a part; choose from train,"),
        ({"BUDGET_S": "9m"}, "gpu_timing.sh: BUDGET_S=9m is not a positive number; give e.g. BUDGET_S=540"),
        ({"OFF_STEPS": "1"}, "gpu_timing.sh: OFF_STEPS=1: give 2 steps or more (the first is serial)"),
        ({"SIZE": "1000"}, "gpu_timing.sh: SIZE=1000 is not a multiple of 32 pixels; give e.g. SIZE=1024"),
        ({"_args": ("--tiny",)}, "gpu_timing.sh: --tiny: takes no arguments, its settings are environment variables"),
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


def test_a_job_hostfile_exported_for_every_job_names_each_jobs_own_file_with_percent_j(tmp_path):
    """One JOB_HOSTFILE exported for every submission was one file that concurrent jobs overwrote (a job's launchers
    could read another job's nodes); %j in it is the job id, as in sbatch's --output."""
    proc, seen = run("launch/slurm.sbatch", tmp_path, ("srun", "scontrol"), **SLURM, JOB_HOSTFILE=f"{tmp_path}/hf.%j")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "hf.7").read_text() == "n1 slots=8\n" and seen["env"]["JOB_HOSTFILE"] == f"{tmp_path}/hf.7"


def test_slurm_moves_off_its_jobs_port_when_another_job_on_its_first_node_holds_it(tmp_path):
    """20000 + job id % 10000 is shared by jobs 10000 apart, and a run of launch/train.sh on the node may hold it: the
    rendezvous died on EADDRINUSE. The batch shell runs on the rendezvous node: it checks there."""
    with socket.socket() as held:
        with contextlib.suppress(OSError):  # already held by something else: the same case
            held.bind(("", 20007))
            held.listen()
        proc, seen = run("launch/slurm.sbatch", tmp_path, ("srun", "scontrol"), **SLURM)  # job 7
    assert proc.returncode == 0, proc.stderr
    port = seen["env"]["MASTER_PORT"]
    assert port != "20007" and seen["argv"][seen["argv"].index("--master_port") + 1] == port
    assert f"launch/slurm.sbatch: port 20007 is taken (another run on this node?): rendezvous on port {port}" in (
        proc.stderr
    )
    free = tmp_path / "free"
    free.mkdir()
    proc, seen = run("launch/slurm.sbatch", free, ("srun", "scontrol"), **SLURM)
    assert seen["env"]["MASTER_PORT"] == "20007" and "rendezvous" not in proc.stderr, proc.stderr


# --- --help on every launch script ------------------------------------------------------------------------------

HELP = [
    ("launch/train.sh", ("--help",), "DS_CONFIG (default ds_configs/zero2.json"),
    ("launch/train.sh", ("max_steps=1", "-h"), "PREFLIGHT (default 1; 0 skips"),
    ("launch/train_multinode.sh", ("--help",), "fits only at ZeRO-3: DS_CONFIG=ds_configs/zero3.json"),
    ("launch/slurm.sbatch", ("--help",), "#SBATCH --mem="),
    ("launch/gpu_check.sh", ("--help",), "Duration: "),
    ("launch/gpu_check.sh", ("--num-gpus", "8", "outputs/glm_full", "-h"), "--num-gpus N (default 1)"),
    ("launch/gpu_timing.sh", ("--help",), "PARTS=dit_timing,decode_timing bash launch/gpu_timing.sh"),
    ("launch/merge.sh", ("-h",), "bash launch/merge.sh zai-org/GLM-Image"),
    ("launch/slice_check.sh", ("--help",), "OUT=/tmp/sc SKIP_FULL=1 bash launch/slice_check.sh"),
    ("launch/env.sh", ("--help",), "export_deepspeed_env: "),
    ("launch/signals.sh", ("-h",), "run_deepspeed ARGS..."),
    ("launch/demo.sh", ("--help",), "NUM_PROCS=1 bash launch/demo.sh max_steps=20"),
]


@pytest.mark.parametrize("script, args, text", HELP, ids=[f"{s} {' '.join(a)}" for s, a, _ in HELP])
def test_help_prints_the_scripts_header_and_runs_nothing(tmp_path, script, args, text):
    """Before: `bash launch/gpu_check.sh --help` started a training run. Every fake on PATH (deepspeed, python,
    glm-grpo, srun, scontrol, nvidia-smi) records a call; none may happen. No HOSTFILE / SLURM variables are set:
    the scripts that need them would fail if --help were not answered first."""
    proc, seen = run(script, tmp_path, ("python", "glm-grpo", "srun", "scontrol", "nvidia-smi"), args, PREFLIGHT="1")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert not seen and not (tmp_path / "called").exists()
    header = (ROOT / script).read_text().splitlines()
    first = header[1] if header[0].startswith("#!") else header[0]
    lines = proc.stdout.splitlines()
    assert lines[0] == first.removeprefix("# ") and text in proc.stdout
    assert "set -euo pipefail" not in proc.stdout and "#!/usr/bin/env" not in proc.stdout
    assert len(lines) >= 3


def test_a_sourced_helper_run_on_its_own_says_so_in_one_line(tmp_path):
    proc, seen = run("launch/env.sh", tmp_path, ())
    assert proc.returncode == 2 and proc.stdout == "" and not seen
    assert proc.stderr == (
        "glm-grpo launch/env.sh: sourced by the launch scripts, not run; see bash launch/env.sh --help\n"
    )


# --- the default stage and the host memory request --------------------------------------------------------------


def two_node_hostfile(tmp_path: Path) -> Path:
    path = tmp_path / "hostfile"
    path.write_text("# two nodes\nnode-0 slots=8\n\nnode-1 slots=8\n")
    return path


def test_the_training_scripts_default_to_the_lora_config_at_zero2(tmp_path):
    """glm-grpo estimate-memory: LoRA on 8x80 GB fits at ZeRO-2 (the fastest shipped stage that does); full
    fine-tuning needs DS_CONFIG=ds_configs/zero3.json, which the scripts pass through."""
    hostfile = two_node_hostfile(tmp_path)
    cases = [
        ("launch/train.sh", (), dict(DS_ACCELERATOR="cpu")),
        ("launch/train_multinode.sh", (), dict(HOSTFILE=str(hostfile), MASTER_ADDR="node-0")),
        ("launch/slurm.sbatch", ("srun", "scontrol"), dict(JOB_HOSTFILE=str(tmp_path / "hf_slurm"), **SLURM)),
    ]
    for i, (script, fake, env) in enumerate(cases):
        where = tmp_path / str(i)
        where.mkdir()
        proc, seen = run(script, where, fake, **env)
        assert proc.returncode == 0, proc.stderr
        argv = seen["argv"]
        assert argv[argv.index("--config") + 1] == "launch/configs/glm_image_lora.yaml", script
        assert argv[argv.index("--deepspeed") + 1] == "ds_configs/zero2.json", script
        full = dict(env, CONFIG="launch/configs/glm_image_full.yaml", DS_CONFIG="ds_configs/zero3.json")
        proc, seen = run(script, where, fake, **full)
        assert seen["argv"][seen["argv"].index("--deepspeed") + 1] == "ds_configs/zero3.json", script
    # the multi-node launch: the hostfile's two hosts, ssh mode
    proc, seen = run("launch/train_multinode.sh", tmp_path, (), HOSTFILE=str(hostfile), MASTER_ADDR="node-0")
    assert seen["argv"][seen["argv"].index("--num_nodes") + 1] == "2" and "--no_ssh" not in seen["argv"]


def test_slurm_mem_is_what_estimate_memory_asks_for_the_scripts_defaults(tmp_path):
    """`#SBATCH --mem` and the numbers in the comment above it are the memory tool's host plan for the script's own
    defaults (CONFIG, DS_CONFIG, --gpus-per-node), read from the script: change one and this fails until the other
    follows. Built-in GLM-Image sizes (an empty Hugging Face cache), as on a login node before the download."""
    text = (ROOT / "launch/slurm.sbatch").read_text()
    config = re.search(r"^CONFIG=\$\{CONFIG:-(\S+)\}$", text, re.M).group(1)
    ds_config = re.search(r"^DS_CONFIG=\$\{DS_CONFIG:-(\S+)\}$", text, re.M).group(1)
    gpus = re.search(r"^#SBATCH --gpus-per-node=(\d+)$", text, re.M).group(1)
    fallback = r"^GPUS_PER_NODE=\$\{GPUS_PER_NODE:-\$\{SLURM_GPUS_ON_NODE:-(\d+)\}\}$"  # without --gpus-per-node
    assert re.search(fallback, text, re.M).group(1) == gpus
    mem = re.findall(r"^#SBATCH --mem=(\d+)G$", text, re.M)
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "glm_grpo_ds", "estimate-memory", "--config", config, "--deepspeed", ds_config]
        + ["--num-gpus", gpus, "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    host = json.loads(proc.stdout)["host_node"]
    want = host["request_bytes"] // 2**30
    assert mem == [str(want)], f"set `#SBATCH --mem={want}G` in launch/slurm.sbatch (and the comment above it)"
    peak = host["loading_peak_bytes"] / 2**30
    comment = " ".join(line.lstrip("# ") for line in text[: text.index("#SBATCH --mem=")].splitlines()[-10:])
    assert f"--config {config} --deepspeed {ds_config} --num-gpus {gpus}" in comment, comment
    assert f"= {peak:.1f} GiB peak" in comment and f"= {want} GiB" in comment, comment


# --- the hostfile, NUM_NODES and NODE_RANK of train_multinode.sh -----------------------------------------------

MULTINODE_REFUSALS = {
    "no HOSTFILE": (None, {}, "glm-grpo launch/train_multinode.sh: set HOSTFILE to the hostfile"),
    "no MASTER_ADDR": ("node-0 slots=8\n", {"MASTER_ADDR": ""}, "glm-grpo launch/train_multinode.sh: set MASTER_ADDR"),
    "missing file": ("<missing>", {}, "glm-grpo hostfile: hostfile {h}: no such file"),
    "empty": ("", {}, "glm-grpo hostfile: hostfile {h}: no host in it"),
    "comments only": ("# node-0 slots=8\n\n", {}, "glm-grpo hostfile: hostfile {h}: no host in it"),
    "bad line": (
        "node-0 slots=8\nnode-1 slot=8\n",
        {},
        "glm-grpo hostfile: hostfile {h} line 2: expected 'HOST slots=N', e.g. 'node-0 slots=8'",
    ),
    "duplicate host": ("node-0 slots=8\nnode-0 slots=8\n", {}, "glm-grpo hostfile: hostfile {h} line 2: node-0 is"),
    "NUM_NODES above the hosts": (
        "node-0 slots=8\nnode-1 slots=8\n",
        {"NUM_NODES": "3"},
        "glm-grpo launch/train_multinode.sh: NUM_NODES=3: give a number of nodes from 1 to 2 (the hosts in {h})",
    ),
    "NUM_NODES not a number": (
        "node-0 slots=8\n",
        {"NUM_NODES": "two"},
        "glm-grpo launch/train_multinode.sh: NUM_NODES=two: give a number of nodes from 1 to 1 (the hosts in {h})",
    ),
    "NODE_RANK out of range": (
        "node-0 slots=8\nnode-1 slots=8\n",
        {"NODE_RANK": "2"},
        "glm-grpo launch/train_multinode.sh: NODE_RANK=2: give this node's rank, 0 to 1 (2 nodes)",
    ),
}


@pytest.mark.parametrize("text, env, line", MULTINODE_REFUSALS.values(), ids=MULTINODE_REFUSALS.keys())
def test_train_multinode_refuses_a_bad_hostfile_in_one_line(tmp_path, text, env, line):
    """Before: an empty or comment-only hostfile exited 1 with no output, a missing one printed a bare grep error,
    a bad line or a duplicate host DeepSpeed's 15-line traceback (and a missing one, had grep passed, a run on
    this node only)."""
    hostfile = tmp_path / "hostfile"
    if text is not None and text != "<missing>":
        hostfile.write_text(text)
    given = {} if text is None else {"HOSTFILE": str(hostfile)}
    proc, seen = run("launch/train_multinode.sh", tmp_path, (), **{"MASTER_ADDR": "node-0", **given, **env})
    assert proc.returncode == 2 and not seen, proc.stderr
    assert proc.stderr.startswith(line.format(h=hostfile)) and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_ssh_mode_refuses_overrides_the_nodes_shell_would_read_and_no_ssh_mode_passes_them(tmp_path):
    """ssh mode: DeepSpeed's pdsh runner sends the arguments through a shell on every node, in double quotes only
    when they hold a space: `a$(touch x)` ran on every node, `{a,b}` was expanded into two arguments."""
    hostfile = two_node_hostfile(tmp_path)
    env = dict(HOSTFILE=str(hostfile), MASTER_ADDR="node-0")
    for bad in ("logging.run_name=a$(touch pwned)", "logging.run_name=a;b", "grpo.sampling={top_k:8,top_p:0.9}",
                "data.train_file=/data/v`id`.jsonl", 'logging.run_name=with space and $HOME'):  # fmt: skip
        proc, seen = run("launch/train_multinode.sh", tmp_path, (), (bad,), **env)
        assert proc.returncode == 2 and not seen and len(proc.stderr.splitlines()) == 1, (bad, proc.stderr)
        assert proc.stderr.startswith(f"glm-grpo launch/train_multinode.sh: '{bad}' holds a character"), proc.stderr
    # what the docs pass: a value with spaces and single quotes (quoted whole), a list
    fine = ("rewards=[{name: remote, weight: 1.0, args: {url: 'http://127.0.0.1:8123'}}]", "lora.r=8")
    proc, seen = run("launch/train_multinode.sh", tmp_path, (), fine, **env)
    assert proc.returncode == 0 and seen["argv"][-2:] == list(fine), proc.stderr
    proc, seen = run("launch/train_multinode.sh", tmp_path, (), ("logging.run_name=a;b",), NODE_RANK="0", **env)
    assert proc.returncode == 0 and seen["argv"][-1] == "logging.run_name=a;b", proc.stderr


FAKE_PDSH = """#!/bin/sh
printf '%s\\n' "$@" > "$RECORD/pdsh"
"""


def _ssh_launch(tmp_path: Path, deepspeed_env: str) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    """train_multinode.sh in ssh mode with the real DeepSpeed runner, ``ssh`` (its reachability check) and ``pdsh``
    faked: the process, and the arguments the runner handed pdsh (None when it never ran)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("pdsh", FAKE_PDSH), ("ssh", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / ".deepspeed_env").write_text(deepspeed_env)  # $HOME's
    env = {k: v for k, v in os.environ.items() if k not in ("DS_ENV_FILE", "NODE_RANK", "NUM_NODES", "MASTER_PORT")}
    env.update(PATH=f"{bin_dir}:{VENV_BIN}:/usr/bin:/bin", PYTHONPATH=str(ROOT), HOME=str(tmp_path))
    env.update(RECORD=str(tmp_path), PREFLIGHT="0", DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", TMPDIR=str(tmp_path))
    env["HOSTFILE"] = str(two_node_hostfile(tmp_path))
    proc = subprocess.run(
        ["bash", "launch/train_multinode.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    record = tmp_path / "pdsh"
    return proc, record.read_text().splitlines() if record.exists() else None


def test_ssh_mode_hands_deepspeed_only_the_variables_of_deepspeed_env(tmp_path):
    """DeepSpeed's ssh path reads .deepspeed_env again itself and pastes each line into every node's command: a comment
    line there commented out the launch on every node (nothing trained, exit 0), a quoted value kept its quotes twice.
    The command the real runner builds, run by bash as a node's shell would, now exports what launch/env.sh took."""
    proc, pdsh = _ssh_launch(tmp_path, "# NCCL_SOCKET_IFNAME=eth0\nMARKER=reached\n\nSPACED='a b'\n")
    assert proc.returncode == 0 and pdsh is not None, proc.stderr
    command = " ".join(pdsh[pdsh.index("-w") + 2 :])  # what pdsh hands each node's shell
    exports, launch, _ = command.partition(f"cd {ROOT};")
    assert launch and "deepspeed.launcher.launch" in command, command
    node = subprocess.run(
        ["bash", "-c", exports + 'printf "%s|%s" "$MARKER" "$SPACED"'], capture_output=True, text=True
    )
    assert node.stdout == "reached|a b", (exports, node.stderr)
    assert not list(tmp_path.glob("glm-grpo-deepspeed-env.*"))  # the copy is removed at exit
    # a value the nodes' shell would read: one line, exit 2, no launch
    (tmp_path / "pdsh").unlink()
    proc, pdsh = _ssh_launch(tmp_path, "MARKER=reached\nTOKEN=a$b\n")
    assert proc.returncode == 2 and pdsh is None, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(
        "glm-grpo: TOKEN of .deepspeed_env holds a character the nodes' shell would read in ssh mode"
    ), proc.stderr


def test_train_multinode_checks_on_node_0_only(tmp_path):
    """NODE_RANK=1 starts its launcher without the preflight (node 0 checks the shared inputs), whatever the
    config: a check there would refuse this missing one."""
    hostfile = two_node_hostfile(tmp_path)
    env = dict(HOSTFILE=str(hostfile), MASTER_ADDR="node-0", CONFIG=str(tmp_path / "missing.yaml"), PREFLIGHT="1")
    proc, seen = run("launch/train_multinode.sh", tmp_path, (), NODE_RANK="1", **env)
    assert proc.returncode == 0, proc.stderr
    argv = seen["argv"]
    assert argv[argv.index("--node_rank") + 1] == "1" and "--no_ssh" in argv


# --- the preflight: `python -m glm_grpo_ds.train --check` before the launcher ------------------------------------
# NEEDS_CHECK: the tests below need glm_grpo_ds.train's --check (until it exists, argparse refuses the flag with a
# two-line usage error and they fail on the one-line assertion).

PREFLIGHT_CASES = {
    "train.sh": ("launch/train.sh", (), dict(DS_ACCELERATOR="cpu", NUM_GPUS="2")),
    "train_multinode.sh ssh mode": ("launch/train_multinode.sh", (), dict(MASTER_ADDR="127.0.0.1")),
    "train_multinode.sh node 0": ("launch/train_multinode.sh", (), dict(MASTER_ADDR="127.0.0.1", NODE_RANK="0")),
    "slurm.sbatch": ("launch/slurm.sbatch", ("srun", "scontrol"), dict(SLURM)),
}


@pytest.mark.parametrize("script, fake, env", PREFLIGHT_CASES.values(), ids=PREFLIGHT_CASES.keys())
def test_the_preflight_stops_a_bad_input_before_the_launcher_unless_preflight_0(tmp_path, script, fake, env):
    """NEEDS_CHECK. A config that is not there: the check's one line and its exit 2 are the script's, and no
    launcher (no srun) starts; PREFLIGHT=0 launches the same command unchecked."""
    (tmp_path / "hostfile").write_text("127.0.0.1 slots=1\n")
    bad = tmp_path / "missing.yaml"
    env = dict(env, HOSTFILE=str(tmp_path / "hostfile"), CONFIG=str(bad), DS_ACCELERATOR="cpu")
    proc, seen = run(script, tmp_path, fake, ("max_steps=1",), PREFLIGHT="1", **env)
    assert proc.returncode == 2 and not seen, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and str(bad) in proc.stderr, proc.stderr
    proc, seen = run(script, tmp_path, fake, ("max_steps=1",), PREFLIGHT="0", **env)
    assert proc.returncode == 0 and seen["argv"][seen["argv"].index("--config") + 1] == str(bad), proc.stderr


@pytest.mark.slow  # the check reads the tiny model's processor and every prompt: ~25 s on 2 busy cores
def test_the_preflight_passes_a_good_setup_and_the_launcher_starts(tmp_path, tiny_model_dir):
    """NEEDS_CHECK. The tiny model on 2 CPU ranks, every input present: the check exits 0 and train.sh starts the
    launcher with the same config, DeepSpeed config and overrides."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a red cube"}\n{"prompt": "a blue ball"}\n')
    overrides = (
        f"model.path={tiny_model_dir}",
        f"data.train_file={prompts}",
        f"output_dir={tmp_path / 'run'}",
        'rewards=[{name: "python:glm_grpo_ds.testing.tiny_data:mean_brightness"}]',
        "max_steps=1",
    )
    env = dict(DS_ACCELERATOR="cpu", NUM_GPUS="2", CONFIG="launch/configs/tiny_cpu.yaml", PREFLIGHT="1")
    proc, seen = run("launch/train.sh", tmp_path, (), overrides, DS_CONFIG="ds_configs/zero3.json", **env)
    assert proc.returncode == 0, proc.stderr
    argv = seen["argv"]
    assert argv[argv.index("--deepspeed") + 1] == "ds_configs/zero3.json" and argv[-len(overrides) :] == [*overrides]
    assert argv[: argv.index("--master_port")] == ["--num_gpus", "2"] and "resume_from=auto" in argv


def test_merge_sh_refuses_words_it_would_drop(tmp_path):
    """`bash launch/merge.sh BASE ADAPTER OUT fp32 --dtype bf16` merged at fp32, the flags dropped; now a usage line,
    exit 2, and nothing called. Four words still reach `glm-grpo merge` as its flags."""
    called = tmp_path / "called"
    proc, _ = run("launch/merge.sh", tmp_path, ("glm-grpo",), ("b", "a", "o", "fp32", "--dtype", "bf16"))
    assert proc.returncode == 2 and not called.exists()
    assert "(got 6 arguments; glm-grpo merge takes the flags)" in proc.stderr
    proc, _ = run("launch/merge.sh", tmp_path, ("glm-grpo",), ("b", "a", "o", "fp32"))
    assert proc.returncode == 0, proc.stderr
    assert called.read_text() == "glm-grpo merge --base b --adapter a --out o --dtype fp32\n"
