"""Checkpoints: atomic saves, a ``latest`` pointer, pruning, and exact resume.

Layout under ``output_dir/checkpoints/``::

    step_000200/
        ds/                 DeepSpeed state of every rank (model, optimizer, scheduler)
        adapter/            the LoRA adapter in peft format, gathered from ZeRO-3 shards
        rng/rank_<r>.pt     python / numpy / torch / CUDA RNG states of each rank
        ahead/rank_<r>.pt   rollout.one_step_off: each rank's rollout drawn for the next step, not yet trained on
        reference-<i>.safetensors  grpo.ref_sync_steps: the reset reference (LoRA's copy, full fine-tuning's mix)
        universal/          written by the first resume on another world size or ZeRO stage (ds/portable.py)
        trainer_state.json  step, data position, world size, ZeRO stage, the config
    latest                  the name of the newest complete checkpoint

Every rank writes into the checkpoint directory (creating the directories it writes to) and rank 0
completes it, so on several nodes ``output_dir`` must be storage every node shares: checked at startup,
before any model loads, by storage.py, which also makes every rank resume from what rank 0 resolves.

A checkpoint is written to ``step_N.tmp/`` and renamed when complete (another launch's ``step_N`` kept as
``earlier_step_N``); ``latest`` is replaced atomically afterwards. A run killed mid-write leaves a ``.tmp`` directory
(removed on the next start) and the previous ``latest`` intact.

Pruning (``save_total_limit``) runs on rank 0 after the save's last barrier (with ``later``, on rank 0's worker
thread, lifecycle/background.py: no rank waits while it deletes), after ``latest`` points at the new checkpoint,
counts only this run's checkpoints (``run_id`` in ``trainer_state.json``, kept across resumes) by step, never deletes
the one ``latest`` names, and renames a checkpoint ``step_N.deleting`` before deleting it (a crash leaves no half-
deleted ``step_N``). A fresh run (no ``resume_from``, or ``resume_from=auto`` without a ``latest``) refuses an
``output_dir`` holding an earlier run's checkpoints, metrics or final weights (:func:`start_fresh`) unless
``overwrite_output_dir`` is true, which deletes them first.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import torch

from ..ds import dist, portable
from ..ds import io as ds_io
from ..runtime import log
from ..runtime.atomic_files import write_text_atomic
from ..runtime.seeding import rng_state, seed_everything, set_rng_state
from . import checkpoint_files

CHECKPOINTS = "checkpoints"
LATEST, BEST = "latest", "best"  # pointers: the newest complete checkpoint; the best evaluated one (best.py)
AHEAD = "ahead"
REFERENCE_FILES = "reference-*.safetensors"  # grpo.ref_sync_steps' reference (model/reference.py), in order
# lora.ema_decay's average of the adapter in peft format (model/ema.py): the run's final one, each checkpoint's
FINAL_ADAPTER_EMA, ADAPTER_EMA = "final_adapter_ema", "adapter_ema"


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed; the message says why and what to do."""


class OutputDirError(ValueError):
    """``output_dir`` cannot be created or written; the message names the path and the fix."""


def check_output_dir(output_dir, rank: int, create: bool = True) -> Path:
    """Create ``output_dir`` if needed and prove it writable by creating and removing a probe file (``os.access`` alone
    is not enough: root, ACLs and read-only mounts fool it). Every rank checks (each writes its own checkpoint files),
    before any model is loaded. ``create=False`` (``train --check``) creates nothing: the probe goes into the nearest
    folder that exists."""
    out = Path(output_dir)
    fix = "pick another output_dir= or fix its permissions"
    # the nearest part already there (os.path: an unreadable parent is False, not a PermissionError)
    blocking = next((p for p in (out, *out.parents) if os.path.exists(p)), None)
    if blocking is not None and not os.path.isdir(blocking):  # mkdir's "File exists" reads as a permission problem
        what = f"output_dir {out}" if blocking == out else f"output_dir {out}: {blocking}"
        raise OutputDirError(f"{what} is a file, not a directory; pick another output_dir= or move the file away")
    where = out
    if create:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OutputDirError(f"output_dir {out} cannot be created ({err.strerror or err}); {fix}") from None
    elif blocking is not None:
        where = blocking
    probe = where / f".write_probe_rank{rank}_{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        verb = "is not writable" if where == out else f"cannot be created in {where}"
        raise OutputDirError(f"output_dir {out} {verb} ({err.strerror or err}); {fix}") from None
    if not os.access(where, os.W_OK | os.X_OK):
        raise OutputDirError(f"output_dir {out} is not writable; {fix}")
    return out


# What an earlier run leaves in output_dir that a fresh start would overwrite or mix with its own.
EARLIER_RUN_OUTPUTS = (CHECKPOINTS, "metrics.jsonl", "final_adapter", FINAL_ADAPTER_EMA, "final_model")
# Deleted too by overwrite_output_dir=true: outputs a new run would mix with its own (config.json, the plan, the plot:
# rewritten whole by every run).
OVERWRITTEN_OUTPUTS = (*EARLIER_RUN_OUTPUTS, "eval.jsonl", "samples", "samples.jsonl", "tensorboard", "logs")


def earlier_run(output_dir: Path) -> list[str]:
    """The outputs of an earlier run found in ``output_dir`` (empty: nothing a fresh run would
    destroy). An empty ``metrics.jsonl`` (a run that failed before its first step) does not count."""
    found = []
    ckpts = output_dir / CHECKPOINTS
    if ckpts.is_dir() and any(
        p.name == LATEST or (p.is_dir() and p.name.startswith("step_") and p.suffix not in (".tmp", ".deleting"))
        for p in ckpts.iterdir()
    ):
        found.append(f"{CHECKPOINTS}/")
    metrics = output_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(metrics.name)
    found += [f"{name}/" for name in ("final_adapter", "final_model") if (output_dir / name).exists()]
    return found


def start_fresh(output_dir: Path, overwrite: bool, rank: int) -> None:
    """Before a fresh run (collective, before any model loads): refuse an ``output_dir`` holding an
    earlier run on any rank, or with ``overwrite`` delete that run's outputs (rank 0)."""
    found = earlier_run(output_dir)
    # every rank decides alike even when only some see the files (node-local output_dir)
    if not dist.any_rank(float(bool(found))):
        return
    if not overwrite:
        what = ", ".join(found) if found else "files on another rank's storage"
        # without a `latest` there is nothing to resume (resume_from=auto came here for that reason)
        over = "start over with overwrite_output_dir=true (deletes it)"
        go_on = going_on(output_dir)
        if (output_dir / CHECKPOINTS / LATEST).is_file() or not found:
            ways = f"continue it with resume_from=auto (or latest), or {over}, or pick another output_dir="
        elif go_on:
            ways = f"it has no checkpoint to resume from {NO_CHECKPOINT}; {go_on}, or {over}"
        else:
            ways = f"it has no checkpoint to resume from {NO_CHECKPOINT}; {over}, or pick another output_dir="
        raise OutputDirError(f"output_dir {output_dir} holds an earlier run ({what}); {ways}")
    if rank == 0:
        # `latest` first: a kill mid-delete must not leave it naming a half-deleted checkpoint (resume_from=auto)
        (output_dir / CHECKPOINTS / LATEST).unlink(missing_ok=True)
        for path in (output_dir / name for name in OVERWRITTEN_OUTPUTS):
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    dist.barrier()


NO_CHECKPOINT = "(save_steps writes them)"  # said wherever a run without checkpoints is refused a resume


def going_on(output_dir: Path) -> str | None:
    """How to go on from a run without checkpoints, said where its resume is refused: from its final adapter, if any."""
    final = output_dir / "final_adapter"
    if not final.is_dir():
        return None
    return f"go on from its final adapter with lora.init_from={final} and another output_dir="


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def point_latest(output_dir: Path, name: str) -> None:
    """``checkpoints/latest`` names checkpoint ``name`` (replaced atomically)."""
    write_text_atomic(Path(output_dir) / CHECKPOINTS / LATEST, name)


def remove_stale(output_dir: str | os.PathLike) -> None:
    """Delete half-written ``*.tmp`` and half-pruned ``*.deleting`` checkpoints left by a killed run, and a killed
    conversion's ``step_N/universal.tmp`` (up to twice the optimizer state; ds/portable.py) (rank 0 only)."""
    root = Path(output_dir) / CHECKPOINTS
    if root.is_dir():
        converting = root.glob(f"step_*/{portable.UNIVERSAL}.tmp")
        for stale in [*root.glob("*.tmp"), *root.glob("*.deleting"), *converting]:
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)


def prune(root: Path, keep: int, run_id: str | None, launch: dict | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints of run ``run_id`` under ``root`` (rank 0; call
    only after ``latest`` names the newest). Ordered by the step in their trainer state; other runs'
    checkpoints and the ones ``latest`` and ``best`` name are never deleted, nor a branch this launch went back from
    (``launch``: ``{"id", "from_step"}``; a checkpoint past ``from_step`` that another launch wrote): resumed from
    step_300 with step_347 left from a run that diverged, the limit counts 300 and this launch's, and deletes 300
    last. Returns the deleted paths."""
    named = {p.read_text(encoding="utf-8").strip() for p in (root / LATEST, root / BEST) if p.is_file()}
    mine = []
    for path in root.glob("step_*"):
        if not path.is_dir() or path.suffix in (".tmp", ".deleting"):
            continue
        try:
            state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
            left_behind = launch is not None and int(state["step"]) > launch["from_step"]
            if state.get("run_id") == run_id and not (
                left_behind and state.get("launch", {}).get("id") != launch["id"]
            ):
                mine.append((int(state["step"]), path))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # JSONDecodeError is a ValueError
            # not a complete checkpoint of ours (a hand-edited or foreign state): never pruned. Raised, it would
            # surface on rank 0 alone at its next checkpoint, the others waiting in a collective
            continue
    deleted = []
    for _, path in sorted(mine)[:-keep]:
        if path.name in named:  # the newest, and save_best's best (lifecycle/best.py)
            continue
        shutil.rmtree(_set_aside(path))  # a crash mid-delete leaves a .deleting dir, not a broken step_N
        deleted.append(path)
    return deleted


def prune_or_warn(root: Path, keep: int, run_id: str | None, launch: dict | None = None) -> None:
    """:func:`prune`, with a failure (a file system error) as one warning line: the new checkpoint is
    complete, the run goes on, and the next prune tries again."""
    try:
        prune(root, keep, run_id, launch)
    except OSError as err:
        log.warning(
            f"glm-grpo: warning: pruning old checkpoints in {root} (save_total_limit={keep}) failed "
            f"({err.strerror or err}: {err.filename}); the newest checkpoints are intact; delete old ones by hand"
        )


def _set_aside(path: Path) -> Path | None:
    """Rename checkpoint ``path``, when there is one, to ``<name>.deleting`` (atomic) and return the new path: the
    caller deletes it once the new checkpoint holds the name. Deleted in place, a multi-GB directory would leave
    ``latest`` naming a half-deleted checkpoint for as long as the deletion takes (a kill then loses the run's
    resume point); renamed, a kill leaves a ``.deleting`` folder that :func:`remove_stale` clears."""
    if not path.exists():
        return None
    aside = path.with_name(path.name + ".deleting")
    if aside.exists():
        shutil.rmtree(aside)
    os.replace(path, aside)
    return aside


def save(
    engine,
    output_dir,
    step: int,
    trainer_state: dict,
    rank: int,
    is_lora: bool,
    total_limit: int,
    later: Callable[[Callable[[], object]], None] | None = None,
    ahead: dict | None = None,
    more: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint ``step`` (all ranks call this) and return its final path. ``later(job)``: where rank 0 runs the
    pruning (default: at once, after the last barrier). ``ahead``: this rank's rollout drawn ahead for the next step
    (tensors, lists, numbers), written to ``ahead/rank_<r>.pt``. ``more(dir)``: every rank writes the rest there."""
    root = Path(output_dir) / CHECKPOINTS
    final = root / step_dir_name(step)
    tmp = root / (step_dir_name(step) + ".tmp")
    if rank == 0 and tmp.exists():
        shutil.rmtree(tmp)
    dist.barrier()
    # Every rank creates the directories it writes to (as DeepSpeed does for its shards) rather than rely
    # on rank 0's mkdir being visible to it: harmless on the shared storage output_dir must be (storage.py).
    (tmp / "rng").mkdir(parents=True, exist_ok=True)
    ds_io.save_ds_checkpoint(engine, tmp)
    torch.save(rng_state(), tmp / "rng" / f"rank_{rank}.pt")
    if ahead is not None:
        (tmp / AHEAD).mkdir(exist_ok=True)
        torch.save(ahead, tmp / AHEAD / f"rank_{rank}.pt")  # device tensors: load_ahead maps them to the CPU
    if is_lora:
        ds_io.save_adapter(engine, tmp / "adapter", rank)
    if more is not None:
        more(tmp)
    dist.barrier()
    if rank == 0:
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2), encoding="utf-8")
        kept = checkpoint_files.keep_other_launchs(final, trainer_state.get("launch", {}).get("id"))
        if kept is not None:  # a branch this run went back from, or another run's copied in: kept, not replaced
            log.warning(f"glm-grpo: {final} was written by another launch: kept as {kept.name}")
        earlier = _set_aside(final)  # this launch's own save of the step, replaced
        os.replace(tmp, final)
        point_latest(output_dir, final.name)
        if earlier is not None:
            shutil.rmtree(earlier)
    dist.barrier()
    if rank == 0 and total_limit > 0:  # `latest` names the new checkpoint; no rank waits for the deletion
        job = functools.partial(
            prune_or_warn, root, total_limit, trainer_state.get("run_id"), trainer_state.get("launch")
        )
        if later is None:
            job()
        else:
            later(job)
    return final


def resume_path(output_dir, resume_from: str | None) -> Path | None:
    """The checkpoint a run resumes from, or None for a fresh start: ``auto`` resumes from ``latest`` when
    ``output_dir`` has one and starts fresh otherwise; ``latest`` and a path must exist (:func:`resolve`)."""
    if not resume_from:
        return None
    if resume_from == "auto":
        if not (Path(output_dir) / CHECKPOINTS / LATEST).is_file():
            return None
        resume_from = "latest"
    return resolve(output_dir, resume_from)


def resolve(output_dir, resume_from: str) -> Path:
    """``latest`` -> the newest complete checkpoint of ``output_dir``; else a checkpoint path."""
    if resume_from == "latest":
        pointer = Path(output_dir) / CHECKPOINTS / LATEST
        if not pointer.is_file():
            go_on = going_on(Path(output_dir))
            raise CheckpointError(
                f"resume_from=latest but {pointer} does not exist: no checkpoint was completed in {output_dir} "
                + NO_CHECKPOINT
                + (f"; {go_on}" if go_on else "")
            )
        named = pointer.read_text(encoding="utf-8").strip()
        path = pointer.parent / named
        if not named or not path.exists():
            raise CheckpointError(checkpoint_files.stale_latest(pointer, named))
    else:
        path = Path(resume_from)
    if not path.exists():
        there = ", ".join(sorted(p.name for p in path.parent.glob("step_*") if (p / "trainer_state.json").is_file()))
        listed = f"the checkpoints in {path.parent}: {there}" if there else f"{path.parent} holds none"
        raise CheckpointError(f"resume_from {path} does not exist ({listed}; resume_from=latest takes the newest)")
    if not (path / "trainer_state.json").is_file() or not (path / ds_io.DS_TAG).is_dir():
        raise CheckpointError(f"{path} is not a complete checkpoint (needs trainer_state.json and {ds_io.DS_TAG}/)")
    return path


def read_state(path: Path) -> dict:
    try:
        state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
        int(state["step"]), written_on(state)  # what a resume reads of it first
        return state
    except (OSError, ValueError, KeyError, TypeError) as err:  # JSONDecodeError, UnicodeDecodeError: ValueErrors
        what = err.msg if isinstance(err, json.JSONDecodeError) else f"{type(err).__name__}: {err}"
        msg = f"{path}/trainer_state.json is not a trainer state ({what}); resume from another checkpoint"
        raise CheckpointError(msg) from None


def check_compatible(path: Path, world_size: int, zero_stage: int) -> dict:
    """The checkpoint's trainer state, or CheckpointError if this launch cannot resume it (cheap: call before loading
    any model). Another world size or ZeRO stage resumes through a universal checkpoint (ds/portable.py); a stage
    without ZeRO's partitioned optimizer can neither take one nor be converted into one."""
    state = read_state(path)
    broken = checkpoint_files.damage_line(path, *written_on(state))
    if broken:
        raise CheckpointError(broken)
    moved = written_on(state) != (world_size, zero_stage)
    if moved and written_on(state)[1] not in (1, 2, 3):
        raise CheckpointError(
            f"{path} was written with world size {state['world_size']} and ZeRO stage {state['zero_stage']}, whose "
            f"optimizer state is not ZeRO's partitioned one and cannot be converted for world size {world_size} and "
            f"stage {zero_stage}: resume it with world size {state['world_size']} at stage {state['zero_stage']}, or "
            f"start a new run from its LoRA adapter (lora.init_from={path / 'adapter'}); nothing was changed"
        )
    if moved and zero_stage not in (1, 2, 3):
        raise CheckpointError(
            f"{path} was written with world size {state['world_size']} and ZeRO stage {state['zero_stage']}; this run "
            f"has world size {world_size} and stage {zero_stage}, and only ZeRO-1, 2 or 3 take a checkpoint written on "
            "another world size or stage: launch with --deepspeed ds_configs/zero2.json (or zero1 / zero3); nothing "
            "was changed"
        )
    return state


def written_on(state: dict) -> tuple[int, int]:
    """(world size, ZeRO stage) of the launch that wrote a checkpoint (its trainer state)."""
    return int(state["world_size"]), int(state["zero_stage"])


def load(engine, path: Path, rank: int, opt_cfg, reseed: int | None = None) -> tuple[dict, float]:
    """Restore DeepSpeed and RNG state from ``path``, with ``opt_cfg`` (this launch's ``optimizer`` section) over
    the optimizer settings the checkpoint held (ds/io.load_ds_checkpoint); (its trainer state, the lr of the
    next step). ``reseed``: the checkpoint was written on another world size or stage (its universal folder is
    loaded, ds/portable.py); each rank's RNG then starts from that seed, not from a file another rank wrote."""
    state = read_state(path)
    if reseed is None:
        lr = ds_io.load_ds_checkpoint(engine, path, opt_cfg)
        rng = path / "rng" / f"rank_{rank}.pt"
        if rng.is_file():
            set_rng_state(torch.load(rng, weights_only=True))
    else:
        lr = ds_io.load_universal_checkpoint(engine, path, opt_cfg)
        seed_everything(reseed)
    return state, lr


def load_ahead(path: Path, rank: int) -> dict | None:
    """This rank's rollout drawn ahead in checkpoint ``path`` (:func:`save`'s ``ahead``); None for none (on-policy)."""
    file = path / AHEAD / f"rank_{rank}.pt"
    return torch.load(file, map_location="cpu", weights_only=True) if file.is_file() else None


def ahead_states(path: Path) -> list[dict]:
    """Every rank's rollout drawn ahead in checkpoint ``path``, in rank order ([] when it holds none)."""
    files = sorted((path / AHEAD).glob("rank_*.pt"), key=lambda f: int(f.stem.split("_")[1]))
    return [torch.load(f, map_location="cpu", weights_only=True) for f in files]
