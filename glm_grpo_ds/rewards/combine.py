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

from typing import Callable

import torch

from ..grpo import group_advantages

# name -> fn(per_reward, weights, group_size, total, scale, eps) -> advantages [N]; the one list of
# valid ``grpo.reward_combination`` values (glm_grpo_ds/config/sections.py takes its choices from it).
COMBINATION_REGISTRY: dict[str, Callable[..., torch.Tensor]] = {}


def register_combination(name: str):
    """Register ``fn(per_reward, weights, group_size, total, scale, eps) -> advantages [N]`` as
    reward combination ``name`` (``total`` is :func:`weighted_total`)."""

    def decorator(fn):
        COMBINATION_REGISTRY[name] = fn
        return fn

    return decorator


def get_combination(name: str) -> Callable[..., torch.Tensor]:
    if name not in COMBINATION_REGISTRY:
        raise ValueError(f"unknown reward combination {name!r}; expected one of {tuple(COMBINATION_REGISTRY)}")
    return COMBINATION_REGISTRY[name]


def impute_group_mean(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """NaN -> mean of the defined values of its group (stays NaN if the group has none)."""
    grouped = rewards.view(-1, group_size)
    valid = ~torch.isnan(grouped)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
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
    combine = get_combination(mode)
    total = weighted_total(per_reward, weights, group_size)
    return combine(per_reward, weights, group_size, total, scale, eps), total


@register_combination("sum_then_normalize")
def _sum_then_normalize(per_reward, weights, group_size, total, scale, eps):
    return group_advantages(total, group_size, scale, eps)


@register_combination("normalize_then_sum")
def _normalize_then_sum(per_reward, weights, group_size, total, scale, eps):
    adv = torch.zeros_like(total)
    for label, values in per_reward.items():
        adv = adv + weights[label] * group_advantages(values, group_size, scale, eps)
    return adv


# The built-in names (the registry above is the live list).
COMBINATIONS = tuple(COMBINATION_REGISTRY)
