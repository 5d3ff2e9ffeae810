"""Paired statistics of ``glm-grpo evaluate``: one model against the base on the same prompts and seeds.

The unit is the prompt: each prompt's K samples are averaged per model, and the paired difference
(model - base) of those means is the sample whose mean is estimated, so the interval reflects how much the
result depends on which prompts were drawn (the samples of one prompt are not independent of each other).

The interval is Student's t over prompts: mean +- t(0.975, P - 1) x sd / sqrt(P). Its coverage was simulated
(``python benchmarks/interval_coverage.py``, 4 000 evaluations per cell; the table is in docs/evaluate.md): 94-96 %
at 3-32 prompts for normal differences, 93-96 % for reward-like ones (means of K = 4 Bernoulli draws), 87-93 % for
strongly skewed (exponential) ones; the percentile bootstrap used before held 51 / 80 / 88 / 92 % at 2 / 4 / 8 / 16
prompts of normal differences. Below :data:`MIN_PROMPTS` prompts there is no interval (``verdict`` "too few
prompts": with two prompts the reward-like case covered 75 %); below :data:`CAVEAT_BELOW` the summary carries a
caveat, as its level then rests on the differences being roughly symmetric. Every prompt moved by the same amount
(discrete rewards, few prompts) leaves the t interval no width: the verdict is then the exact sign test's (3 of 3
prompts up is p = 0.25, not a certainty). A win is a prompt whose mean is higher under the model (a tie counts half).

A family of intervals read together (a reward per category, the image statistics) is given at the Bonferroni level
``1 - (1 - LEVEL) / m`` (:func:`family_level`), so that with no effect anywhere one coloured cell in the report is
as rare as a single 95 % interval missing: 30 uncorrected intervals showed at least one 3 times in 4.

    summary = paired_summary(base_rewards, model_rewards)   # [P, K] tensors, NaN = undefined
    summary["diff"], summary["ci"], summary["verdict"], summary["win_rate"]
"""

from __future__ import annotations

import math

import torch

LEVEL = 0.95
MIN_PROMPTS = 3  # fewer prompts: no interval
CAVEAT_BELOW = 20  # fewer prompts: the interval is given with a caveat
METHOD = "Student's t over prompts"


def prompt_means(rewards: torch.Tensor) -> torch.Tensor:
    """``[P, K]`` rewards -> ``[P]`` mean over each prompt's defined samples (NaN where none is)."""
    return torch.nanmean(rewards.double(), dim=1)


def mean_interval(values: torch.Tensor, level: float = LEVEL) -> tuple[float, float]:
    """``(low, high)``: Student's t interval of the mean of ``values`` (``[P]``, NaN dropped); ``(nan, nan)`` for
    fewer than :data:`MIN_PROMPTS` values; ``(v, v)`` when all values are equal."""
    from scipy.stats import t

    x = values[~torch.isnan(values)].double()
    n = x.numel()
    if n < MIN_PROMPTS:
        return math.nan, math.nan
    mean = x.mean().item()
    half = float(t.ppf(0.5 + level / 2, n - 1)) * x.std(correction=1).item() / math.sqrt(n)
    return mean - half, mean + half


def family_level(members: int, level: float = LEVEL) -> float:
    """The level of each of ``members`` intervals read together (Bonferroni): all of them cover at least ``level``."""
    return 1 - (1 - level) / max(members, 1)


def verdict(low: float, high: float, prompts: int) -> str:
    """``"too few prompts"``, ``"up"`` / ``"down"`` (the interval excludes 0 on that side) or ``"holds 0"``."""
    if prompts < MIN_PROMPTS or math.isnan(low):
        return "too few prompts"
    return "up" if low > 0 else "down" if high < 0 else "holds 0"


def equal_moves_verdict(diff: torch.Tensor, level: float) -> str | None:
    """The verdict when every prompt moved by the same amount (no spread, up to rounding: the t interval has no
    width), by the exact two-sided sign test; None when the differences spread."""
    from scipy.stats import binomtest

    n = diff.numel()
    if n < MIN_PROMPTS or (diff.max() - diff.min()).item() > 1e-9 * max(1.0, diff.abs().max().item()):
        return None
    if diff.abs().max().item() == 0:
        return "holds 0"
    significant = binomtest(n, n).pvalue < 1 - level
    return "holds 0" if not significant else "up" if diff.mean().item() > 0 else "down"


def paired_summary(base: torch.Tensor, model: torch.Tensor, level: float = LEVEL) -> dict:
    """``base`` / ``model`` ``[P, K]`` rewards of the same prompts and seeds -> means, the paired difference
    with its interval and verdict, the win rate over prompts, and the prompt count. Only samples defined under
    both models count (a seed whose reward failed under one is left out under the other too, so the means stay
    paired: seed by seed, not each model's own defined seeds), and prompts with no such sample are left out.
    ``level``: the interval's (:func:`family_level` for one of a family)."""
    if base.shape != model.shape:
        raise ValueError(f"base {tuple(base.shape)} and model {tuple(model.shape)} rewards differ in shape")
    undefined = torch.isnan(base) | torch.isnan(model)
    b, m = (prompt_means(r.double().masked_fill(undefined, math.nan)) for r in (base, model))
    both = ~torch.isnan(b) & ~torch.isnan(m)
    b, m = b[both], m[both]
    diff = m - b
    low, high = mean_interval(diff, level)
    wins = (diff > 0).double() + 0.5 * (diff == 0).double()
    nan = math.nan
    n = int(diff.numel())
    equal_moves = equal_moves_verdict(diff, level)
    said = equal_moves or verdict(low, high, n)
    return {
        "base": b.mean().item() if b.numel() else nan,
        "model": m.mean().item() if m.numel() else nan,
        "diff": diff.mean().item() if diff.numel() else nan,
        "ci": [low, high],
        "ci_excludes_0": said in ("up", "down"),
        "verdict": said,
        "caveat": MIN_PROMPTS <= n < CAVEAT_BELOW,
        "level": level,
        "sign_test": equal_moves is not None,  # the interval has no width: the verdict is the sign test's
        "win_rate": wins.mean().item() if wins.numel() else nan,
        "prompts": n,
        # samples each model's reward left undefined (raised, or NaN): left out under both, so said beside the table
        "undefined": [int(torch.isnan(base).sum()), int(torch.isnan(model).sum())],
        "samples": int(base.numel()),
    }
