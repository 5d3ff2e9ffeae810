"""Sample and score the base model and each adapter on the same prompts with paired seeds (``glm-grpo evaluate``).

Pairing: prompt row i is rolled out by every model with the same sampling seed and its images decoded with the same
seed (evaluation/seeds.py: the in-training evaluation's scheme). The rollout draws each token as
``argmax(probs / noise)`` with its seed's noise (glm_grpo_ds/sampling.py), so two models see the same noise
at every position: where their distributions agree they draw the same tokens, and the base against itself (or
an adapter whose LoRA B is zero) gives identical images and a difference of exactly 0. A rank's prompts are
rolled out ``batch_prompts`` at a time, each prompt with its own seed, so a prompt's samples do not depend
on which prompts share its batch.

The adapters are loaded side by side into one peft model over one copy of the base AR
(glm_grpo_ds/model/policy.py ``load_for_sampling``); the base is the same model with its adapters disabled, and a
full fine-tuning's AR is its weights copied into that model while it is sampled (model/weight_sets.py). Each batch
goes through the one experience path (glm_grpo_ds/experience/ ``ExperienceMaker.collect`` with a
``ModelSampler``), so the decode settings, streamed rewards and the rollout options are training's.

Resuming: with ``store``, each (model, batch of prompts) result is saved as ``store/<model>/batch_<first
row>.pt`` as soon as it is scored (written to a temporary name, then renamed), and a later call with the same
store loads what is there instead of sampling it again. Whether the store belongs to the same settings is the
caller's check (glm_grpo_ds/commands/evaluate.py). With ``on_images`` (the benchmark exports), a batch's record
also lists the files ``on_images`` wrote for it; a stored batch whose record lacks that list, or one of whose
files is gone, is sampled again (same seeds, same images), so a resumed export is never missing a batch. A batch
on which a reward raised (a remote server down: its samples undefined) is not stored, so a rerun scores it again.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from ..runtime import oom
from .seeds import decode_seed, rollout_seeds

BASE = "base"


@dataclass
class ModelResult:
    """One model's rewards ``{label: [P, K]}``, image statistics ``{name: [P, K]}`` (monitoring/image_stats.py;
    a group statistic such as diversity is ``[P, 1]``: one value per prompt's K samples) and each prompt's first
    image as a thumbnail ``[P, 3, h, w]``."""

    name: str
    rewards: dict[str, torch.Tensor] = field(default_factory=dict)
    thumbs: torch.Tensor | None = None
    stats: dict[str, torch.Tensor] = field(default_factory=dict)


def prompt_statistics(images: torch.Tensor, prompts: int, k: int, distance=None) -> dict[str, torch.Tensor]:
    """Every image statistic of ``images`` ``[prompts * K, 3, H, W]`` (a prompt's K samples in a row) as
    ``{name: [prompts, K]}``, the group statistics as ``[prompts, 1]``, float64 on the CPU; ``lpips_diversity``
    with a ``distance`` (the lpips reward's, ``RewardSet.pair_distance``)."""
    from ..monitoring.image_stats import group_diversity, image_statistics

    per_image = {name: v.view(prompts, k) for name, v in image_statistics(images).items()}
    per_group = {name: v.view(prompts, 1) for name, v in group_diversity(images, k, None, distance).items()}
    return {name: v.double().cpu() for name, v in {**per_image, **per_group}.items()}


def active(model, name: str, weight_sets=None):
    """Context in which ``model`` computes as model ``name``: the base (adapters disabled), one adapter, or a full
    fine-tuning's weights of ``weight_sets`` (model/weight_sets.py: swapped in, adapters disabled)."""
    if weight_sets is not None:
        weight_sets.use(name)  # the base's weights unless ``name`` is a full fine-tuning's
    if not hasattr(model, "disable_adapter"):
        return contextlib.nullcontext()
    if name == BASE or (weight_sets is not None and name in weight_sets.names):
        return model.disable_adapter()
    model.set_adapter(name)
    return contextlib.nullcontext()


def exported(done: dict) -> bool:
    """Whether every file the exports wrote for a stored batch is still there."""
    return "exported" in done and all(Path(path).is_file() for path in done["exported"])


def evaluate_models(
    model,
    names: list[str],
    maker,
    rows,
    samples_per_prompt: int,
    seed: int,
    decode_settings,
    batch_prompts: int = 4,
    thumb_side: int = 128,
    progress=None,
    store: Path | None = None,
    on_images=None,
    weight_sets=None,
) -> dict[str, ModelResult]:
    """Every model in ``names`` (``BASE`` and / or adapter names of ``model``, or of ``weight_sets``: full
    fine-tunings' weights swapped into it) on every row of ``rows``, K samples
    each, collected by ``maker`` (an ExperienceMaker whose sampler samples with ``model``); ``store``: where
    finished batches are kept and found again (see the module docstring); ``on_images(name, rows, images)``:
    called with each sampled batch's full images ``[rows * K, 3, H, W]`` (the exports), returns the files it
    wrote. A stored batch from before the image statistics were kept is sampled again (same seeds, same images)."""
    from ..observability.gallery import thumbnails

    k = samples_per_prompt
    results = {name: ModelResult(name) for name in names}
    parts: dict[str, list[dict[str, torch.Tensor]]] = {name: [] for name in names}
    thumbs: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    stats: dict[str, list[dict[str, torch.Tensor]]] = {name: [] for name in names}
    for start in range(0, len(rows), batch_prompts):
        chunk = list(rows[start : start + batch_prompts])
        for name in names:
            saved = None if store is None else store / name / f"batch_{start:06d}.pt"
            done = torch.load(saved, weights_only=True) if saved is not None and saved.is_file() else None
            if done is not None and on_images is not None and not exported(done):
                done = None  # its export files are gone (or were never recorded): sample it again
            if done is not None and "stats" not in done:
                done = None  # stored before the image statistics were kept
            if done is None:
                seeds = rollout_seeds(seed, chunk)
                batch = f"model {name}, prompt rows {chunk[0].index}-{chunk[-1].index}"  # the command's OOM line
                with oom.marking(part=batch):
                    with active(model, name, weight_sets):
                        exp = maker.collect(chunk, seeds, partial(decode_seed, seed), k, decode_settings)
                    written = None if on_images is None else [str(p) for p in on_images(name, chunk, exp.images)]
                    done = {
                        "rewards": {label: v.double().cpu().view(len(chunk), k) for label, v in exp.per_reward.items()},
                        "thumbs": thumbnails(exp.images[::k], thumb_side).cpu(),
                        "stats": prompt_statistics(exp.images, len(chunk), k, maker.reward_fn.pair_distance()),
                    }
                if written is not None:
                    done["exported"] = written
                # a batch a reward raised on is not kept: a rerun (the server back up) scores it again
                if saved is not None and not any(maker.reward_fn.failed.values()):
                    saved.parent.mkdir(parents=True, exist_ok=True)
                    torch.save(done, saved.with_suffix(".tmp"))
                    os.replace(saved.with_suffix(".tmp"), saved)
            parts[name].append(done["rewards"])
            thumbs[name].append(done["thumbs"])
            stats[name].append(done["stats"])
        if progress is not None:  # a prompt is done when every model has it
            progress(len(chunk))
    for name in names:
        if not parts[name]:  # no rows (a rank whose share is empty)
            continue
        labels = parts[name][0].keys()
        results[name].rewards = {label: torch.cat([p[label] for p in parts[name]]) for label in labels}
        results[name].thumbs = torch.cat(thumbs[name])
        results[name].stats = {stat: torch.cat([p[stat] for p in stats[name]]) for stat in stats[name][0]}
    return results
