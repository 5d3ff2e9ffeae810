"""What a resumed run says and does about the state it finds (issue #27): a finished run is left alone,
a final adapter older than the steps about to be trained is set aside, and a prompt source changed since
the checkpoint is reported. Used by glm_grpo_ds/train.py; tested in tests/unit/test_resume.py.

* ``finished(state, max_steps)``: the checkpoint is at (or past) ``max_steps``: nothing to train. The
  trainer stops before loading any model, writes nothing, exits 0.
* ``set_aside_final(output_dir, resume_step, max_steps)``: ``final_adapter/`` / ``final_model/`` of an
  earlier end of this run, about to be outdated by more steps (or replaced by an earlier step's, max_steps
  lowered), is renamed ``<name>.step<K>`` (K = the step it holds), so ``final_*`` always matches the last line
  of ``metrics.jsonl``; nothing is deleted.
* ``data_fingerprint(source, rows)`` / ``data_changed(...)``: a cheap fingerprint of the prompt source,
  kept in each checkpoint and compared on resume (a warning: the resume is exact only for the same data).
* ``go_on(output_dir, fix)``: how a stopped run goes on (the checkpoint ``latest`` names, or a new launch),
  for the lines of a stop (a full disk: disk_space.py; out of memory: glm_grpo_ds/memory/oom.py).
* ``config_changes(saved, now)`` / ``changes_line(...)`` / ``segments(...)``: the settings a resumed run
  changed against its checkpoint's config (one warning listing each key, old -> new), and the history kept in
  ``config.json`` (``segments``: from which step which settings changed), which the model card reports. Changed
  optimizer settings (lr, betas, eps, weight decay, clipping, schedule, warmup) apply from the first resumed step: the
  checkpoint load puts them over the restored optimizer and scheduler state (ds/engine.apply_optimizer_config).
* ``refused_change(changes, path, lora)``: the one line refusing a change that cannot be applied after the load
  (``optimizer.name``: the checkpoint's optimizer state is that optimizer's), before any model loads.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .checkpoint import CHECKPOINTS, LATEST
from .checkpoint_files import untaken

FINALS = ("final_adapter", "final_model")  # the run's end: written last, what says a run finished
# set aside with them: lora.ema_decay's average of the adapter at the run's end (written first, model/ema.py)
SET_ASIDE = (*FINALS, "final_adapter_ema")


class NothingToDo(Exception):
    """The checkpoint to resume already reached max_steps (the message is the line to print; exit 0)."""


FINAL_STATE = "training_state.json"  # written into final_*/ by the trainer: the step the weights are from
_EDGE = 1 << 20  # bytes hashed at each end of a prompt file
_EDGE_ROWS = 64  # rows hashed at each end of a dataset


def final_written(output_dir: Path, step: int) -> bool:
    """Whether ``output_dir`` holds the final weights of ``step`` (a ``final_*/`` whose training state says so)."""
    for name in FINALS:
        record = Path(output_dir) / name / FINAL_STATE
        try:
            if record.is_file() and int(json.loads(record.read_text(encoding="utf-8"))["step"]) == step:
                return True
        except (ValueError, KeyError, TypeError):  # a half-written record: not written
            continue
    return False


def finished(state: dict, max_steps: int, output_dir: Path | None = None, follows_latest: bool = False) -> str | None:
    """The one line to print when the checkpoint already reached ``max_steps`` and (given ``output_dir``) the final
    weights of that step are written, else None: a run stopped at its last step (a signal, an alarm) or killed while
    writing ``final_*/`` resumes to write them. ``follows_latest`` (resume_from auto / latest, as a requeued job
    resumes): the final weights of ``max_steps`` finish the run too when its newest checkpoint is older (save_steps
    not dividing max_steps): the relaunch trained the last steps again and set the final weights aside. A checkpoint
    named by its path is a choice to train from it again."""
    step = int(state["step"])
    if follows_latest and output_dir is not None and step < max_steps and final_written(output_dir, max_steps):
        return (
            f"glm-grpo train: nothing to do: the run finished at step {max_steps} of max_steps={max_steps} (its final "
            f"weights are in {output_dir}; the newest checkpoint is step {step}); raise max_steps to train further; "
            "nothing was changed"
        )
    if step < max_steps or (output_dir is not None and not final_written(output_dir, step)):
        return None
    return (
        f"glm-grpo train: nothing to do: the run finished at step {step} of max_steps={max_steps} "
        f"(raise max_steps to train further); nothing was changed"
    )


def write_final_state(final_dir: Path, step: int) -> None:
    (final_dir / FINAL_STATE).write_text(json.dumps({"step": step}) + "\n")


def set_aside_final(output_dir: Path, resume_step: int, max_steps: int) -> list[str]:
    """Rename earlier ``final_*`` dirs that this launch's final weights will replace; returns the log lines (rank 0).
    A checkpoint at or past ``max_steps`` (max_steps lowered) writes its own step's final weights at once: final
    weights of that step stay, those of another (a later step, with no checkpoint left of it) are set aside too."""
    lines = []
    ends_at = max(resume_step, max_steps)
    for name in SET_ASIDE:
        final = output_dir / name
        if not final.is_dir():
            continue
        state = final / FINAL_STATE
        step = json.loads(state.read_text())["step"] if state.is_file() else None
        if resume_step >= max_steps and step == resume_step:
            continue  # its own end, or the one a kill cut short (rewritten in place, run.py)
        # a name taken by an earlier rename gets ~1, ~2, ...: never overwrite saved weights
        target = untaken(output_dir / (f"{name}.step{step}" if step is not None else f"{name}.earlier"))
        final.rename(target)
        lines.append(
            f"glm-grpo: {name}/ (from step {step if step is not None else '?'}) moved to {target.name}/: this "
            f"run ends at step {ends_at}, and {name}/ will hold its end"
        )
    return lines


def other_run(output_dir: Path, path: Path, state: dict) -> str | None:
    """The line refusing a resume of another run's checkpoint (``path``, its trainer ``state``) into an
    ``output_dir`` that holds a run of its own: metrics.jsonl and config.json would hold one run's steps, then the
    other's, as one history. None for a checkpoint inside ``output_dir`` (a moved or copied run: its own), one of the
    run ``output_dir``'s ``latest`` names, or an ``output_dir`` holding no run (a run continued in a new folder)."""
    out = Path(output_dir)
    if Path(path).resolve().is_relative_to((out / CHECKPOINTS).resolve()):
        return None
    latest = out / CHECKPOINTS / LATEST
    try:
        saved = latest.parent / latest.read_text(encoding="utf-8").strip() / "trainer_state.json"
        mine = json.loads(saved.read_text(encoding="utf-8"))["run_id"]
    except (OSError, ValueError, KeyError, TypeError):  # none, or unreadable: the metrics say whether a run is there
        mine = None
    metrics = out / "metrics.jsonl"
    if mine is None and not (metrics.is_file() and metrics.stat().st_size > 0):
        return None
    if mine is not None and mine == state.get("run_id"):
        return None
    adapter = f", or start from its adapter with lora.init_from={path}/adapter" if state.get("lora") else ""
    return (
        f"{path} is another run's checkpoint than the run in output_dir {out}: resumed there, metrics.jsonl and "
        f"config.json would mix the two runs' steps; resume it with a new output_dir={adapter}; nothing was changed"
    )


def data_fingerprint(source: str, rows) -> dict:
    """``{"source", "rows", "sha256"}`` of a prompt source: a local file's size and its first and last MiB;
    otherwise (a dataset directory, a Hub id) the prompts of its first and last 64 rows. Cheap, not
    complete: an edit in the middle of a large dataset goes unseen."""
    digest = hashlib.sha256()
    path = Path(source)
    if path.is_file():
        size = path.stat().st_size
        digest.update(str(size).encode())
        with path.open("rb") as f:
            digest.update(f.read(_EDGE))
            f.seek(max(0, size - _EDGE))
            digest.update(f.read(_EDGE))
    else:
        n = len(rows)
        for i in [*range(min(n, _EDGE_ROWS)), *range(max(_EDGE_ROWS, n - _EDGE_ROWS), n)]:
            digest.update(rows[i].prompt.encode() + b"\0")
    return {"source": str(source), "rows": len(rows), "sha256": digest.hexdigest()}


def data_changed(saved: dict | None, now: dict) -> str | None:
    """A warning when the checkpoint's fingerprint differs from the data's now (None for checkpoints
    written before fingerprints, or the same data: at another path too, a file moved)."""
    if not saved or all(saved.get(key) == now[key] for key in ("rows", "sha256")):
        return None
    return (
        f"data.train_file {now['source']} differs from the one this checkpoint was trained on "
        f"({saved['source']}, {saved['rows']} rows; now {now['rows']} rows, other contents): the resumed run "
        "samples other prompts than an uninterrupted run would (the resume is exact only for the same data)"
    )


# keys that say how a launch starts, not how the model is trained: not reported as changes
START_KEYS = ("resume_from", "overwrite_output_dir", "allow_batch_change")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _entry_defaults(entry):
    """A ``rewards`` entry of a checkpoint's config with the RewardSpec settings added since at their defaults."""
    if not isinstance(entry, dict):
        return entry
    from ..config import RewardSpec
    from ..config.loading import to_dict

    return {**to_dict(RewardSpec()), **entry}


def config_changes(saved: dict | None, now: dict, defaults: dict | None = None) -> dict[str, list]:
    """``{dotted key: [old, new]}`` between the checkpoint's config (``to_dict`` form; None for checkpoints from
    before it was kept) and this launch's, :data:`START_KEYS` left out. A key the checkpoint's config lacks (a setting
    added since) had its value in ``defaults`` (``to_dict(TrainConfig())``): that run ran with the default."""
    if not saved:
        return {}
    before, after, default = _flat(saved), _flat(now), _flat(defaults or {})
    if isinstance(before.get("rewards"), list):  # an entry's setting added since (label) had its default
        before["rewards"] = [_entry_defaults(r) for r in before["rewards"]]
    # only a key new in a section the checkpoint has: a section it holds as null (lora for full fine-tuning) stays
    # null, so switching to LoRA still lists lora.* as changes
    sections = {key.rpartition(".")[0] for key in before}
    for key in after.keys() - before.keys():
        if key in default and key.rpartition(".")[0] in sections:
            before[key] = default[key]
    keys = sorted((before.keys() | after.keys()) - set(START_KEYS))
    return {key: [before.get(key), after.get(key)] for key in keys if before.get(key) != after.get(key)}


def changes_line(changes: dict[str, list], step: int) -> str:
    """The warning a resume with other settings prints: each changed key, old -> new."""
    listed = "; ".join(f"{key} {json.dumps(old)} -> {json.dumps(new)}" for key, (old, new) in changes.items())
    return (
        f"glm-grpo: warning: resuming at step {step} with {len(changes)} changed setting(s): {listed}. Steps "
        f"1-{step} ran with the old values (config.json's segments and the model card say so)"
    )


# changes a resume cannot apply over its checkpoint: {key: why}
NOT_ON_RESUME = {
    "optimizer.name": "the optimizer state it holds is that optimizer's (adamw: fp32 moments; adamw_8bit, "
    "paged_adamw_8bit: bitsandbytes' 8-bit blocks and scales)",
    # the checkpoint's trainable weights would not fit the model built: found only after the whole model loaded
    "lora.r": "its trainable weights and their optimizer state are adapters of that rank (null: the whole model, "
    "full fine-tuning)",
    "lora.target_modules": "its adapters and their optimizer state sit on those modules",
    # the weights would load and the model change at once: its adapters' update is scaled by alpha / r
    "lora.alpha": "its adapters' update is scaled by alpha / r: another alpha is another model from the first step",
}


def refused_change(changes: dict[str, list], path: Path, lora: bool) -> str | None:
    """The one line refusing a resume whose ``changes`` include a :data:`NOT_ON_RESUME` key (None: every change
    applies): the key, old -> new, why, and the ways on (the old value, or a new run from the checkpoint's
    weights)."""
    for key, why in NOT_ON_RESUME.items():
        if key not in changes:
            continue
        old, new = changes[key]
        # a full fine-tuning's checkpoint has no lora section: lora.r=None is refused as a value, lora=null is it
        given = "lora=null" if old is None and key.startswith("lora.") else f"{key}={old}"
        fresh = (
            f"lora.init_from={path}"
            if lora and not key.startswith("lora.")  # lora.init_from takes an adapter of the same shape only
            else f"model.path=DIR after glm-grpo merge --base MODEL --adapter {path} --out DIR"
        )
        return (
            f"{key} {json.dumps(old)} -> {json.dumps(new)} cannot change on resume: {path} was trained with "
            f"{given}, and {why}; resume with {given}, or start a new run from its weights with {fresh} in "
            "another output_dir (fresh optimizer state); nothing was changed"
        )
    return None


def batch_refusal(path: Path, old: tuple[int, int], new: tuple[int, int], allowed: bool) -> str | None:
    """The one line refusing a resume on another world size that changes the prompts per step, or None (kept, or
    ``allow_batch_change``). ``old``/``new``: (world size, batch.prompts_per_rank) of the checkpoint and this
    launch. Names the ``batch.prompts_per_rank`` that keeps the global batch, or, when this world size cannot
    divide it, the world sizes that can."""
    (old_world, old_per), (world, per) = old, new
    before, after = old_world * old_per, world * per
    if before == after or allowed:
        return None
    head = (
        f"{path} trained {before} prompts per step (world size {old_world} x batch.prompts_per_rank {old_per}); this "
        f"launch would train {after} ({world} x {per})"
    )
    go_on = f"or allow_batch_change=true to go on with {after} prompts per step; nothing was changed"
    if before % world == 0:
        return f"{head}: set batch.prompts_per_rank={before // world} to keep {before}, {go_on}"
    worlds = ", ".join(str(n) for n in range(1, before + 1) if before % n == 0)
    split = f"{before} prompts per step cannot be split over {world} ranks (world sizes that can: {worlds})"
    return f"{head}: {split}; {go_on}"


def segments(previous: dict | None, step: int, changes: dict[str, list]) -> list[dict]:
    """``config.json``'s history: ``[{"from_step": 0, "changed": {}}, {"from_step": S, "changed": {key: [old,
    new]}}, ...]``, the earlier segments from the ``previous`` config.json of the run (when it has them) and a new
    one at ``step`` when this launch changed settings. A fresh run: one segment."""
    earlier = (previous or {}).get("segments") or []
    # a resume from a checkpoint before a change drops the later segments; a fresh run (step 0) keeps none
    kept = [seg for seg in earlier if seg["from_step"] < step] or [{"from_step": 0, "changed": {}}]
    return kept + ([{"from_step": step, "changed": changes}] if changes else [])


def go_on(out: Path, fix: str) -> str:
    """Where the run stands on disk and how to go on after ``fix`` (what to do first), for a stop's line: the
    checkpoint ``latest`` names, or none yet."""
    pointer = out / CHECKPOINTS / LATEST
    try:
        name = pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else ""
    except OSError:  # said as no checkpoint: the line still comes
        name = ""
    if not name:
        return f"the run has no checkpoint yet: {fix}, then launch it again"
    return f"the last checkpoint is {name} (checkpoints/latest): {fix}, then resume with resume_from=latest"
