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

``r`` is the importance ratio pi_theta / pi_old per token ``[N, T]`` or per sequence ``[N, 1]`` (GSPO); ``A`` the
advantage ``[N, 1]``; ``logp`` the sampled tokens' log-probs ``[N, T]`` with their gradient. Pure torch (plus the
standard library and the registry helper).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from .runtime.registries import Registry

# the loss's settings (grpo.LossSettings, which imports this module): epsilon_low, epsilon_high and delta (clip),
# cispo_max (cispo), sapo_temperature_pos and sapo_temperature_neg (sapo)
Settings = Any


class Objective(NamedTuple):
    """``term(ratio, adv, logp, s) -> [N, T] or [N, 1]``: the policy term to minimise; ``clipped(ratio, adv, s) ->
    (low, high)``: bool tensors of ratio's shape, where a clip cut or damped the token's gradient (the metrics'
    clip_frac_low / clip_frac_high; TRL counts the same tokens)."""

    term: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Settings], torch.Tensor]
    clipped: Callable[[torch.Tensor, torch.Tensor, Settings], tuple[torch.Tensor, torch.Tensor]]


# name -> Objective; the ``grpo.objective`` choices
OBJECTIVES: Registry[Objective] = Registry("objective")


def _clip_term(ratio, adv, logp, s: Settings) -> torch.Tensor:
    clipped = torch.clamp(ratio, 1.0 - s.epsilon_low, 1.0 + s.epsilon_high)
    # two-sided clip: the unclipped ratio capped at delta, so a negative advantage's loss stops growing with it
    unclipped = ratio if s.delta is None else torch.clamp(ratio, max=s.delta)
    return -torch.min(unclipped * adv, clipped * adv)  # the pessimistic bound: the min of the two surrogates


def _clip_clipped(ratio, adv, s: Settings):
    # the clipped term is the min (gradient zero) only below the range with A < 0, or above it with A > 0
    return (ratio < 1.0 - s.epsilon_low) & (adv < 0), (ratio > 1.0 + s.epsilon_high) & (adv > 0)


def _cispo_term(ratio, adv, logp, s: Settings) -> torch.Tensor:
    return -torch.clamp(ratio, max=s.cispo_max).detach() * adv * logp  # the gradient flows through log pi alone


def _cispo_clipped(ratio, adv, s: Settings):
    # TRL's cispo_clip_ratio: capped weights of tokens with A > 0 (the cap damps, it does not silence)
    return torch.zeros_like(ratio, dtype=torch.bool), (ratio > s.cispo_max) & (adv > 0)


def _sapo_term(ratio, adv, logp, s: Settings) -> torch.Tensor:
    # the temperatures in the ratio's dtype: torch.where of two Python floats rounds them to float32 first
    tau = torch.where(adv > 0, ratio.new_tensor(s.sapo_temperature_pos), ratio.new_tensor(s.sapo_temperature_neg))
    return -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * adv


def _nothing_clipped(ratio, adv, s: Settings):
    none = torch.zeros_like(ratio, dtype=torch.bool)  # a soft gate: no token's gradient is cut
    return none, none


OBJECTIVES.register("clip", Objective(_clip_term, _clip_clipped))
OBJECTIVES.register("cispo", Objective(_cispo_term, _cispo_clipped))
OBJECTIVES.register("sapo", Objective(_sapo_term, _nothing_clipped))
