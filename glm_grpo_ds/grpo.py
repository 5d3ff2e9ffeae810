"""GRPO math: group-relative advantages and the clipped, KL-regularised policy loss.

Pure torch (plus ``typing``), so it can be read, tested and reused alone. GRPO is
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
full-batch loss, and so do their gradients, whatever the micro-batch size.
"""

from __future__ import annotations

from typing import Callable

import torch

# Registries of the math variants (the pattern of verl's core_algos.py): name -> function, filled by
# the ``register_*`` decorators below. They are the one list of valid names: ``grpo.advantage_scale``
# and ``grpo.aggregation`` in glm_grpo_ds/config/sections.py take their choices from them.
ADVANTAGE_SCALE_REGISTRY: dict[str, Callable[..., torch.Tensor]] = {}
AGGREGATION_REGISTRY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}


def register_advantage_scale(name: str):
    """Register ``fn(centered, count, rewards, eps) -> advantages`` as advantage scale ``name``:
    ``centered`` is ``[num_groups, G]`` rewards minus their group mean (0 where undefined),
    ``count`` the ``[num_groups, 1]`` number of defined rewards, ``rewards`` the raw ``[N]``."""

    def decorator(fn):
        ADVANTAGE_SCALE_REGISTRY[name] = fn
        return fn

    return decorator


def get_advantage_scale(name: str) -> Callable[..., torch.Tensor]:
    if name not in ADVANTAGE_SCALE_REGISTRY:
        raise ValueError(f"unknown advantage scale {name!r}; expected one of {tuple(ADVANTAGE_SCALE_REGISTRY)}")
    return ADVANTAGE_SCALE_REGISTRY[name]


def register_aggregation(name: str):
    """Register ``fn(mask[N, T]) -> normaliser`` (the loss denominator) as aggregation ``name``."""

    def decorator(fn):
        AGGREGATION_REGISTRY[name] = fn
        return fn

    return decorator


def get_aggregation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in AGGREGATION_REGISTRY:
        raise ValueError(f"unknown aggregation {name!r}; expected one of {tuple(AGGREGATION_REGISTRY)}")
    return AGGREGATION_REGISTRY[name]


@register_advantage_scale("group")
def _scale_by_group_std(centered: torch.Tensor, count: torch.Tensor, rewards: torch.Tensor, eps: float) -> torch.Tensor:
    # unbiased std over the defined rewards; groups with < 2 of them are constant anyway
    std = torch.sqrt((centered**2).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1))
    return centered / (std + eps)


@register_advantage_scale("batch")
def _scale_by_batch_std(centered: torch.Tensor, count: torch.Tensor, rewards: torch.Tensor, eps: float) -> torch.Tensor:
    defined = rewards[~torch.isnan(rewards)]
    std = defined.std() if defined.numel() > 1 else rewards.new_zeros(())
    return centered / (std + eps)


@register_advantage_scale("none")
def _no_scale(centered: torch.Tensor, count: torch.Tensor, rewards: torch.Tensor, eps: float) -> torch.Tensor:
    return centered


@register_aggregation("token_mean")
def _num_tokens(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum().to(torch.float32).clamp(min=1.0)


@register_aggregation("seq_mean")
def _num_sequences(mask: torch.Tensor) -> torch.Tensor:
    return torch.tensor(float(mask.shape[0]), device=mask.device)


@register_aggregation("dr_grpo")
def _num_slots(mask: torch.Tensor) -> torch.Tensor:
    return torch.tensor(float(mask.shape[0] * mask.shape[1]), device=mask.device)


# The built-in names (the registries above are the live lists).
ADVANTAGE_SCALES = tuple(ADVANTAGE_SCALE_REGISTRY)
AGGREGATIONS = tuple(AGGREGATION_REGISTRY)


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """Group-relative advantages.

    Args:
        rewards: ``[N]`` rewards, ordered group by group. NaN marks a reward that is undefined for
            that sample: it is left out of its group's mean and std and gets advantage 0.
        group_size: G, the number of completions per prompt; must divide N.
        scale: ``"group"``: (r - group mean) / (group std + eps);
            ``"batch"``: (r - group mean) / (std of all N rewards + eps) (Dr. GRPO-style robustness
            to near-constant groups); ``"none"``: r - group mean.
        eps: added to the std so a near-constant group cannot blow up.

    Returns:
        ``[N]`` advantages, same dtype as ``rewards``. Std is the unbiased sample std (torch's
        default). A group whose defined rewards are all equal carries no preference signal, so its
        advantages are exactly 0 (not rounding noise from ``r - mean``).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    scale_fn = get_advantage_scale(scale)
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"group_size={group_size} must be >= 1 and divide the number of rewards ({rewards.numel()})")

    grouped = rewards.view(-1, group_size)  # [num_groups, G]
    valid = ~torch.isnan(grouped)
    count = valid.sum(dim=1, keepdim=True)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)  # NaN for a group with no defined reward
    centered = torch.where(valid, grouped - mean, torch.zeros_like(grouped))
    adv = scale_fn(centered, count, rewards, eps)
    hi = torch.where(valid, grouped, torch.full_like(grouped, float("-inf"))).amax(dim=1, keepdim=True)
    lo = torch.where(valid, grouped, torch.full_like(grouped, float("inf"))).amin(dim=1, keepdim=True)
    constant = (hi == lo) | (count <= 1)
    adv = torch.where(constant | ~valid, torch.zeros_like(adv), adv)
    return adv.reshape(-1)


def loss_normalizer(mask: torch.Tensor, aggregation: str = "token_mean") -> torch.Tensor:
    """The denominator of :func:`policy_loss` for a batch ``mask[N, T]``.

    ``token_mean``: number of masked tokens; ``seq_mean``: N; ``dr_grpo``: N * T.
    Compute it on the *whole* batch and pass it to each micro-batch's :func:`policy_loss`.
    """
    return get_aggregation(aggregation)(mask)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(ref - logp) - (ref - logp) - 1.

    Non-negative, unbiased for samples from the policy, and exactly 0 where logp == ref.
    """
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    aggregation: str = "token_mean",
    normalizer: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped GRPO surrogate plus ``beta`` * k3 KL, aggregated over masked tokens.

    Args:
        logp: ``[N, T]`` log-probs of the sampled tokens under the current policy (with grad).
        old_logp: ``[N, T]`` log-probs under the policy that sampled them (no grad is taken).
        advantages: ``[N]`` one advantage per completion (no grad is taken).
        mask: ``[N, T]`` 1 for tokens that count, 0 for padding / prompt.
        ref_logp: ``[N, T]`` reference log-probs; required when ``beta != 0``.
        beta: KL coefficient.
        epsilon_low / epsilon_high: ratio clip range ``[1 - epsilon_low, 1 + epsilon_high]``
            (asymmetric "clip-higher" when they differ).
        aggregation: ``token_mean`` | ``seq_mean`` | ``dr_grpo`` (see :func:`loss_normalizer`).
        normalizer: denominator from :func:`loss_normalizer` on the full batch when this call
            sees only a micro-batch; defaults to this call's own batch.

    Returns:
        ``(loss, stats)``: scalar loss; ``stats`` holds detached scalars ``clip_frac_low``,
        ``clip_frac_high``, ``ratio_mean``, ``ratio_min``, ``ratio_max``, ``kl`` (token means over
        this call's masked tokens) and ``num_tokens``.
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, mask {tuple(mask.shape)} differ")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be [N]={tuple(logp.shape[:1])}, got {tuple(advantages.shape)}")
    get_aggregation(aggregation)  # unknown name -> ValueError listing the registered ones
    if beta != 0.0 and ref_logp is None:
        raise ValueError("beta != 0 needs ref_logp")
    if ref_logp is not None and ref_logp.shape != logp.shape:
        raise ValueError(f"ref_logp {tuple(ref_logp.shape)} must match logp {tuple(logp.shape)}")

    mask = mask.to(logp.dtype)
    adv = advantages.detach().to(logp.dtype).unsqueeze(1)  # [N, 1], same for every token of a row
    ratio = torch.exp(logp - old_logp.detach())  # [N, T]
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    # Pessimistic bound: the min of the two surrogates; negated because we minimise.
    per_token = -torch.min(ratio * adv, clipped * adv)  # [N, T]

    kl = None
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp.detach())
        if beta != 0.0:
            per_token = per_token + beta * kl

    per_seq = (per_token * mask).sum(dim=1)  # [N]
    if aggregation == "seq_mean":
        per_seq = per_seq / mask.sum(dim=1).clamp(min=1.0)
    if normalizer is None:
        normalizer = loss_normalizer(mask, aggregation)
    loss = per_seq.sum() / normalizer

    with torch.no_grad():
        n_tok = mask.sum()
        denom = n_tok.clamp(min=1.0)
        # Clipping is active (gradient zero) only where the clipped term is the min:
        # ratio below the range with A < 0, or above it with A > 0.
        low = ((ratio < 1.0 - epsilon_low) & (adv < 0)).to(logp.dtype)
        high = ((ratio > 1.0 + epsilon_high) & (adv > 0)).to(logp.dtype)
        valid = mask > 0
        big = torch.finfo(ratio.dtype).max
        stats = {
            "clip_frac_low": (low * mask).sum() / denom,
            "clip_frac_high": (high * mask).sum() / denom,
            "ratio_mean": (ratio * mask).sum() / denom,
            "ratio_min": torch.where(valid, ratio, torch.full_like(ratio, big)).min()
            if n_tok > 0
            else ratio.new_ones(()),
            "ratio_max": torch.where(valid, ratio, torch.full_like(ratio, -big)).max()
            if n_tok > 0
            else ratio.new_ones(()),
            "kl": (kl * mask).sum() / denom if kl is not None else logp.new_zeros(()),
            "num_tokens": n_tok,
        }
        stats = {k: v.detach() for k, v in stats.items()}
    return loss, stats
