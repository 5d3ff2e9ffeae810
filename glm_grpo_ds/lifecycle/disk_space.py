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
import json
import shutil
from pathlib import Path

from ..ds import dist, portable
from ..runtime import log
from .checkpoint import CHECKPOINTS, LATEST, CheckpointError
from .preempt import Stopped

EXIT_DISK = 7  # exit status of a run stopped for want of disk space (2 = bad input, 3 = non-finite, ...)
MARGIN = 1.1  # a checkpoint grows a little from one to the next (a reset reference, an average kept)
SLACK_BYTES = 256 * 2**20  # what the run writes beside the checkpoint meanwhile: logs, metrics, galleries


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
    """Where the run stands on disk and how to go on, for the stop's line."""
    pointer = out / CHECKPOINTS / LATEST
    name = pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else ""
    room = "free space (save_total_limit keeps fewer checkpoints)"
    if not name:
        return f"the run has no checkpoint yet: {room}, then launch it again"
    return f"the last checkpoint is {name} (checkpoints/latest): {room}, then resume with resume_from=latest"


def full_disk(err: Exception, where: Path) -> DiskFull | None:
    """``err``, raised writing under ``where``, as a :class:`DiskFull` line when the file system is (nearly) full;
    None otherwise (the error is something else: raise it as it is)."""
    free = free_bytes(where)
    if free >= SLACK_BYTES:
        return None
    msg = " ".join(str(err).split())[:200] or type(err).__name__
    return DiskFull(
        f"writing {where} failed with {free / 2**20:,.0f} MiB left on its file system ({type(err).__name__}: {msg}); "
        "the checkpoint before it is intact and a resume removes the partial one: free space, then resume with "
        "resume_from=latest"
    )


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

    def planned(self, key: str) -> int | None:
        """The memory plan's ``disk`` figure ``key`` (memory/disk.py), from ``memory_plan.json`` (rank 0 writes it
        at startup); None without one."""
        try:
            return int(json.loads((self.out / "memory_plan.json").read_text(encoding="utf-8"))["disk"][key])
        except (OSError, ValueError, KeyError, TypeError):  # no plan (its own failure was said at startup)
            return None

    def checkpoint_bytes(self) -> int | None:
        """What the next checkpoint takes: the last one's size, else the plan's (and, rank 0, a warning when the
        whole run will not fit: it will stop at a later checkpoint unless space is freed)."""
        if self.last_checkpoint:
            return self.last_checkpoint
        run = self.planned("run_bytes") if self.rank == 0 and not self.warned else None
        if run is not None:  # less what its checkpoints already hold (a resumed run's)
            held = self.out / CHECKPOINTS
            run -= tree_bytes(held) if held.is_dir() else 0
        if run is not None and free_bytes(self.out) < run + SLACK_BYTES:
            self.warned = True
            free = free_bytes(self.out)
            log.warning(
                f"glm-grpo: warning: {self.out}'s file system has {size_text(free)} free and this run holds up "
                f"to ~{size_text(run)} there (checkpoints and final weights; save_total_limit keeps fewer): it stops "
                "before a checkpoint that does not fit (exit 7) unless space is freed meanwhile"
            )
        return self.planned("checkpoint_bytes")

    def wrote_checkpoint(self, path: Path) -> None:
        if self.rank == 0:
            self.last_checkpoint = tree_bytes(path)

    def before(self, what: str, nbytes: int | None) -> None:
        """Collective: a :class:`Stopped` with exit status 7 on every rank when rank 0 finds less room than
        ``nbytes`` (with margins) for ``what`` (e.g. ``checkpoint step_000300``); nothing when ``nbytes`` is None."""
        line = ""
        if self.rank == 0 and nbytes:
            free, need = free_bytes(self.out), int(nbytes * MARGIN) + SLACK_BYTES
            if free < need:
                line = (
                    f"glm-grpo train: stopped before writing {what}: {self.out}'s file system has "
                    f"{size_text(free)} free and it takes ~{size_text(nbytes)} (with margins {size_text(need)}); "
                    f"nothing of it was written and {_go_on(self.out)}"
                )
        if dist.any_rank(float(bool(line))):
            raise Stopped(line or "glm-grpo train: stopped: no room on output_dir's disk (rank 0's line)", EXIT_DISK)

    @contextlib.contextmanager
    def writing(self, what: str, nbytes: int | None):
        """:meth:`before`, then the block that writes ``what``: an error it raises on a (nearly) full file system
        becomes :class:`DiskFull` (:func:`full_disk`); any other passes as it is."""
        self.before(what, nbytes)
        try:
            yield
        except (OSError, RuntimeError) as err:  # torch's writer raises RuntimeError ("unexpected pos ...")
            full = full_disk(err, self.out)
            if full is None:
                raise
            raise full from err
