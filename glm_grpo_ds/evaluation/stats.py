"""Paired statistics of ``glm-grpo evaluate``: one model against the base on the same prompts and seeds.

The unit is the prompt: each prompt's K samples are averaged per model, and the paired difference
(model - base) of those means is what is resampled, so the interval reflects how much the result depends
on which prompts were drawn (the samples of one prompt are not independent of each other). The interval is
scipy's percentile bootstrap over prompts with a fixed seed; a win is a prompt whose mean is higher under the
model (a tie counts half).

    summary = paired_summary(base_rewards, model_rewards, seed=0)   # [P, K] tensors, NaN = undefined
    summary["diff"], summary["ci"], summary["win_rate"]
"""

from __future__ import annotations

import math

import torch

RESAMPLES = 10_000
LEVEL = 0.95


def prompt_means(rewards: torch.Tensor) -> torch.Tensor:
    """``[P, K]`` rewards -> ``[P]`` mean over each prompt's defined samples (NaN where none is)."""
    return torch.nanmean(rewards.double(), dim=1)


def bootstrap_mean_ci(values: torch.Tensor, seed: int, resamples: int = RESAMPLES, level: float = LEVEL) -> tuple:
    """``(low, high)``: the percentile bootstrap interval of the mean of ``values`` (``[P]``, NaN dropped).
    ``(nan, nan)`` for fewer than two values; ``(v, v)`` when all values are equal."""
    from scipy.stats import bootstrap

    x = values[~torch.isnan(values)].double().numpy()
    if x.size < 2:
        return math.nan, math.nan
    if (x == x[0]).all():  # no spread: every resample has the same mean
        return float(x[0]), float(x[0])
    result = bootstrap(
        (x,), lambda s, axis: s.mean(axis=axis), n_resamples=resamples, confidence_level=level,
        method="percentile", random_state=seed, vectorized=True,
    )  # fmt: skip
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def paired_summary(base: torch.Tensor, model: torch.Tensor, seed: int = 0) -> dict:
    """``base`` / ``model`` ``[P, K]`` rewards of the same prompts and seeds -> means, the paired difference
    with its bootstrap interval, the win rate over prompts, and the prompt count (prompts undefined under
    either model are left out)."""
    if base.shape != model.shape:
        raise ValueError(f"base {tuple(base.shape)} and model {tuple(model.shape)} rewards differ in shape")
    b, m = prompt_means(base), prompt_means(model)
    both = ~torch.isnan(b) & ~torch.isnan(m)
    b, m = b[both], m[both]
    diff = m - b
    low, high = bootstrap_mean_ci(diff, seed)
    wins = (diff > 0).double() + 0.5 * (diff == 0).double()
    nan = math.nan
    return {
        "base": b.mean().item() if b.numel() else nan,
        "model": m.mean().item() if m.numel() else nan,
        "diff": diff.mean().item() if diff.numel() else nan,
        "ci": [low, high],
        "ci_excludes_0": bool(low > 0 or high < 0),
        "win_rate": wins.mean().item() if wins.numel() else nan,
        "prompts": int(diff.numel()),
    }
