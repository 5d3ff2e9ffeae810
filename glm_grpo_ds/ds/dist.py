"""The one module that calls ``torch.distributed``: rank / world size, collectives, barrier, teardown.

Collectives run on the process group's **communication device**: CUDA for NCCL (which refuses CPU
tensors: "No backend type associated with device type cpu"), CPU for gloo. Every helper copies its
input there and hands the result back on the caller's device (or as Python floats), so callers never
think about it - and a scalar built with ``torch.tensor(x)`` on the CPU is fine on a GPU node.

Per-step statistics go in two stacked collectives (:func:`reduce_stats`: all sums in one tensor,
all maxima in another, minima as negated maxima) rather than one collective per scalar.

At world size 1 the collectives are skipped (they would return their input) unless forced
(:func:`setup` with ``force=True``; training's ``force_collectives: true``): then a single GPU with
NCCL runs every collective of a multi-GPU run - the cheap way to check that path without a node.

``glm_grpo_ds/ds/process_group.py`` starts the process group (through DeepSpeed) and calls :func:`setup`.
"""

from __future__ import annotations

import contextlib
import datetime
import math

import torch

from ..runtime.error_chain import chain

_state: dict = {"comm_device": None, "force": False}


def setup(comm_device: torch.device | None = None, force: bool = False) -> None:
    """Record the communication device (default: from the backend) and whether collectives run at
    world size 1."""
    _state["comm_device"] = None if comm_device is None else torch.device(comm_device)
    _state["force"] = bool(force)


def initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    return torch.distributed.get_rank() if initialized() else 0


def world_size() -> int:
    return torch.distributed.get_world_size() if initialized() else 1


def comm_device() -> torch.device:
    """Where collective tensors must live: the recorded device, else CUDA for NCCL, CPU otherwise."""
    if _state["comm_device"] is not None:
        return _state["comm_device"]
    if initialized() and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def active() -> bool:
    """Whether collectives really run (a process group of > 1 rank, or forced at 1)."""
    return initialized() and (world_size() > 1 or _state["force"])


def to_comm(t: torch.Tensor) -> torch.Tensor:
    """A private contiguous copy of ``t`` on the communication device (collectives work in place)."""
    return t.detach().to(comm_device(), copy=True).contiguous()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if not active():
        return t.detach().clone()
    buf = to_comm(t)
    torch.distributed.all_reduce(buf)
    return buf.to(t.device)


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    return all_reduce_sum(t) / world_size()


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    if not active():
        return t.detach().clone()
    buf = to_comm(t)
    torch.distributed.all_reduce(buf, op=torch.distributed.ReduceOp.MAX)
    return buf.to(t.device)


def reduce_stats(sums: dict[str, float], maxima: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """Global sums and maxima of per-rank scalars in two collectives (float64, so counts stay exact).
    For a minimum pass ``-x`` as a maximum and negate the result. A maximum that is NaN on any rank is +inf (a
    reduction's max keeps or drops a NaN by the ranks' order; the step record writes both as null). Collective:
    every rank passes the same keys in the same order."""

    def stacked(values: dict[str, float]) -> torch.Tensor:  # built where the collective runs: no extra copy
        return torch.tensor(list(values.values()), dtype=torch.float64, device=comm_device())

    s = all_reduce_sum(stacked(sums)).tolist() if sums else []
    m = []
    if maxima:
        m = all_reduce_max(stacked(maxima).nan_to_num(nan=math.inf, posinf=math.inf, neginf=-math.inf)).tolist()
    return dict(zip(sums, s)), dict(zip(maxima, m))


def any_rank(flag: float) -> float:
    """The maximum of a per-rank number over all ranks (e.g. "did any rank get a signal")."""
    return reduce_stats({}, {"x": float(flag)})[1]["x"]


@contextlib.contextmanager
def _gloo_group(timeout_s: float):
    """A gloo group of every rank whose collectives may wait ``timeout_s`` seconds, created on entry
    (collective: every rank enters) and destroyed on exit."""
    group = torch.distributed.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    try:
        yield group
    finally:
        torch.distributed.destroy_process_group(group)


@contextlib.contextmanager
def patient_group(timeout_s: float):
    """Yield an ``any_rank(flag) -> bool`` whose collective may wait ``timeout_s`` seconds, far beyond the
    process group's timeout (``dist_timeout_minutes``; NCCL aborts a collective that waits longer):
    for ranks that wait while rank 0 does something long, e.g. download the model. It runs on a gloo group
    of its own (collective: every rank enters)."""
    if not active():
        yield lambda flag: bool(flag)
        return
    with _gloo_group(timeout_s) as group:

        def any_rank_patient(flag) -> bool:
            buf = torch.tensor([float(flag)], dtype=torch.float64)  # gloo: a CPU tensor
            torch.distributed.all_reduce(buf, op=torch.distributed.ReduceOp.MAX, group=group)
            return bool(buf.item())

        yield any_rank_patient


# How long the other ranks wait for a turn of :func:`in_rank_order` (a download, an Arrow conversion).
PREPARE_WAIT_S = 6 * 3600


def in_rank_order(prepare, rank: int, local_rank: int, what: str, failed=RuntimeError):
    """``prepare()`` on every rank, global rank 0 first, then local rank 0 of every other node, then the
    rest, with a barrier between the turns: the first download (a Hub dataset, a reward model) or Arrow-cache
    build happens once per cache (shared file system or per node), and the later turns find it ready instead of
    racing on it (64 ranks fetching one model at once are 64 downloads, or the Hub's rate limit). The barriers
    run on a patient group (up to :data:`PREPARE_WAIT_S`), not the process group, whose timeout
    (``dist_timeout_minutes``) a large download may exceed. Then every rank learns whether any failed: the
    rank that did raises its own error, the others ``failed(line)`` naming ``what`` was prepared, the first
    failing rank and its error, so that no rank goes on alone to wait for the others in its next collective."""
    if not active():
        return prepare()
    turn = 0 if rank == 0 else 1 if local_rank == 0 else 2
    result = error = None
    lines = [None] * world_size()
    with _gloo_group(PREPARE_WAIT_S) as group:
        for t in range(3):
            if t == turn:
                try:
                    result = prepare()
                except Exception as err:  # every rank learns of it below, after the turns
                    error = err
            torch.distributed.barrier(group=group)
        line = None if error is None else (str(error).splitlines() or [type(error).__name__])[0]
        torch.distributed.all_gather_object(lines, line, group=group)
    if error is not None:
        raise error
    bad = [r for r, line in enumerate(lines) if line is not None]
    if bad:
        raise failed(f"{what}: rank {bad[0]} failed, so every rank stops: {lines[bad[0]]}")
    return result


def every_group_waits(timeout: datetime.timedelta) -> None:
    """``timeout`` for every process group created from now on without one of its own, not only the world group:
    DeepSpeed's engine builds its data-parallel groups with ``new_group(ranks)``, which takes torch's default
    (NCCL 10 min, gloo 30), so its gradient reductions and all-gathers aborted at 10 minutes whatever
    ``dist_timeout_minutes`` said, before the watchdog's report at a larger ``logging.watchdog_min_seconds``. torch
    has no public setting for that default: its two module-level values are replaced here, read when a group is
    created (ds/process_group.py calls this before the process group starts; tests/unit/test_dist.py checks it on
    DeepSpeed's own clone of the world group)."""
    c10d = torch.distributed.distributed_c10d
    for name in ("default_pg_timeout", "default_pg_nccl_timeout"):
        if not isinstance(getattr(c10d, name, None), datetime.timedelta):
            raise RuntimeError(f"torch.distributed has no {name} to set: DeepSpeed's groups would not wait {timeout}")
        setattr(c10d, name, timeout)


def all_gather(t: torch.Tensor) -> torch.Tensor:
    """Concatenate equally shaped tensors from every rank along dim 0 (rank order), on ``t``'s device."""
    if not active():
        return t
    buf = to_comm(t)
    parts = [torch.empty_like(buf) for _ in range(world_size())]
    torch.distributed.all_gather(parts, buf)
    return torch.cat(parts).to(t.device)


def gather_to_main(t: torch.Tensor) -> torch.Tensor | None:
    """Concatenate equally shaped tensors from every rank along dim 0 (rank order) on rank 0, on
    ``t``'s device; None on the other ranks. Collective: every rank calls it. Used for gallery
    thumbnails, which only rank 0 writes (cheaper than ``all_gather`` on many ranks)."""
    if not active():
        return t
    buf = to_comm(t)
    main = rank() == 0
    parts = [torch.empty_like(buf) for _ in range(world_size())] if main else None
    torch.distributed.gather(buf, parts, dst=0)
    return torch.cat(parts).to(t.device) if main else None


def all_gather_object(obj) -> list:
    """Every rank's ``obj`` (any picklable value), in rank order, on every rank. Collective: every rank
    calls it. At world size 1 (collectives not forced): ``[obj]``. For small startup facts (a hostname, what
    a rank sees on its disk), not for tensors."""
    if not active():
        return [obj]
    out = [None] * world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def broadcast_object(obj, src: int = 0):
    """Rank ``src``'s ``obj`` (any picklable value) on every rank; the others pass anything (e.g. None).
    Collective: every rank calls it."""
    if not active():
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    if initialized():
        torch.distributed.barrier()


# What a collective raises when a peer's process ended mid-collective (gloo's TCP pairs; NCCL's watchdog): this rank
# failed because another one did, whose own line and status are the run's
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote process exited")
PEER_GRACE_S = 10.0  # how long such a rank waits before its own exit: the launcher sees the failed rank's first


def peer_lost(err: BaseException) -> bool:
    """Whether ``err`` (or an error in its chain of causes) is a collective's failure because a peer process ended."""
    return any(isinstance(e, RuntimeError) and any(text in str(e) for text in _PEER_GONE) for e in chain(err))


# What a collective raises when it waited dist_timeout_minutes for a rank that did not come (gloo's; NCCL's watchdog,
# when it raises rather than ends the process)
_TIMED_OUT = ("Timed out waiting", "Watchdog caught collective operation timeout")


def timed_out(err: BaseException) -> BaseException | None:
    """The error in ``err``'s chain that is a collective's timeout, or None."""
    return next((e for e in chain(err) if isinstance(e, RuntimeError) and any(t in str(e) for t in _TIMED_OUT)), None)


def shutdown(agreed: bool = True) -> None:
    """Destroy the process group before the interpreter exits. Without it gloo's worker threads
    can abort a finished rank during interpreter teardown ("terminate called without an active
    exception", exit -6).
    ``agreed``: every rank is known to be here (end of training, an agreed stop), so a barrier first
    lets no rank close its connections while a peer still uses them. After an input error the other
    ranks may not come; then no barrier (it could hang), just the local teardown."""
    if initialized():
        if agreed:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()
