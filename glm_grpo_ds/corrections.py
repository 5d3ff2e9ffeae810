"""What the sampler's numbers differ by, and what the loss does about it: the sampler correction's importance
weights pi_old / pi_sampler (TIS and its masked forms) and the sums logged of them, the sampler-vs-trainer mismatch
sums, and off-policy sequence masking (DeepSeek-V3.2). The loss (grpo.py) takes the weights and the mask.

Pure torch (plus the standard library and the registry helper), like the loss. ``mask[N, T]`` is 1 on the tokens that
count, as in grpo.py.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .runtime.registries import Registry


class Correction(NamedTuple):
    """A sampler correction: the level its weights are taken at (``token``: each token's ratio; ``sequence``: the
    product over the sequence's masked tokens) and what happens outside ``[cap_min, cap_max]`` (``truncate``:
    clamped, TIS; ``mask``: set to 0, the token or sequence leaves the loss). ``none``: no weights."""

    level: str | None
    bound: str | None


# name -> Correction; the ``grpo.sampler_correction`` choices
SAMPLER_CORRECTIONS: Registry[Correction] = Registry("sampler correction")
SAMPLER_CORRECTIONS.register("none", Correction(None, None))
for _level in ("token", "sequence"):
    for _bound in ("truncate", "mask"):
        SAMPLER_CORRECTIONS.register(f"{_level}_{_bound}", Correction(_level, _bound))


def sampler_correction(
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    cap_max: float | None = 3.0,
    cap_min: float | None = None,
) -> torch.Tensor | None:
    """Importance weights ``pi_old / pi_sampler`` that correct for the sampler computing slightly other numbers
    than the trainer (KV-cached bf16 decode vs teacher-forced forward): ``[N, T]`` per token or ``[N, 1]`` per
    sequence, detached; None for ``none`` (see :class:`Correction`). Where the two log-probs agree the weight is
    exactly 1.
    """
    correction = SAMPLER_CORRECTIONS.get(mode)
    if correction.level is None:
        return None
    weights = _raw_correction(old_logp, sampler_logp, mask, correction.level)
    if correction.bound == "truncate":
        return weights.clamp(min=cap_min, max=cap_max)
    return weights.masked_fill(_outside(weights, cap_min, cap_max), 0.0)


def _outside(weights: torch.Tensor, cap_min: float | None, cap_max: float | None) -> torch.Tensor:
    """Where ``weights`` lie outside [cap_min, cap_max] (None: no bound on that side)."""
    low = -math.inf if cap_min is None else cap_min
    high = math.inf if cap_max is None else cap_max
    return (weights < low) | (weights > high)


def _raw_correction(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, level: str):
    """``pi_old / pi_sampler`` per token ``[N, T]`` or per sequence ``[N, 1]``, before any bound, detached."""
    diff = ((old_logp - sampler_logp) * mask).detach()
    return torch.exp(diff.sum(-1, keepdim=True) if level == "sequence" else diff)


def correction_sums(
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    cap_max: float | None = 3.0,
    cap_min: float | None = None,
) -> dict[str, torch.Tensor] | None:
    """What the sampler correction does to one micro-batch, as sums over its units (masked tokens, or sequences
    with a masked token at the sequence level) to add up over micro-batches: ``sum`` / ``min`` / ``max`` of the raw
    weights pi_old / pi_sampler, before the bound (TRL's ``sampling/importance_sampling_ratio/*`` are the bounded
    ones: the raw weights show how far the sampler is off), ``outside`` = units outside [cap_min, cap_max]
    (clipped by a truncate mode, zeroed by a mask mode: how often the bound acts), ``units``. None for ``none``."""
    correction = SAMPLER_CORRECTIONS.get(mode)
    if correction.level is None:
        return None
    weights = _raw_correction(old_logp, sampler_logp, mask, correction.level)
    valid = (mask.sum(-1, keepdim=True) > 0) if correction.level == "sequence" else mask.bool()
    w = weights.double()[valid.expand_as(weights)]
    empty = w.numel() == 0
    return {
        "sum": w.sum(),
        "min": w.new_full((), math.inf) if empty else w.min(),
        "max": w.new_full((), -math.inf) if empty else w.max(),
        "outside": _outside(w, cap_min, cap_max).double().sum(),
        "units": w.new_tensor(float(w.numel())),
    }


def mismatch_sums(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, threshold: float) -> dict:
    """Sums over masked tokens of how the sampler's recorded log-probs differ from the trainer's for the same
    tokens (to be divided by ``tokens`` once summed over micro-batches): ``abs`` = sum of |dlogp|, ``k3`` = the
    k3 estimate of KL(sampler || trainer) summed (tokens were drawn by the sampler), ``beyond`` = tokens with
    |dlogp| > ``threshold``; ``max`` = the largest |dlogp|."""
    # float64 and expm1: the k3 term is ~d^2 / 2, far below fp32's rounding of exp(d) - 1 for d ~ 1e-7
    m = mask.to(torch.float64)
    d = (trainer_logp.detach().double() - sampler_logp.double()) * m  # log(trainer / sampler)
    return {
        "abs": d.abs().sum(),
        "k3": ((torch.expm1(d) - d) * m).sum(),
        "beyond": ((d.abs() > threshold).float() * m).sum(),
        "max": d.abs().max() if d.numel() else d.new_zeros(()),
        "tokens": m.sum(),
    }


def off_policy_keep(
    advantages: torch.Tensor, logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, threshold: float
) -> torch.Tensor:
    """``[N, 1]`` 1.0 for the sequences the policy term keeps, 0.0 for those off-policy sequence masking drops
    (DeepSeek-V3.2): a negative advantage ``[N]`` and a mean sampler-to-policy KL over the sequence's masked tokens,
    ``log pi_sampler - log pi_theta`` (a single-sample estimate of KL(pi_sampler || pi_theta)), above ``threshold``.
    A sample the policy has moved away from is a noisy signal to push further down; one with a positive advantage
    stays. No gradient flows through the mask."""
    m = mask.to(logp.dtype)
    kl = ((sampler_logp.detach().to(logp.dtype) - logp.detach()) * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # [N]
    keep = (advantages.reshape(-1) >= 0) | (kl <= threshold)
    return keep.to(logp.dtype).unsqueeze(1)
