"""GRPO math: the clipped, KL-regularised policy loss (the advantages it takes: advantages.py; its policy term's
other forms, CISPO, SAPO and VESPO: objectives.py; the sampler correction and off-policy mask it applies:
corrections.py).

Pure torch (plus the standard library and the registry helper), so it can be read, tested and reused alone. GRPO is
DeepSeekMath's Group Relative Policy Optimization (arXiv:2402.03300): sample G completions per
prompt, score them, use the reward's deviation from its group mean as the advantage of every
token of that completion, and optimise a PPO-style clipped surrogate with a k3 KL penalty
towards a frozen reference policy.

Shapes used throughout:

* ``N`` completions in a batch, ordered group by group (``N = num_groups * group_size``);
* ``T`` completion tokens per row (padded); ``mask[N, T]`` is 1 on tokens that count.

Micro-batching: the loss is a *sum over sequences divided by a normaliser*. Compute the
normaliser once for the whole batch with :func:`loss_normalizer` and pass it to every
:func:`policy_loss` call on a micro-batch; the micro-batch losses then add up to exactly the
full-batch loss, and so do their gradients, whatever the micro-batch size (with a top-entropy selection, for a given
one: its threshold is taken over the micro-batch's tokens, glm_grpo_ds/update.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from .corrections import off_policy_keep
from .objectives import OBJECTIVES, Terms
from .runtime.registries import Registry


class Aggregation(NamedTuple):
    """How the per-token loss becomes one number: ``per_sequence(per_token, mask) -> [N]`` each sequence's
    part of the numerator, ``normalizer(mask) -> scalar`` the denominator of the *whole* batch
    (:func:`loss_normalizer`)."""

    per_sequence: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    normalizer: Callable[[torch.Tensor], torch.Tensor]


# name -> Aggregation (the pattern of verl's core_algos.py); the one list of valid ``grpo.aggregation``
# values (glm_grpo_ds/config/grpo_section.py takes its choices from it). Advantage estimators: advantages.py.
AGGREGATIONS: Registry[Aggregation] = Registry("aggregation")


def _token_sum(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (per_token * mask).sum(dim=1)


def _token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def _num_tokens(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum().to(torch.float32).clamp(min=1.0)


def _num_sequences(mask: torch.Tensor) -> torch.Tensor:
    return torch.tensor(float(mask.shape[0]), device=mask.device)


def _num_slots(mask: torch.Tensor) -> torch.Tensor:
    return torch.tensor(float(mask.shape[0] * mask.shape[1]), device=mask.device)


# token_mean: masked-token sum / number of masked tokens; seq_mean: each sequence's token mean, averaged over
# sequences; dr_grpo: masked-token sum / (N * T), a constant (Dr. GRPO)
AGGREGATIONS.register("token_mean", Aggregation(_token_sum, _num_tokens))
AGGREGATIONS.register("seq_mean", Aggregation(_token_mean, _num_sequences))
AGGREGATIONS.register("dr_grpo", Aggregation(_token_sum, _num_slots))


def loss_normalizer(mask: torch.Tensor, aggregation: str = "token_mean") -> torch.Tensor:
    """The denominator of :func:`policy_loss` for a batch ``mask[N, T]``.

    ``token_mean``: number of masked tokens; ``seq_mean``: N; ``dr_grpo``: N * T.
    Compute it on the *whole* batch and pass it to each micro-batch's :func:`policy_loss`.
    """
    return AGGREGATIONS.get(aggregation).normalizer(mask)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(ref - logp) - (ref - logp) - 1.

    Non-negative, unbiased for samples from the policy, and exactly 0 where logp == ref.
    """
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


# name -> fn(log_ratio [N, T], mask) -> the log importance weights at that level; the ``grpo.importance_sampling_level``
# choices. token: each token's own ratio; sequence (GSPO, arXiv:2507.18071): the mean of the token log-ratios over
# the sequence's masked tokens [N, 1], so the sequence ratio is their geometric mean and is clipped as one number.
IMPORTANCE_LEVELS: Registry[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = Registry(
    "importance sampling level"
)
IMPORTANCE_LEVELS.register("token", lambda log_ratio, mask: log_ratio)
IMPORTANCE_LEVELS.register(
    "sequence", lambda log_ratio, mask: ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
)


def log_importance_weights(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """``log pi / pi_old`` per token ``[N, T]`` (``token``), or per sequence ``[N, 1]`` (``sequence``)."""
    return IMPORTANCE_LEVELS.get(level)(logp - old_logp.detach(), mask)


def high_entropy_threshold(pool: torch.Tensor, quantile: float) -> torch.Tensor:
    """The entropy at or above which a token is kept by :func:`high_entropy_mask`: the ``1 - quantile`` quantile
    of ``pool`` (linear interpolation)."""
    return torch.quantile(pool.detach().float(), 1.0 - quantile)


def high_entropy_mask(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    quantile: float,
    pool: torch.Tensor | None = None,
    threshold: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[N, T]`` bool: the masked tokens whose entropy is in the top ``quantile`` fraction of this call's masked
    tokens (``entropy >= `` their ``1 - quantile`` quantile, linear interpolation; arXiv:2506.01939). 1 keeps
    every masked token; 0 keeps the highest-entropy ones only. ``pool``: the 1-D entropies the quantile is taken
    over instead (every rank's masked tokens of this micro-batch, as TRL gathers them across processes);
    ``threshold``: :func:`high_entropy_threshold` of that pool when the caller has it already."""
    valid = mask.bool()
    if quantile >= 1.0 or not valid.any():
        return valid
    if threshold is None:
        threshold = high_entropy_threshold(entropy.detach()[valid] if pool is None else pool, quantile)
    return (entropy.detach() >= threshold) & valid


@dataclass(frozen=True)
class LossSettings:
    """How :func:`policy_loss` computes, the same for every call of a run: built once from the ``grpo`` config section
    (:func:`glm_grpo_ds.update.loss_settings`; the defaults live there, not here).

    ``objective``: an :data:`glm_grpo_ds.objectives.OBJECTIVES` name, the policy term (clip, cispo, sapo, vespo) with
    its numbers ``cispo_max``, ``sapo_temperature_pos`` / ``sapo_temperature_neg``, ``vespo_k_pos`` /
    ``vespo_lambda_pos`` / ``vespo_k_neg`` / ``vespo_lambda_neg``;
    ``beta``: the k3 KL coefficient (``ref_logp`` needed when not 0); ``epsilon_low`` / ``epsilon_high``: the ratio
    clip range ``[1 - epsilon_low, 1 + epsilon_high]`` (asymmetric "clip-higher" when they differ); ``aggregation``:
    an :data:`AGGREGATIONS` name (see :func:`loss_normalizer`); ``importance_sampling_level``: ``token`` (GRPO) or
    ``sequence`` (GSPO: :func:`log_importance_weights`); ``entropy_coef``: the entropy bonus's coefficient, the loss
    getting ``- entropy_coef`` x the mean entropy of the tokens the policy term trains on (weighted by the call's
    ``token_weights``), whatever the aggregation: TRL's bonus, the documented objective ``L_policy - c * H``.
    ``delta``: the two-sided clip's cap on the unclipped ratio (None: none); ``off_policy_mask_threshold``: the
    off-policy sequence mask's KL bound (:func:`off_policy_keep`; None: no mask); ``kl_bias_correction``: the KL term
    weighted by the importance ratio."""

    objective: str
    beta: float
    epsilon_low: float
    epsilon_high: float
    aggregation: str
    importance_sampling_level: str
    entropy_coef: float
    delta: float | None
    off_policy_mask_threshold: float | None
    kl_bias_correction: bool
    cispo_max: float
    sapo_temperature_pos: float
    sapo_temperature_neg: float
    vespo_k_pos: float
    vespo_lambda_pos: float
    vespo_k_neg: float
    vespo_lambda_neg: float


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    *,
    ref_logp: torch.Tensor | None = None,
    normalizer: torch.Tensor | float | None = None,
    token_weights: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_share: torch.Tensor | float = 1.0,
    sampler_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The objective's surrogate (PPO's clipped one by default: objectives.py) plus ``beta`` * k3 KL, aggregated over
    masked tokens, as ``settings`` say.

    ``logp`` ``[N, T]``: log-probs of the sampled tokens under the current policy (with grad); ``old_logp``
    ``[N, T]``: under the policy that sampled them; ``advantages`` ``[N]``: one per completion (no grad is taken of
    either); ``mask`` ``[N, T]``: 1 for tokens that count. Per call: ``ref_logp`` ``[N, T]`` the reference's
    log-probs; ``normalizer``: :func:`loss_normalizer` of the full batch when this call sees a micro-batch (default:
    this call's own); ``token_weights`` ``[N, T]``: the weight of each token's policy term (:func:`high_entropy_mask`,
    bool, and / or a weighting by position; the KL term keeps every masked token at weight 1, as in TRL);
    ``is_weights`` ``[N, T]`` or ``[N, 1]``: the sampler correction's (:func:`sampler_correction`) on the policy term;
    ``entropy`` ``[N, T]``: the policy's entropies (with grad), for the bonus; ``entropy_share``: this call's share of
    the step's bonus, its masked tokens / the whole rollout's (1 for the whole batch), as TRL's gradient accumulation
    counts each micro-batch by 1 / their number; ``sampler_logp`` ``[N, T]``: the sampler's log-probs, for the
    off-policy sequence mask (``settings.off_policy_mask_threshold``).

    Returns ``(loss, stats)``: the scalar loss and detached scalars ``clip_frac_low``, ``clip_frac_high``,
    ``ratio_mean``, ``ratio_min``, ``ratio_max``, ``kl``, ``entropy`` (token means over this call's masked tokens),
    ``num_tokens``, with the off-policy mask ``off_policy_masked`` (the masked tokens of the sequences it dropped),
    and with a sequence-weighting objective (vespo) ``sequence_weight_sum`` and ``sequences``.
    """
    s = settings
    _check_loss_inputs(logp, old_logp, advantages, mask, ref_logp, s, entropy, sampler_logp)
    aggregate = AGGREGATIONS.get(s.aggregation)  # unknown name -> ValueError listing the registered ones
    mask = mask.to(logp.dtype)  # [N, T]
    adv = advantages.detach().to(logp.dtype).unsqueeze(1)  # [N, 1], same for every token of a row
    ratio = torch.exp(log_importance_weights(logp, old_logp, mask, s.importance_sampling_level))  # [N, T] or [N, 1]
    terms = Terms(
        ratio, adv, logp, (logp - old_logp).detach(), mask, None if is_weights is None else is_weights.detach()
    )
    per_token = _policy_term(terms, s, token_weights)  # [N, T] or [N, 1]
    keep = None
    if s.off_policy_mask_threshold is not None:  # the policy term only: the KL and the entropy bonus stay, as TRL's
        keep = off_policy_keep(adv, logp, sampler_logp, mask, s.off_policy_mask_threshold)  # [N, 1]
        per_token = per_token * keep
    kl = None
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp.detach())  # [N, T]
        if s.beta != 0.0:  # bias-corrected: weighted by the ratio (with its gradient), the samples being pi_old's
            per_token = per_token + s.beta * (kl * ratio if s.kl_bias_correction else kl)
    per_seq = aggregate.per_sequence(per_token, mask)  # [N]
    loss = per_seq.sum() / (aggregate.normalizer(mask) if normalizer is None else normalizer)  # scalar
    if s.entropy_coef != 0.0:
        loss = loss - s.entropy_coef * _mean_trained_entropy(entropy, mask, token_weights) * entropy_share
    # the KL logged is the one the loss takes: bias-corrected, weighted by the ratio (TRL's kl metric too)
    logged_kl = kl * ratio if kl is not None and s.kl_bias_correction else kl
    stats = _loss_stats(ratio, adv, mask, logged_kl, entropy, logp, s)
    stats.update(_sequence_weight_sums(terms, s))
    if keep is not None:
        stats["off_policy_masked"] = ((1.0 - keep) * mask).sum().detach()
    return loss, stats


def _policy_term(terms: Terms, s: LossSettings, token_weights) -> torch.Tensor:
    """The objective's surrogate per token ``[N, T]`` (or per sequence ``[N, 1]``), negated (we minimise), times the
    token weights and the sampler correction's importance weights where given (an objective that weighs whole
    sequences, vespo, takes the latter into its weight instead)."""
    objective = OBJECTIVES.get(s.objective)
    dtype = terms.logp.dtype
    per_token = objective.term(terms, s)
    if token_weights is not None:
        per_token = per_token * token_weights.to(dtype)  # [N, T]
    if terms.is_weights is not None and objective.sequence_weight is None:
        per_token = per_token * terms.is_weights.to(dtype)
    return per_token


@torch.no_grad()
def _sequence_weight_sums(terms: Terms, s: LossSettings) -> dict[str, torch.Tensor]:
    """``sequence_weight_sum`` and ``sequences`` (those with a masked token) of an objective that weighs whole
    sequences (vespo's phi: TRL's vespo/phi_seq_mean is their ratio); empty for the others."""
    weigh = OBJECTIVES.get(s.objective).sequence_weight
    if weigh is None:
        return {}
    counted = (terms.mask.sum(-1, keepdim=True) > 0).to(terms.logp.dtype)  # [N, 1]
    return {"sequence_weight_sum": (weigh(terms, s) * counted).sum(), "sequences": counted.sum()}


def _check_loss_inputs(logp, old_logp, advantages, mask, ref_logp, s: LossSettings, entropy, sampler_logp) -> None:
    """One ValueError naming the shapes or the missing input :func:`policy_loss` needs."""
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, mask {tuple(mask.shape)} differ")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be [N]={tuple(logp.shape[:1])}, got {tuple(advantages.shape)}")
    if s.beta != 0.0 and ref_logp is None:
        raise ValueError("beta != 0 needs ref_logp")
    if ref_logp is not None and ref_logp.shape != logp.shape:
        raise ValueError(f"ref_logp {tuple(ref_logp.shape)} must match logp {tuple(logp.shape)}")
    if s.entropy_coef != 0.0 and entropy is None:
        raise ValueError("entropy_coef != 0 needs entropy")
    if s.off_policy_mask_threshold is not None and (sampler_logp is None or sampler_logp.shape != logp.shape):
        raise ValueError(f"off_policy_mask_threshold needs sampler_logp of logp's shape {tuple(logp.shape)}")


def trained_token_weights(mask: torch.Tensor, token_weights: torch.Tensor | None) -> torch.Tensor:
    """``[N, T]``: each token's weight in the policy term (the loss mask times ``token_weights``), what the entropy
    bonus averages over and the adaptive coefficient measures (glm_grpo_ds/update.py)."""
    return mask if token_weights is None else mask * token_weights.to(mask.dtype)


def _mean_trained_entropy(entropy: torch.Tensor, mask: torch.Tensor, token_weights: torch.Tensor | None):
    """Scalar: the mean entropy ``[N, T]`` over the tokens the policy term trains on. The mean over the trained
    tokens, not aggregated like the policy term: with a top-entropy selection the bonus acts on the selected tokens
    at full strength (TRL's effective mask), not diluted by the rest."""
    trained = trained_token_weights(mask, token_weights)  # [N, T]
    count = trained.sum()
    return (entropy * trained).sum() / torch.where(count > 0, count, torch.ones_like(count))


@torch.no_grad()
def _loss_stats(ratio, adv, mask, kl, entropy, logp, s: LossSettings) -> dict:
    """Detached scalars over the masked tokens ``mask [N, T]``: clip fractions, the ratio's mean / min / max, the
    KL (NaN without a reference) and the entropy (token means), and the token count."""
    ratio = ratio.expand_as(mask)  # [N, T]: a sequence ratio counts once per token in the stats
    n_tok = mask.sum()
    denom = n_tok.clamp(min=1.0)
    low, high = (clipped.to(logp.dtype) for clipped in OBJECTIVES.get(s.objective).clipped(ratio, adv, s))
    valid = mask > 0
    big = torch.finfo(ratio.dtype).max
    stats = {
        "clip_frac_low": (low * mask).sum() / denom,
        "clip_frac_high": (high * mask).sum() / denom,
        "ratio_mean": (ratio * mask).sum() / denom,
        "ratio_min": torch.where(valid, ratio, torch.full_like(ratio, big)).min() if n_tok > 0 else ratio.new_ones(()),
        "ratio_max": torch.where(valid, ratio, torch.full_like(ratio, -big)).max() if n_tok > 0 else ratio.new_ones(()),
        # NaN without a reference (beta 0): nothing was measured, and metrics.jsonl writes null, not a KL of 0
        "kl": (kl * mask).sum() / denom if kl is not None else logp.new_full((), float("nan")),
        "entropy": (entropy.detach() * mask).sum() / denom if entropy is not None else logp.new_zeros(()),
        "num_tokens": n_tok,
    }
    return {k: v.detach() for k, v in stats.items()}
