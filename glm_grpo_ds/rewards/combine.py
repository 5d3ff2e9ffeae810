"""Turn per-reward scores into advantages: weighted combination with NaN (undefined) handling.

* ``sum_then_normalize``: total = sum_k w_k r_k, then group-relative advantages of the total. A
  reward undefined (NaN) for a sample is replaced by that reward's mean over the defined samples
  of the same group, so it moves the sample neither up nor down in its group.
* ``normalize_then_sum``: advantages of each reward in its group (NaN left out of that reward's
  mean and std, advantage 0), then sum_k w_k A_k - an easy reward with a large spread cannot drown
  a hard one.

A sample undefined for every reward gets advantage 0 in both modes.
"""

from __future__ import annotations

import torch

from ..grpo import group_advantages

COMBINATIONS = ("sum_then_normalize", "normalize_then_sum")


def impute_group_mean(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """NaN -> mean of the defined values of its group (stays NaN if the group has none)."""
    grouped = rewards.view(-1, group_size)
    valid = ~torch.isnan(grouped)
    mean = torch.where(valid, grouped, torch.zeros_like(grouped)).sum(1, keepdim=True) / valid.sum(1, keepdim=True)
    return torch.where(valid, grouped, mean.expand_as(grouped)).reshape(-1)


def weighted_total(per_reward: dict[str, torch.Tensor], weights: dict[str, float], group_size: int) -> torch.Tensor:
    """``[N]`` sum_k w_k r_k with undefined rewards imputed by their group mean; NaN where every
    reward is undefined."""
    first = next(iter(per_reward.values()))
    total = torch.zeros_like(first)
    defined_any = torch.zeros_like(first, dtype=torch.bool)
    for label, values in per_reward.items():
        defined_any |= ~torch.isnan(values)
        # a reward undefined for a whole group is constant within it: contributes 0
        total = total + weights[label] * torch.nan_to_num(impute_group_mean(values, group_size), nan=0.0)
    return torch.where(defined_any, total, torch.full_like(total, float("nan")))


def combine_advantages(
    per_reward: dict[str, torch.Tensor],
    weights: dict[str, float],
    group_size: int,
    mode: str = "sum_then_normalize",
    scale: str = "group",
    eps: float = 1e-4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages [N], total reward [N])`` for rows ordered group by group."""
    if mode not in COMBINATIONS:
        raise ValueError(f"unknown reward combination {mode!r}; expected one of {COMBINATIONS}")
    total = weighted_total(per_reward, weights, group_size)
    if mode == "sum_then_normalize":
        return group_advantages(total, group_size, scale, eps), total
    adv = torch.zeros_like(total)
    for label, values in per_reward.items():
        adv = adv + weights[label] * group_advantages(values, group_size, scale, eps)
    return adv, total
