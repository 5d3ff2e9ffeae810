"""Room on ``output_dir``'s file system for a checkpoint or the final weights, checked before they are written.

A full disk met in the middle of a checkpoint ends a run with a torch write error (``unexpected pos ...``), a
half-written ``step_N.tmp/`` taking the last of the space, and, on several ranks, the others waiting in a barrier.
Instead, before each checkpoint and before the final weights, rank 0 reads the free space of ``output_dir`` (the
same storage on every rank: storage.py) and every rank learns the verdict in one all-reduce. Short of room, the
run stops on every rank with one line and exit status 7 (:data:`EXIT_DISK`), nothing of it written, ``latest``
the checkpoint before. What a write needs: the size of the last checkpoint this run wrote, or before the first the
plan's (memory/disk.py, in ``memory_plan.json``), times :data:`MARGIN`, plus :data:`SLACK_BYTES` for what the run
writes beside it. A write that fails anyway (another job filled the disk meanwhile, a quota) is one line and exit 7
from the rank that met it (:func:`full_disk`).

    room = DiskRoom(out, rank)
    with room.writing("checkpoint step_000300", room.checkpoint_bytes()):   # collective check, then the write
        path = checkpoint.save(...)
    room.wrote_checkpoint(path)                                               # rank 0: its size, the next one's need
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
from pathlib import Path

from ..ds import dist, portable
from ..runtime import log
from ..runtime.error_chain import chain
from .checkpoint import CHECKPOINTS, CheckpointError
from .preempt import Stopped
from .resume import go_on

EXIT_DISK = 7  # exit status of a run stopped for want of disk space (2 = bad input, 3 = non-finite, ...)
MARGIN = 1.1  # a checkpoint grows a little from one to the next (a reset reference, an average kept)
SLACK_BYTES = 256 * 2**20  # what the run writes beside the checkpoint meanwhile: logs, metrics, galleries
FINAL_MARGIN = 1.05  # the final weights: the plan's size (within a few % on the tiny model), nothing written after


class DiskFull(CheckpointError):
    """A write that met a full file system: one line, exit status :data:`EXIT_DISK` (train.py)."""

    exit_code = EXIT_DISK


def tree_bytes(path: Path) -> int:
    """The bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def free_bytes(path: Path) -> int:
    """Free bytes of the file system that holds ``path`` (or its nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def size_text(nbytes: float) -> str:
    """``nbytes`` in GiB, MiB or KiB, whichever reads best."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= size:
            return f"{nbytes / size:,.1f} {unit}"
    return f"{nbytes / 2**10:,.0f} KiB"


def _go_on(out: Path) -> str:
    return go_on(out, "free space (save_total_limit keeps fewer checkpoints)")


# what says a write met a full disk or a quota: the errno of an OSError, anywhere in the chain of causes; torch's
# zip writer, which raises RuntimeError without one, on a file system it found full
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
TORCH_WRITER = ("unexpected pos", "file write failed")


def full_disk(err: Exception, what: str, out: Path) -> DiskFull | None:
    """``err``, raised writing ``what`` into ``out``, as a :class:`DiskFull` line when it says the disk is full or a
    quota is reached (:data:`FULL_ERRNOS`), or is torch's writer failing with the file system (nearly) full; None
    otherwise: another error, raised as it is (a CUDA or NCCL one on a nearly full disk stays what it is)."""
    errors = chain(err)
    by_errno = any(getattr(e, "errno", None) in FULL_ERRNOS for e in errors)
    free = free_bytes(out)
    by_writer = any(p in str(e) for e in errors for p in TORCH_WRITER) and free < SLACK_BYTES
    if not (by_errno or by_writer):
        return None
    msg = " ".join(str(err).split())[:200] or type(err).__name__
    return DiskFull(
        f"writing {what} into {out} failed with {size_text(free)} left on its file system ({type(err).__name__}: "
        f"{msg}); the partial files are removed at the next start and {_go_on(out)}"
    )


def run_room(out: Path, run_bytes: int) -> tuple[int, int]:
    """``(free, need)`` of a whole run in ``out``: its file system's free bytes, and what the run holds at most there
    (``run_bytes``, memory/disk.py) less what its checkpoints hold already (a resumed run's), plus
    :data:`SLACK_BYTES`. Where ``free < need`` the run stops at a later checkpoint unless space is freed."""
    held = out / CHECKPOINTS
    return free_bytes(out), run_bytes - (tree_bytes(held) if held.is_dir() else 0) + SLACK_BYTES


def least_room(disk: dict) -> int:
    """The free bytes without which a run saves nothing (``train --check`` refuses it): its first checkpoint with
    the trainer's margins, and at the end one checkpoint and the final weights."""
    one = disk["checkpoint_bytes"] if disk["checkpoints_kept"] else 0
    first = int(one * MARGIN) + SLACK_BYTES if one else 0
    return max(first, one + int(disk["final_bytes"] * FINAL_MARGIN))


def disk_line(disk: dict) -> str:
    """The memory plan's disk figures (memory/disk.py ``disk_plan``) in one line."""
    kept, each = disk["checkpoints_kept"], size_text(disk["checkpoint_bytes"])
    held = f"up to {kept} checkpoints at once, " if kept else "no checkpoints (save_steps 0), "
    final, run = size_text(disk["final_bytes"]), size_text(disk["run_bytes"])
    return f"a checkpoint ~{each}, the final weights ~{final}; {held}~{run} in all"


def room_to_convert(ds_dir: Path, universal: Path, eight_bit: bool) -> tuple[int, int, int]:
    """``(size, kept, peak)`` bytes of converting checkpoint state ``ds_dir`` into ``universal`` (ds/portable.py
    ``disk_plan``); a ConversionError in one line when its file system has less free than the peak."""
    size, kept, peak = portable.disk_plan(ds_dir, eight_bit)
    free, mib = free_bytes(ds_dir), 2**20
    if free < peak:
        raise portable.ConversionError(
            f"converting {ds_dir} for this world size / ZeRO stage needs {peak / mib:,.0f} MiB free beside it "
            f"({kept / mib:,.0f} MiB kept in {universal.name}/), the file system has {free / mib:,.0f} MiB: free "
            "space there (older checkpoints: save_total_limit), or resume on the world size and stage that wrote it"
        )
    return size, kept, peak


class DiskRoom:
    """Rank 0's reading of ``output_dir``'s free space before each write, shared with every rank."""

    def __init__(self, out: Path, rank: int):
        self.out, self.rank = out, rank
        self.last_checkpoint: int | None = None  # bytes of the last checkpoint this run wrote (rank 0)
        self.warned = False  # the whole run's need against the free space: said once
        self._plan: dict | None = None  # memory_plan.json's disk figures, read once (rank 0)

    def planned(self, key: str) -> int | None:
        """The memory plan's ``disk`` figure ``key`` (memory/disk.py), from ``memory_plan.json`` (rank 0 writes it
        at startup, and alone reads it: only its figures decide); None without one, and on the other ranks."""
        if self._plan is None and self.rank == 0:
            try:
                self._plan = json.loads((self.out / "memory_plan.json").read_text(encoding="utf-8"))["disk"]
            except (OSError, ValueError, KeyError, TypeError):  # no plan (its own failure was said at startup)
                self._plan = {}
        value = (self._plan or {}).get(key)
        return None if value is None else int(value)

    def checkpoint_bytes(self) -> int | None:
        """What the next checkpoint takes: the larger of the last one's size and the plan's (a reset reference joins
        the checkpoints after the first reset: the plan counts it from the start); before the first, a warning
        (rank 0) when the whole run will not fit: it will stop at a later checkpoint unless space is freed."""
        if self.last_checkpoint:
            return max(self.last_checkpoint, self.planned("checkpoint_bytes") or 0)
        run = None if self.warned else self.planned("run_bytes")
        try:
            free, need = (None, None) if run is None else run_room(self.out, run)
        except OSError:  # rank 0 alone: no warning rather than an error the other ranks would wait on
            free, need = None, None
        if free is not None and free < need:
            self.warned = True
            log.warning(
                f"glm-grpo: warning: {self.out}'s file system has {size_text(free)} free and this run holds up "
                f"to ~{size_text(run)} there (checkpoints and final weights; save_total_limit keeps fewer): it stops "
                "before a checkpoint that does not fit (exit 7) unless space is freed meanwhile"
            )
        return self.planned("checkpoint_bytes")

    def wrote_checkpoint(self, path: Path) -> None:
        if self.rank == 0:
            try:
                self.last_checkpoint = tree_bytes(path)
            except OSError:  # rank 0 alone: raising here would leave the others in the next collective
                pass  # the next check uses the plan's size

    def before(self, what: str, need: int | None, nbytes: int | None) -> None:
        """Collective: a :class:`Stopped` with exit status 7 on every rank when rank 0 finds less than ``need`` bytes
        free for ``what`` (e.g. ``checkpoint step_000300``, ``nbytes`` of it); nothing when ``need`` is None. Rank 0's
        reading failing (a stale NFS handle) is warned and lets the write try: the verdict still reaches every rank."""
        line = ""
        try:
            free = free_bytes(self.out) if self.rank == 0 and need else None
        except OSError as err:
            log.warning(f"glm-grpo: warning: the free space of {self.out} could not be read ({err}): writing {what}")
            free = None
        if free is not None and free < need:
            line = (
                f"glm-grpo train: stopped before writing {what}: {self.out}'s file system has {size_text(free)} free "
                f"and it takes ~{size_text(nbytes)} (needs {size_text(need)} free); nothing of it was written and "
                f"{_go_on(self.out)}"
            )
        if dist.any_rank(float(bool(line))):
            raise Stopped(line or "glm-grpo train: stopped: no room on output_dir's disk (rank 0's line)", EXIT_DISK)

    @contextlib.contextmanager
    def writing(self, what: str, nbytes: int | None, final: bool = False):
        """:meth:`before` (a checkpoint: ``nbytes`` + :data:`MARGIN` + :data:`SLACK_BYTES`; the ``final`` weights,
        after which the run writes nothing: ``nbytes`` x :data:`FINAL_MARGIN`), then the block that writes ``what``:
        an error it raises for a full disk or a quota becomes :class:`DiskFull` (:func:`full_disk`); any other
        passes as it is."""
        need = None if not nbytes else int(nbytes * (FINAL_MARGIN if final else MARGIN)) + (0 if final else SLACK_BYTES)
        self.before(what, need, nbytes)
        try:
            yield
        except (OSError, RuntimeError) as err:  # torch's writer raises RuntimeError ("unexpected pos ...")
            full = full_disk(err, what, self.out)
            if full is None:
                raise
            raise full from err
