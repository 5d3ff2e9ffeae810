"""Whether a checkpoint's files are whole, read cheaply before anything of a resume changes: the DeepSpeed files its
writing launch left (one model file, or one per rank at ZeRO-3; one optimizer file per rank at ZeRO-1 and above), each
rank's RNG file, and every ``.pt`` file an archive whose index can be read (a file cut short loses the index at its
end). A checkpoint is renamed into place only once complete (checkpoint.py), so what this finds came after: a copy
between clusters that stopped part way, a file removed by hand, a disk that failed. Without this, the resume loaded
the models, set the run's final weights aside and failed inside DeepSpeed with a traceback.

    problem = damage(path, world_size=8, zero_stage=2)   # None, or what is missing or cut short
    earlier = earlier_checkpoint(path)                    # the newest complete one before it, or None
    kept = keep_other_launchs(path, launch_id)            # another launch's step_N renamed earlier_step_N, or None

A checkpoint is written by one launch (``launch.id`` in its trainer state, checkpoint.save): a save of a step whose
folder another launch wrote (a branch the run went back from, another run's checkpoint copied in) keeps that one.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

ZIP_MAGIC = b"PK\x03\x04"  # torch.save's archive format (every DeepSpeed and RNG file this project writes)


def damage(path: Path, world_size: int, zero_stage: int) -> str | None:
    """What of checkpoint ``path`` (written on ``world_size`` ranks at ``zero_stage``) is missing or cut short, or
    None when nothing is."""
    ds = path / "ds"
    wanted = ["mp_rank_00_model_states.pt"] if zero_stage < 3 else []
    if zero_stage == 3:
        wanted += [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(world_size)]
    missing = [f"ds/{name}" for name in wanted if not (ds / name).is_file()]
    if zero_stage >= 1:  # bf16_ prefixed under DeepSpeed's bf16 optimizer: matched by the glob
        missing += [
            f"ds/zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
            for r in range(world_size)
            if not any(ds.glob(f"*zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
        ]
    rng = path / "rng"
    if rng.is_dir() and any(rng.iterdir()):  # checkpoints of every version since RNG files were written
        missing += [f"rng/rank_{r}.pt" for r in range(world_size) if not (rng / f"rank_{r}.pt").is_file()]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return f"{', '.join(missing[:3])}{more} {'is' if len(missing) == 1 else 'are'} missing"
    cut = [str(f.relative_to(path)) for folder in ("ds", "rng", "ahead") for f in sorted((path / folder).glob("*.pt"))]
    cut = [name for name in cut if not _whole(path / name)]
    if cut:
        return f"{', '.join(cut)} {'is' if len(cut) == 1 else 'are'} cut short (not a complete archive)"
    return None


def _whole(file: Path) -> bool:
    """A torch archive whose index (the zip's central directory, at its end) can be read; a file of another format
    (torch's legacy pickle) is taken as it is."""
    try:
        with file.open("rb") as f:
            head = f.read(4)
        if not head:
            return False
        if head != ZIP_MAGIC:
            return True
        with zipfile.ZipFile(file):
            return True
    except (OSError, zipfile.BadZipFile):
        return False


def _checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step_N`` folder in ``folder`` that holds a trainer state."""
    found = []
    for path in folder.glob("step_*"):
        suffix = path.name.split("_")[-1]
        if suffix.isdigit() and (path / "trainer_state.json").is_file():
            found.append((int(suffix), path))
    return found


def earlier_checkpoint(path: Path) -> Path | None:
    """The newest checkpoint beside ``path`` with a lower step and a trainer state (None: there is none)."""
    try:
        step = int(path.name.split("_")[-1])
    except ValueError:
        return None
    found = [(n, other) for n, other in _checkpoints(path.parent) if n < step]
    return max(found)[1] if found else None


def keep_other_launchs(path: Path, launch_id: str) -> Path | None:
    """Checkpoint ``path``, when another launch than ``launch_id`` wrote it (or its state cannot be read), renamed
    ``earlier_<name>`` (``~1``, ``~2``, ... when taken; no longer a ``step_*`` that pruning or a resume would find);
    returns the new path, None when there is nothing to keep."""
    if not path.exists():
        return None
    try:
        if json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))["launch"]["id"] == launch_id:
            return None  # this launch's own save of the step: replaced
    except (OSError, ValueError, KeyError, TypeError):  # JSONDecodeError is a ValueError
        pass
    target = untaken(path.with_name(f"earlier_{path.name}"))
    path.rename(target)
    return target


def untaken(path: Path) -> Path:
    """``path``, else ``path~1``, ``path~2``, ...: the first name not taken, for saved weights set aside (never over
    earlier ones)."""
    target, n = path, 1
    while target.exists():
        target, n = path.with_name(f"{path.name}~{n}"), n + 1
    return target


def damage_line(path: Path, world_size: int, zero_stage: int) -> str | None:
    """The line refusing a resume from damaged checkpoint ``path`` with the way on (None when it is whole)."""
    problem = damage(path, world_size, zero_stage)
    if problem is None:
        return None
    earlier = earlier_checkpoint(path)
    if earlier is not None:
        way = f"resume from the one before it (resume_from={earlier}), or copy it again from where it came"
    elif (path / "adapter").is_dir():
        way = f"copy it again from where it came, or start a new run from its adapter (lora.init_from={path}/adapter)"
    else:
        way = "copy it again from where it came; no earlier checkpoint is beside it"
    return f"{path} is damaged: {problem}; {way}; nothing was changed"


def stale_latest(pointer: Path, named: str) -> str:
    """The line refusing ``resume_from=latest`` when ``checkpoints/latest`` (``pointer``) is empty or names a checkpoint
    that is not there (edited, or copied without it), with the newest checkpoint that is."""
    what = "is empty" if not named else f"names {named}, which is not there"
    found = _checkpoints(pointer.parent)
    if not found:
        return f"resume_from=latest: {pointer} {what}, and {pointer.parent} holds no checkpoint; nothing was changed"
    newest = max(found)[1]
    return (
        f"resume_from=latest: {pointer} {what}; the newest checkpoint there is {newest.name}: resume_from={newest} "
        "goes on from it; nothing was changed"
    )
