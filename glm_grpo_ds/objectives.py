"""The policy term of the loss, per token and before any weight or aggregation: which surrogate the advantages train
(``grpo.objective``). The loss (grpo.py) adds the token weights, the sampler correction, the off-policy mask, the KL
and the entropy bonus around it, the same for every objective.

* ``clip`` (PPO / GRPO, the default): ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``, the unclipped ``r``
  capped at ``delta`` by the two-sided clip. A clipped token has no gradient.
* ``cispo`` (MiniMax-M1, arXiv:2506.13585, in ScaleRL's form arXiv:2510.13786, TRL's ``loss_type: cispo``):
  ``-sg(min(r, cispo_max)) A log pi``: the importance weight is capped and detached, so a token beyond the cap keeps
  a damped gradient instead of none (PPO's clip silences the rare tokens a reward most depends on).
* ``sapo`` (Soft Adaptive Policy Optimization, arXiv:2511.20347, TRL's ``loss_type: sapo``):
  ``-(4 / tau) sigmoid(tau (r - 1)) A`` with ``tau`` = ``sapo_temperature_pos`` where A > 0, else
  ``sapo_temperature_neg``: the gradient equals the plain surrogate's at r = 1 and fades smoothly as r leaves 1,
  faster for negative advantages (their larger temperature), instead of a hard cut.
* ``vespo`` (Variational Sequence-Level Soft Policy Optimization, arXiv:2602.10693, TRL's ``loss_type: vespo``):
  ``-sg(phi(w)) A log pi`` with ``w`` the sequence's importance weight, the product of its tokens' ratios (times the
  sampler correction's token weights, which vespo takes into ``w`` instead of onto the loss), and the gamma weight
  ``phi(w) = e^lam w^k e^(-lam w)`` (``phi(1) = 1``; ``k`` / ``lam`` = ``vespo_k_pos`` / ``vespo_lambda_pos`` where
  A >= 0, else the ``_neg`` pair): a whole sequence's gradient fades smoothly as it goes off-policy, none is cut.

``r`` is the importance ratio pi_theta / pi_old per token ``[N, T]`` or per sequence ``[N, 1]`` (GSPO); ``A`` the
advantage ``[N, 1]``; ``logp`` the sampled tokens' log-probs ``[N, T]`` with their gradient. Pure torch (plus the
standard library and the registry helper).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import torch

from .runtime.registries import Registry

# the loss's settings (grpo.LossSettings, which imports this module): epsilon_low, epsilon_high and delta (clip),
# cispo_max (cispo), sapo_temperature_pos and sapo_temperature_neg (sapo), vespo_k_pos / _neg, vespo_lambda_pos /
# _neg (vespo)
Settings = Any


class Terms(NamedTuple):
    """What an objective's term reads of a batch: ``ratio`` ``[N, T]`` or ``[N, 1]`` (the importance level's),
    ``adv`` ``[N, 1]``, ``logp`` ``[N, T]`` (with its gradient), ``log_ratio`` ``[N, T]`` each token's
    ``log pi / pi_old`` (detached), ``mask`` ``[N, T]``, ``is_weights`` the sampler correction's ``[N, T]`` or
    ``[N, 1]`` (None: no correction)."""

    ratio: torch.Tensor
    adv: torch.Tensor
    logp: torch.Tensor
    log_ratio: torch.Tensor
    mask: torch.Tensor
    is_weights: torch.Tensor | None


class Objective(NamedTuple):
    """``term(terms, s) -> [N, T] or [N, 1]``: the policy term to minimise; ``clipped(ratio, adv, s) -> (low,
    high)``: bool tensors of ratio's shape, where a clip cut or damped the token's gradient (the metrics'
    clip_frac_low / clip_frac_high; TRL counts the same tokens); ``sequence_weight(terms, s) -> [N, 1]``: the
    detached weight a sequence-weighting objective puts on each sequence (vespo's phi, logged as
    ``sequence_weight_mean``), which takes the sampler correction's weights in itself; None for the others, whose
    term the loss multiplies by those weights."""

    term: Callable[[Terms, Settings], torch.Tensor]
    clipped: Callable[[torch.Tensor, torch.Tensor, Settings], tuple[torch.Tensor, torch.Tensor]]
    sequence_weight: Callable[[Terms, Settings], torch.Tensor] | None = None


# name -> Objective; the ``grpo.objective`` choices
OBJECTIVES: Registry[Objective] = Registry("objective")


def _clip_term(x: Terms, s: Settings) -> torch.Tensor:
    ratio, adv = x.ratio, x.adv
    clipped = torch.clamp(ratio, 1.0 - s.epsilon_low, 1.0 + s.epsilon_high)
    # two-sided clip: the unclipped ratio capped at delta, so a negative advantage's loss stops growing with it
    unclipped = ratio if s.delta is None else torch.clamp(ratio, max=s.delta)
    return -torch.min(unclipped * adv, clipped * adv)  # the pessimistic bound: the min of the two surrogates


def _clip_clipped(ratio, adv, s: Settings):
    # the clipped term is the min (gradient zero) only below the range with A < 0, or above it with A > 0
    return (ratio < 1.0 - s.epsilon_low) & (adv < 0), (ratio > 1.0 + s.epsilon_high) & (adv > 0)


def _cispo_term(x: Terms, s: Settings) -> torch.Tensor:
    return -torch.clamp(x.ratio, max=s.cispo_max).detach() * x.adv * x.logp  # the gradient flows through log pi alone


def _cispo_clipped(ratio, adv, s: Settings):
    # TRL's cispo_clip_ratio: capped weights of tokens with A > 0 (the cap damps, it does not silence)
    return torch.zeros_like(ratio, dtype=torch.bool), (ratio > s.cispo_max) & (adv > 0)


def _sapo_term(x: Terms, s: Settings) -> torch.Tensor:
    ratio, adv = x.ratio, x.adv
    # the temperatures in the ratio's dtype: torch.where of two Python floats rounds them to float32 first
    tau = torch.where(adv > 0, ratio.new_tensor(s.sapo_temperature_pos), ratio.new_tensor(s.sapo_temperature_neg))
    return -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * adv


def _nothing_clipped(ratio, adv, s: Settings):
    none = torch.zeros_like(ratio, dtype=torch.bool)  # a soft gate: no token's gradient is cut
    return none, none


# the floor of vespo's weights, in log space (TRL's 1e-8); the ceiling: e^20
_LOG_FLOOR = math.log(1e-8)


@torch.no_grad()
def _vespo_weight(x: Terms, s: Settings) -> torch.Tensor:
    """``[N, 1]`` phi(w), in log space: ``log w`` = the sum over the sequence's masked tokens of ``log pi / pi_old``
    (each clamped to [-20, 20]) plus the sum over them of the sampler correction's log token weights (clamped to
    [log 1e-8, 20]; a token a mask mode dropped, weight 0, takes the whole sequence to the floor; TRL sums every
    position, its padding's weights being 1), then clamped to [log 1e-8, 20]; ``log phi = lam + k log w - lam w``.
    A non-finite phi counts 0."""
    log_w = (x.log_ratio.clamp(-20.0, 20.0) * x.mask).sum(-1, keepdim=True)  # [N, 1]
    if x.is_weights is not None:
        if x.is_weights.shape != x.log_ratio.shape:  # config/grpo_section.py refuses sequence_* with vespo
            raise ValueError("objective vespo takes the sampler correction's token weights, not a sequence's")
        log_w = log_w + (torch.log(x.is_weights).clamp(_LOG_FLOOR, 20.0) * x.mask).sum(-1, keepdim=True)
    log_w = log_w.clamp(_LOG_FLOOR, 20.0)
    positive = x.adv >= 0
    k = torch.where(positive, log_w.new_tensor(s.vespo_k_pos), log_w.new_tensor(s.vespo_k_neg))
    lam = torch.where(positive, log_w.new_tensor(s.vespo_lambda_pos), log_w.new_tensor(s.vespo_lambda_neg))
    lam = lam.clamp(min=1e-4)  # TRL's floor
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def _vespo_term(x: Terms, s: Settings) -> torch.Tensor:
    return -_vespo_weight(x, s) * x.adv * x.logp  # the gradient flows through log pi alone, scaled by phi


OBJECTIVES.register("clip", Objective(_clip_term, _clip_clipped))
OBJECTIVES.register("cispo", Objective(_cispo_term, _cispo_clipped))
OBJECTIVES.register("sapo", Objective(_sapo_term, _nothing_clipped))
OBJECTIVES.register("vespo", Objective(_vespo_term, _nothing_clipped, _vespo_weight))
