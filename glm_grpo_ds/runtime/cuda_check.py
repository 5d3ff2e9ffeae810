"""Whether torch can use this node's NVIDIA GPUs: the driver's view (``nvidia-smi``, or
``/proc/driver/nvidia/version`` when the tool fails), torch's CUDA build, and the one-line refusal of
a silent CPU fallback (a torch wheel whose CUDA build the driver is too old for reports no CUDA, and
DeepSpeed would then run every rank on the CPU in the GPU run's dtype).

Used by every rank at startup (glm_grpo_ds/ds/process_group.py), by ``glm-grpo env`` and, as
``python -m glm_grpo_ds.runtime.cuda_check [WHAT_WAS_ASKED]``, by launch/train.sh, which reads ``cuda``
(torch can use CUDA) or ``cpu`` (no NVIDIA GPU here and none asked) on stdout; otherwise the refusal
is printed on stderr and the exit status is 2.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

PROC_VERSION = Path("/proc/driver/nvidia/version")  # present wherever the NVIDIA kernel driver is loaded
FIX_CPU = "to train on the CPU on purpose, set DS_ACCELERATOR=cpu"


class CudaUnusable(RuntimeError):
    """This node has NVIDIA GPUs (or GPUs were asked for) but torch cannot use CUDA: exit 2, one line."""


def check_rank() -> None:
    """At a rank's start: raise :class:`CudaUnusable` instead of letting DeepSpeed fall back to the
    CPU. Skipped for DS_ACCELERATOR=cpu (a CPU run on purpose) and for other accelerators."""
    accelerator = os.environ.get("DS_ACCELERATOR", "")
    if accelerator not in ("", "cuda"):
        return
    problem = refusal("DS_ACCELERATOR=cuda" if accelerator else None)
    if problem:
        raise CudaUnusable(problem)


def _smi(*args: str) -> subprocess.CompletedProcess | None:
    """``nvidia-smi ARGS``, or None when the tool is missing or hangs (a wedged driver)."""
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None


def driver_gpus(listing: subprocess.CompletedProcess | None) -> list[str]:
    """The GPUs the driver lists for this process (the ``GPU `` lines of ``listing``, an ``nvidia-smi -L``
    run), [] when none or no tool."""
    return [line.strip() for line in listing.stdout.splitlines() if line.startswith("GPU ")] if listing else []


def driver_version() -> str | None:
    """The NVIDIA driver's version (nvidia-smi, else the kernel module's), None without a driver."""
    proc = _smi("--query-gpu=driver_version", "--format=csv,noheader")
    if proc is not None and proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.splitlines()[0].strip()
    try:
        found = re.search(r"Kernel Module\s+(\S+)", PROC_VERSION.read_text())
    except OSError:
        return None
    return found.group(1) if found else "unknown"


def driver_cuda() -> str | None:
    """The newest CUDA version the driver supports (``CUDA Version`` in nvidia-smi's header)."""
    proc = _smi()
    found = re.search(r"CUDA Version:\s*([\d.]+)", proc.stdout) if proc else None
    return found.group(1) if found else None


def node_has_gpus(listing: subprocess.CompletedProcess | None) -> bool:
    """``listing`` (an ``nvidia-smi -L`` run) names a GPU, or (the tool missing or failing, e.g. a
    driver/library mismatch) the kernel driver is loaded. A container or job that was given no GPU on a
    GPU host may still see the driver: it then runs on the CPU only with DS_ACCELERATOR=cpu, said
    explicitly."""
    proc = listing
    if proc is not None and proc.returncode == 0:
        return any(line.startswith("GPU ") for line in proc.stdout.splitlines())
    if proc is not None and "No devices were found" in proc.stdout + proc.stderr:
        return False
    return PROC_VERSION.exists()


def torch_build() -> str:
    """torch's version and CUDA build, e.g. ``torch 2.15.0+cu132 (CUDA 13.2 build)``."""
    import torch

    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build, torch.version.cuda is None"
    return f"torch {torch.__version__} ({build})"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


def refusal(asked: str | None = None) -> str | None:
    """The one line that stops a run on the CPU that was meant for GPUs, or None when there is
    nothing to refuse: torch can use CUDA, or this node has no NVIDIA GPU and nothing was ``asked``
    (what the user asked for, e.g. ``NUM_GPUS=8``). DS_ACCELERATOR=cpu is the caller's to check."""
    import torch

    if torch.cuda.is_available():
        return None
    listing = _smi("-L")  # once: both questions below read it
    gpus = driver_gpus(listing)
    if not (gpus or node_has_gpus(listing)):
        if not asked:
            return None
        return (
            f"{asked} asks for GPUs, but nvidia-smi lists none on this node and {torch_build()} cannot use CUDA: "
            f"run on a GPU node or, {FIX_CPU}"
        )
    version, cuda = driver_version(), driver_cuda()
    names = sorted({re.sub(r"^GPU \d+: | \(UUID.*$", "", g) for g in gpus})
    seen = f"this node has {len(gpus)} NVIDIA GPU(s) ({', '.join(names)})" if gpus else "the NVIDIA driver is loaded"
    facts = [f"driver {version or 'unknown'}" + (f", which supports CUDA <= {cuda}" if cuda else "")]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        facts.append(f"CUDA_VISIBLE_DEVICES={visible!r}" + (": no GPU visible" if not visible.strip() else ""))
    if torch.version.cuda is None:
        fix = "install a CUDA build of torch (pip install torch --index-url https://download.pytorch.org/whl/cuXYZ"
        fix += f", XYZ <= {cuda.replace('.', '')})" if cuda else ")"
    elif cuda and _version(cuda) < _version(torch.version.cuda):
        fix = (
            f"update the NVIDIA driver to one that supports CUDA {torch.version.cuda}, or install torch built for "
            f"CUDA <= {cuda} (pip install torch --index-url https://download.pytorch.org/whl/cuXYZ)"
        )
    else:
        fix = (
            "check CUDA_VISIBLE_DEVICES and the /dev/nvidia* devices this process was given "
            "(python -c 'import torch; torch.cuda.init()' names the cause)"
        )
    prefix = f"{asked}: " if asked else ""
    return f"{prefix}{seen}, but {torch_build()} cannot use CUDA ({'; '.join(facts)}): {fix}; or {FIX_CPU}"


def main(argv: list[str] | None = None) -> int:
    """For launch/train.sh: ``cuda``, ``cpu``, or the refusal on stderr and exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    asked = " ".join(argv)
    import torch

    if torch.cuda.is_available():
        print("cuda")
        return 0
    problem = refusal(asked)
    if problem:
        print(f"glm-grpo: {problem}", file=sys.stderr)
        return 2
    print("cpu")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
