"""Starting the process group (:func:`init_distributed`): NCCL on GPUs, DeepSpeed's CPU accelerator and gloo
otherwise, so the same command runs on a laptop; and what a CPU process group needs around DeepSpeed's
shared-memory all-reduce op (its one-time build, this environment's ninja, its /dev/shm buffer).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from pathlib import Path

import torch

from ..runtime import cuda_check, log, run_log, threads
from ..runtime.ports import free_port
from . import dist


def init_distributed(
    force_collectives: bool = False, timeout_minutes: float = 60.0
) -> tuple[int, int, int, torch.device]:
    """Start (or join) the process group; returns (rank, world_size, local_rank, device).

    Works under the ``deepspeed`` launcher (env vars set) and as a plain single process.
    ``force_collectives``: run collectives at world size 1 too (see glm_grpo_ds/ds/dist.py).
    ``timeout_minutes``: how long a collective waits for a late rank (``dist_timeout_minutes``); passed
    explicitly, so DeepSpeed's default (10 min, or ``DEEPSPEED_TIMEOUT``) does not apply.
    """
    cuda_check.check_rank()  # GPUs here (or asked for) that torch cannot use: stop, never train on the CPU
    # DS_ACCELERATOR=cpu is a CPU run even where CUDA works (the tests and the demo on a GPU machine)
    on_gpu = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu"
    if not on_gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    # DeepSpeed's import installs its logger's own stdout handler, and its process-group start print()s
    # (e.g. "deepspeed_shm_comm_op built successfully"): both belong in the run's log, not the console.
    with run_log.prints_to_log("DeepSpeed"):
        import deepspeed
    run_log.adopt_library_loggers()
    this_environments_extensions()  # before DeepSpeed builds an op: its CPU all-reduce, its CPU Adam

    local_rank = int(os.environ["LOCAL_RANK"])
    if on_gpu:
        torch.cuda.set_device(local_rank)
    # The ranks of a node share its cores (GPU runs too): without this each rank starts one thread per
    # core and the oversubscribed threads spin (CPU ranks: token-by-token decoding ~30x slower).
    threads.limit_torch_threads()
    if not on_gpu and cpu_comm_op_needs_build():  # else the console says nothing for ~40 s
        log.info("glm-grpo: building DeepSpeed's CPU communication op (deepspeed_shm_comm), once per install: ~40 s")
    dist.every_group_waits(datetime.timedelta(minutes=timeout_minutes))
    with run_log.prints_to_log("DeepSpeed"), this_environments_ninja():
        deepspeed.init_distributed(
            dist_backend="nccl" if on_gpu else "gloo",
            verbose=False,
            timeout=datetime.timedelta(minutes=timeout_minutes),
        )
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    dist.setup(comm_device=device, force=force_collectives)  # NCCL: CUDA tensors; gloo: CPU
    if not on_gpu:
        _unlink_cpu_allreduce_buffer()
    return dist.rank(), dist.world_size(), local_rank, device


@contextlib.contextmanager
def this_environments_ninja():
    """PATH with this interpreter's bin directory first, while DeepSpeed's CPU op may build, when that directory
    has a ``ninja`` (the pip package torch's JIT builds use): else torch runs whichever ``ninja`` PATH finds first.

    One extensions directory serves every process of a user, and ninja records each build with a hash of its
    command whose algorithm changed between versions (ninja 1.11 vs 1.13 here: the log format v7 reads another
    version's hashes as different commands). A process started with the environment's bin on PATH (an activated
    virtualenv, launch/train.sh) and one without (``.venv/bin/python -m ...``) then rebuilt the op in turn, ~40 s
    each: 9 times in one run of the test suite on 2 cores."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "ninja").is_file():
        yield
        return
    before = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join([str(bin_dir), *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def this_environments_extensions() -> None:
    """``TORCH_EXTENSIONS_DIR``, unless set, a folder of this environment's own under torch's default one
    (~/.cache/torch_extensions/<environment>-<hash of its path, torch's and Python's version>), before DeepSpeed
    builds an op (the CPU communication op, the offloaded optimizer's CPU Adam). torch's default serves every virtual
    environment of a user, and an op built from another environment's sources is rebuilt (~40 s on 2 cores, under
    a lock the other ranks wait on): two environments in turn rebuilt it at nearly every run. Inherited by the
    processes this one starts."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return
    import hashlib
    import platform

    from torch.utils.cpp_extension import get_default_build_root

    prefix = os.path.realpath(sys.prefix)
    key = hashlib.sha256(f"{prefix}\0{torch.__version__}\0{platform.python_version()}".encode()).hexdigest()[:10]
    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(
        get_default_build_root(), f"{Path(prefix).name.lstrip('.')}-{key}"
    )


def cpu_comm_op_needs_build() -> bool:
    """Whether starting a CPU process group will first compile DeepSpeed's shared-memory all-reduce op
    (torch's JIT extension build, ~40 s on 2 cores): its library is missing from the extensions directory
    (``TORCH_EXTENSIONS_DIR``, default ~/.cache/torch_extensions/...), or was built from another
    install's sources (one directory serves every virtual environment of a user, so they rebuild in turn)."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from torch.utils.cpp_extension import _get_build_directory

    this_environments_extensions()  # where the build goes (set before anything builds)

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return False  # DeepSpeed runs without it (torch's gloo all-reduce): nothing to build
    build = Path(_get_build_directory(builder.name, verbose=False))
    ninja = build / "build.ninja"
    if not (build / f"{builder.name}.so").is_file() or not ninja.is_file():
        return True
    recipe = ninja.read_text()
    return any(os.path.abspath(builder.deepspeed_src_path(src)) not in recipe for src in builder.sources())


def cpu_adam_problem() -> str | None:
    """Why DeepSpeed's CPU Adam (what ``zero_optimization.offload_optimizer`` steps with) cannot load on this machine,
    or None: its op is not compatible with this install, or it is not prebuilt and the build it starts with on every
    rank lacks a C++ compiler (``CXX``, else ``c++``) or ninja. The ranks met it after the job queued and the model
    loaded."""
    import shutil

    import deepspeed.git_version_info as built
    from deepspeed.ops.op_builder import CPUAdamBuilder
    from torch.utils.cpp_extension import verify_ninja_availability

    builder = CPUAdamBuilder()
    if not builder.is_compatible(verbose=False):
        return "DeepSpeed's cpu_adam op is not compatible with this install (`ds_report` says why)"
    if built.installed_ops.get(builder.NAME):
        return None  # prebuilt (DS_BUILD_CPU_ADAM=1 at install)
    compiler = os.environ.get("CXX", "c++")
    fix = "install one, or reinstall DeepSpeed with DS_BUILD_CPU_ADAM=1 to prebuild the op"
    if shutil.which(compiler) is None:
        return f"DeepSpeed's cpu_adam op builds at start and needs a C++ compiler: {compiler} is not found; {fix}"
    try:
        with this_environments_ninja():
            verify_ninja_availability()
    except RuntimeError:
        return f"DeepSpeed's cpu_adam op builds at start and needs ninja: not found; {fix}"
    return None


def build_cpu_comm_op() -> str:
    """Compile DeepSpeed's CPU communication op now, when a CPU process group would first build it (``make setup``:
    the first CPU run or test after it then starts at once instead of spending ~40 s, or waiting on the build lock
    while another process builds); what was done, in one line. Needs ``DS_ACCELERATOR=cpu``."""
    if not cpu_comm_op_needs_build():
        return "DeepSpeed's CPU communication op: already built (or not used by this install)"
    from deepspeed.accelerator import get_accelerator

    with run_log.prints_to_log("DeepSpeed"), this_environments_ninja():
        get_accelerator().create_op_builder("ShareMemCommBuilder").load()
    return "DeepSpeed's CPU communication op: built"


def _unlink_cpu_allreduce_buffer() -> None:
    """Remove this rank's ``/dev/shm`` all-reduce buffer name once every rank has mapped it.

    DeepSpeed's CPU backend creates a 64 MiB shared-memory file per rank and never unlinks it, so
    RAM-backed /dev/shm would grow by 64 MiB per rank with every CPU run. After the barrier all ranks
    have mmapped every buffer; unlinking only drops the name, and the memory is returned when the
    last process exits - also when it is killed.
    """
    dist.barrier()
    name = (
        f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{os.environ['MASTER_ADDR']}_"
        f"{os.environ['MASTER_PORT']}_{dist.rank()}"
    )
    Path(name).unlink(missing_ok=True)


if __name__ == "__main__":  # make setup: DS_ACCELERATOR=cpu python -m glm_grpo_ds.ds.process_group
    print(build_cpu_comm_op())
