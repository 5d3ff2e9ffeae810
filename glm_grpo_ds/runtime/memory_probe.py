"""Memory probes of this process: the peak of one phase of a step (rollout, decode, reward, update) and
the peak of the whole run, on a GPU and on a CPU alike.

* GPU: torch's caching-allocator counters (``torch.cuda.max_memory_allocated``, reset per phase by
  ``torch.cuda.reset_peak_memory_stats``): the tensors torch allocated, not the CUDA context or NCCL.
* CPU: the process's resident set from Linux ``/proc/self/status`` (``VmHWM`` = peak, ``VmRSS`` = now),
  its peak reset per phase by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0). It sees every
  torch CPU allocation (anonymous memory) and also what torch does not own: the interpreter and the
  imported libraries, weights still mapped from their safetensors files, heap that glibc keeps after a
  free. ``memory/before_load_mb`` (glm_grpo_ds/startup.py: the resident set before any model loads) names
  the first of these.

Resetting a phase peak would lose the run's peak (loading included) that ``peak_rss_mb`` /
``peak_gpu_memory_mb`` report, so :func:`reset_peak` folds the counter into a process-wide maximum first
and :func:`run_peak_bytes` returns that maximum.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

_run_peak = 0  # bytes: the highest peak seen before any reset_peak (the counters are process-wide too)


def _proc_status_bytes(field: str) -> int:
    """A size field of /proc/self/status (``VmHWM`` peak RSS, ``VmRSS`` current RSS) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_bytes(device: torch.device) -> int:
    """Peak since the last :func:`reset_peak` (or the process start)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else _proc_status_bytes("VmHWM")


def current_bytes(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else _proc_status_bytes("VmRSS")


def reset_peak(device: torch.device) -> None:
    """Start a new peak at the current figure (the old peak is kept in :func:`run_peak_bytes`)."""
    global _run_peak
    _run_peak = max(_run_peak, peak_bytes(device))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (and ru_maxrss) to the current RSS


def run_peak_bytes(device: torch.device) -> int:
    """The process's peak over the whole run, through any number of :func:`reset_peak`."""
    return max(_run_peak, peak_bytes(device))


@contextlib.contextmanager
def phase_peak(peaks: dict[str, float], name: str, device: torch.device):
    """``peaks[name]`` = the peak in MiB while the block ran (the figure at its start included)."""
    reset_peak(device)
    try:
        yield
    finally:
        peaks[name] = peak_bytes(device) / 2**20
