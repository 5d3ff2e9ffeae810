"""CPU threads per rank: the launcher starts one process per GPU (or per CPU rank) on a node, and each
library that sizes its thread pool by the machine's core count (torch's intra-op pool, onnxruntime's
sessions) would otherwise start one thread per core in every rank: 8 ranks x 128 threads spinning on
128 cores. Each rank gets its share of the cores it may run on. And the one kind of worker thread a rank starts
beside its main one (:func:`device_thread`); what keeps such threads' device work out of each other's CUDA graph
captures: runtime/capture_gate.py."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor


def local_ranks(default: int) -> int:
    """The ranks of this node as its launcher says (DeepSpeed's ``LOCAL_SIZE``, torchrun's ``LOCAL_WORLD_SIZE``),
    ``default`` without a launcher."""
    return int(os.environ.get("LOCAL_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or default)


def launcher_nodes() -> int:
    """The nodes of this job as its launcher says: DeepSpeed's ``CROSS_SIZE``, torchrun's ``GROUP_WORLD_SIZE``, else
    ``WORLD_SIZE`` over this node's ranks (``LOCAL_SIZE`` / ``LOCAL_WORLD_SIZE``); 1 without a launcher."""
    for key in ("GROUP_WORLD_SIZE", "CROSS_SIZE"):
        if os.environ.get(key):
            return int(os.environ[key])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return max(1, world // local_ranks(world))


def cores_per_local_rank() -> int:
    """``OMP_NUM_THREADS`` when set (by you, or ``deepspeed --bind_cores_to_rank``); else the cores this
    process may run on (its CPU affinity: a SLURM allocation's, not the whole machine's) divided by the
    ranks of this node (the launcher's ``LOCAL_SIZE`` / ``LOCAL_WORLD_SIZE``), at least 1."""
    if os.environ.get("OMP_NUM_THREADS"):
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    local_world = local_ranks(1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_world))


def limit_torch_threads() -> int:
    """torch's intra-op pool = :func:`cores_per_local_rank` (GPU runs too: data loading, image
    processing and CPU-side reward models run there); returns the count."""
    import torch

    n = cores_per_local_rank()
    torch.set_num_threads(n)
    return n


def device_thread(device, name: str) -> ThreadPoolExecutor:
    """One worker thread (``name``) whose jobs run on this rank's ``device``: the current CUDA device is per
    thread, and a new thread's is cuda:0, not the rank's. Jobs run one at a time, in order."""
    import torch

    start = (lambda: torch.cuda.set_device(device)) if device.type == "cuda" else None
    return ThreadPoolExecutor(1, thread_name_prefix=name, initializer=start)
