"""A training step's advantages over the global batch (glm_grpo_ds/train.py ``Trainer.step``): every rank's rewards
gathered and combined into advantages (glm_grpo_ds/advantages.py), the groups that taught nothing found, the
disagreement gate applied, and with ``grpo.diversity_features`` the positive advantages shaped by how unlike the
rest of its group each image is (GARDO). Collective: every rank calls it and gets the same tensors.

    got = step_advantages(exp, reward_fn, cfg.grpo)
    got.advantages[mine]   # this rank's share, as the update trains on them
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..advantages import (
    combine_advantages,
    diversity_multipliers,
    gate_disagreeing,
    nearest_distances,
    reward_disagreement,
    signal_free_groups,
    unmeasured_groups,
)
from ..ds import dist
from ..observability.metrics import timer


@dataclass
class StepAdvantages:
    advantages: torch.Tensor  # [N] the global batch's, after the gate and the shaping
    all_rewards: torch.Tensor  # [N] the weighted totals the advantages came from
    all_per_reward: dict[str, torch.Tensor]  # {label: [N]} every rank's rewards, NaN = undefined
    dead: torch.Tensor  # [groups] advantages all 0 before the gate (a gated group is not an easy one)
    unknown: torch.Tensor  # [groups] a counted reward failed on the group
    disagreement: torch.Tensor | None  # [N] how far the other rewards disagree with the first (None: one reward)
    fields: dict = field(default_factory=dict)  # the step record's diversity/* (with grpo.diversity_features)


def step_advantages(exp, reward_fn, grpo_cfg) -> StepAdvantages:
    """The global advantages of ``exp`` (this rank's Experience) under ``reward_fn``'s weights and the ``grpo``
    section; the seconds the diversity features take join ``exp.timings["reward"]``."""
    g = grpo_cfg.group_size
    all_per_reward = {label: dist.all_gather(values) for label, values in exp.per_reward.items()}
    advantages, all_rewards = combine_advantages(
        all_per_reward,
        reward_fn.weights,
        g,
        grpo_cfg.reward_combination,
        grpo_cfg.advantage_estimator,
        tie=grpo_cfg.rank_tie_tolerance,
    )
    dead = signal_free_groups(advantages, g)
    unknown = unmeasured_groups(all_per_reward, g, reward_fn.weights)
    # several rewards: where they disagree (logged), optionally gated out of the advantages
    disagreement = reward_disagreement(all_per_reward, g)
    advantages = gate_disagreeing(advantages, disagreement, grpo_cfg.disagreement_gate)
    got = StepAdvantages(advantages, all_rewards, all_per_reward, dead, unknown, disagreement)
    if reward_fn.features is not None:
        _shape_by_diversity(got, exp, reward_fn, g)
    return got


def _shape_by_diversity(got: StepAdvantages, exp, reward_fn, group_size: int) -> None:
    """``got.advantages`` times GARDO's diversity multipliers (advantages.py), from every rank's image features;
    ``got.fields``: the mean nearest-neighbour distance, and the multipliers' mean and max over the samples they
    scale (the positive ones; None when there are none). Where the features raised on any rank, the step is not
    shaped (every rank learns it from one small gather first, so none waits in the features' gather alone)."""
    seconds: dict[str, float] = {}
    with timer(seconds, "features"):  # this rank's work only: the gathers' waits are the advantages phase's
        vectors = reward_fn.features_of(exp.images)
    exp.timings["reward"] = exp.timings.get("reward", 0.0) + seconds["features"]
    ok = torch.tensor([0.0 if vectors is None else 1.0], device=exp.images.device)
    if not bool(dist.all_gather(ok).all()):
        got.fields = {"diversity/shaped": 0}
        return
    vectors = dist.all_gather(vectors)  # [N, D], group by group as the rewards
    distances = nearest_distances(vectors, group_size)
    multipliers = diversity_multipliers(distances, got.advantages, group_size)
    scaled = got.advantages > 0
    got.advantages = got.advantages * multipliers
    got.fields = {
        "diversity/shaped": 1,
        "diversity/nearest_distance": distances.mean().item(),
        "diversity/multiplier_mean": multipliers[scaled].mean().item() if scaled.any() else None,
        "diversity/multiplier_max": multipliers[scaled].max().item() if scaled.any() else None,
    }
