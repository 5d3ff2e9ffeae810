"""Advantages: rewards of a batch -> one advantage per completion, and the combination of several rewards.

Pure torch (plus the standard library and glm_grpo_ds/runtime/registries.py), beside the loss (grpo.py). Rewards
are ``[N]``, ordered group by group (``N = num_groups * group_size``); NaN marks a reward that is undefined
for that sample: it is left out of its group's statistics and gets advantage 0.

Estimators (``grpo.advantage_estimator``), whole functions ``fn(rewards, group_size, eps) -> advantages [N]``
registered in :data:`ESTIMATORS` (verl's level: an estimator sees the rewards and the group layout):

* ``group``: (r - group mean) / (group std + eps), the unbiased std (DeepSeekMath's GRPO);
* ``batch``: (r - group mean) / (std of all N rewards + eps) (Dr. GRPO-style robustness to near-constant
  groups);
* ``none``: r - group mean;
* ``rloo``: leave-one-out baseline, r_i - mean of the other defined rewards of its group (RLOO, Ahmadian et
  al. 2024, arXiv:2402.14740); ``eps`` is unused.

Every estimator gives exactly 0 to a group whose defined rewards are all equal (no preference signal, not
rounding noise from ``r - mean``) or that has fewer than two of them; :func:`signal_free_groups` finds the
groups whose advantages are all 0 (``data.dead_prompt_skip_prob``, and the ``frac_reward_zero_std`` metric over
the groups :func:`unmeasured_groups` does not flag).

Reward combinations (``grpo.reward_combination``, :data:`COMBINATIONS`), for several rewards:

* ``sum_then_normalize``: total = sum_k w_k r_k, then the advantages of the total. A reward undefined (NaN)
  for a sample is replaced by that reward's mean over the defined samples of the same group, so it moves
  the sample neither up nor down in its group; the ``group`` / ``batch`` std of the total then comes from each
  pair of rewards over the samples defined for both, and ``rloo``'s baseline from each reward's other defined
  samples (an imputed value counted as a sample would shrink the spread and inflate every other advantage).
* ``normalize_then_sum``: advantages of each reward in its group (NaN left out of that reward's mean and
  std, advantage 0), then sum_k w_k A_k - an easy reward with a large spread cannot drown a hard one.
* ``win_rate``: the total's within-group win rate (:func:`group_win_rates`: the share of the other samples
  of the group it beats, a tie counting half), then the advantages of the win rates. Only the order within a
  group counts, not the size of the gaps (the Pref-GRPO idea: normalising tiny score gaps to +-1 std
  rewards noise and invites reward hacking); ``grpo.rank_tie_tolerance`` makes gaps up to it ties.
* ``win_rate_per_reward``: each reward's win rates, weighted sum_k w_k W_k (a sample undefined for a reward
  gets that reward's neutral 0.5), then the advantages of that sum.

A sample undefined for every reward it is trained on (a weight other than 0) gets advantage 0 in both modes.

After them, two of GARDO's answers to reward hacking (arXiv:2512.24138): :func:`gate_disagreeing` zeroes the samples
whose rewards disagree (``grpo.disagreement_gate``), and :func:`diversity_multipliers` of :func:`nearest_distances`
scale the positive advantages by how unlike the rest of its group each image is (``grpo.diversity_features``).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .runtime.registries import Registry

# name -> fn(rewards [N], group_size, eps) -> advantages [N]; the one list of valid ``grpo.advantage_estimator``
# values (glm_grpo_ds/config/grpo_section.py takes its choices from it)
ESTIMATORS: Registry[Callable[[torch.Tensor, int, float], torch.Tensor]] = Registry("advantage estimator")
# name -> fn(per_reward, weights, group_size, total, scale, eps, tie) -> advantages [N]; ``total`` is
# :func:`weighted_total`, ``tie`` the win rates' tie tolerance; the one list of valid ``grpo.reward_combination``
# values
COMBINATIONS: Registry[Callable[..., torch.Tensor]] = Registry("reward combination")


class Groups(NamedTuple):
    """Rewards ``[num_groups, G]`` with what every estimator needs: which are defined, how many per group,
    the group mean of the defined ones (NaN for a group with none) and the defined rewards minus it (0
    where undefined)."""

    rewards: torch.Tensor
    valid: torch.Tensor
    count: torch.Tensor
    mean: torch.Tensor
    centered: torch.Tensor

    @property
    def top(self) -> torch.Tensor:
        """``[num_groups, 1]``: the largest defined reward of each group (-inf for a group with none)."""
        return torch.where(self.valid, self.rewards, torch.full_like(self.rewards, float("-inf"))).amax(1, keepdim=True)

    @property
    def constant(self) -> torch.Tensor:
        """``[num_groups, 1]``: True where the defined rewards are all equal or fewer than two."""
        lo = torch.where(self.valid, self.rewards, torch.full_like(self.rewards, float("inf"))).amin(1, keepdim=True)
        return (self.top == lo) | (self.count <= 1)

    @property
    def variance(self) -> torch.Tensor:
        """``[num_groups, 1]``: the unbiased variance of the defined rewards (0 for fewer than two)."""
        return (self.centered**2).sum(dim=1, keepdim=True) / (self.count - 1).clamp(min=1)

    @property
    def others_mean(self) -> torch.Tensor:
        """``[num_groups, G]``: each sample's mean of the other defined rewards of its group (RLOO's baseline)."""
        total = torch.where(self.valid, self.rewards, torch.zeros_like(self.rewards)).sum(dim=1, keepdim=True)
        return (total - self.rewards) / (self.count - 1).clamp(min=1)

    def finish(self, adv: torch.Tensor) -> torch.Tensor:
        """``[N]`` advantages: exactly 0 for undefined rewards and for constant groups (or groups with < 2
        defined rewards)."""
        adv = torch.where(self.constant | ~self.valid, torch.zeros_like(adv), adv)
        return adv.reshape(-1)


def groups(rewards: torch.Tensor, group_size: int) -> Groups:
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"group_size={group_size} must be >= 1 and divide the number of rewards ({rewards.numel()})")
    grouped = rewards.view(-1, group_size)  # [num_groups, G]
    valid = ~torch.isnan(grouped)
    count = valid.sum(dim=1, keepdim=True)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)  # NaN for a group with no defined reward
    centered = torch.where(valid, grouped - mean, torch.zeros_like(grouped))
    return Groups(grouped, valid, count, mean, centered)


@ESTIMATORS.register("group")
def group_zscore(rewards: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    g = groups(rewards, group_size)
    # unbiased std over the defined rewards; groups with < 2 of them are constant anyway
    return g.finish(g.centered / (torch.sqrt(g.variance) + eps))


@ESTIMATORS.register("batch")
def batch_std(rewards: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    g = groups(rewards, group_size)
    defined = rewards[~torch.isnan(rewards)]
    std = defined.std() if defined.numel() > 1 else rewards.new_zeros(())
    return g.finish(g.centered / (std + eps))


@ESTIMATORS.register("none")
def group_mean_baseline(rewards: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    g = groups(rewards, group_size)
    return g.finish(g.centered)


@ESTIMATORS.register("rloo")
def leave_one_out(rewards: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    g = groups(rewards, group_size)
    return g.finish(g.rewards - g.others_mean)


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """``[N]`` advantages of ``rewards`` ``[N]`` (same dtype) by estimator ``scale`` (see the module docstring).

    Args:
        rewards: ``[N]`` rewards, ordered group by group; NaN = undefined (advantage 0).
        group_size: G, the number of completions per prompt; must divide N.
        scale: a name registered in :data:`ESTIMATORS`: ``group`` | ``batch`` | ``none`` | ``rloo``.
        eps: added to the std so a near-constant group cannot blow up.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    return ESTIMATORS.get(scale)(rewards, group_size, eps)


def signal_free_groups(advantages: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[num_groups]`` bool: True for a group whose advantages (before the disagreement gate) are all 0, so it
    teaches nothing: every reward constant over its defined samples (or with fewer than two), a weight-0 reward
    aside, or rewards whose weighted total is constant. Every estimator and combination gives exactly 0 there (not
    rounding noise); TRL's ``frac_reward_zero_std`` counts groups by the total's std, the same groups for
    ``sum_then_normalize``."""
    return (advantages.view(-1, group_size) == 0).all(dim=1)


def unmeasured_groups(
    per_reward: dict[str, torch.Tensor], group_size: int, weights: dict[str, float] | None = None
) -> torch.Tensor:
    """``[num_groups]`` bool: True for a group in which some reward that enters the advantages (``weights``: a weight
    other than 0; None: every reward) has fewer than two defined samples (it raised, its server was down, it
    returned NaN): whether the prompt still has variance is unknown, so a failure never marks it dead
    (``data.dead_prompt_skip_prob``) nor counts in ``frac_reward_zero_std``, though its advantages may all be 0."""
    counted = [v for label, v in per_reward.items() if weights is None or weights[label] != 0]
    if not counted:  # no reward enters the advantages: nothing to be unsure of
        first = next(iter(per_reward.values()))
        return torch.zeros(first.numel() // group_size, dtype=torch.bool, device=first.device)
    flags = [(groups(values, group_size).count < 2).squeeze(1) for values in counted]
    return torch.stack(flags).any(dim=0)


def group_win_rates(rewards: torch.Tensor, group_size: int, tie: float = 0.0) -> torch.Tensor:
    """``[N]``: each sample's share of the other defined samples of its group that it beats; rewards within
    ``tie`` of each other are a tie, counting half. NaN for an undefined reward; 0.5 for a group with a single
    defined sample. For one reward this is the normalised average rank, ``(rank - 1) / (n - 1)``."""
    g = groups(rewards, group_size)
    diff = g.rewards.unsqueeze(2) - g.rewards.unsqueeze(1)  # [P, G, G]: r_i - r_j
    others = ~torch.eye(group_size, dtype=torch.bool, device=rewards.device)
    pairs = g.valid.unsqueeze(2) & g.valid.unsqueeze(1) & others
    score = (diff > tie).to(rewards.dtype) + 0.5 * (diff.abs() <= tie).to(rewards.dtype)
    wins = torch.where(pairs, score, torch.zeros_like(score)).sum(dim=2)
    rates = torch.where(g.count > 1, wins / (g.count - 1).clamp(min=1), torch.full_like(wins, 0.5))
    return torch.where(g.valid, rates, torch.full_like(rates, float("nan"))).reshape(-1)


def impute_group_mean(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """NaN -> mean of the defined values of its group (stays NaN if the group has none); a group whose defined
    values are all equal takes that value itself: its float32 mean can be 1 ulp off it ((c + c + c) / 3 != c for
    c = 0.003), which a win rate with rank_tie_tolerance 0 turns into advantages of +-1 in a group that teaches
    nothing."""
    g = groups(rewards, group_size)
    fill = torch.where(g.constant & (g.count > 0), g.top, g.mean)
    return torch.where(g.valid, g.rewards, fill.expand_as(g.rewards)).reshape(-1)


def weighted_total(per_reward: dict[str, torch.Tensor], weights: dict[str, float], group_size: int) -> torch.Tensor:
    """``[N]`` sum_k w_k r_k with undefined rewards imputed by their group mean; NaN where every reward that enters
    it (a weight other than 0; every reward when none has one) is undefined."""
    first = next(iter(per_reward.values()))
    total = torch.zeros_like(first)
    defined_any = torch.zeros_like(first, dtype=torch.bool)
    trained = any(weights[label] != 0 for label in per_reward)
    for label, values in per_reward.items():
        if weights[label] != 0 or not trained:  # a logged-only reward must not make a sample (or a step) count
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
    tie: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages [N], total reward [N])`` for rows ordered group by group; ``tie``: the win rates' tie
    tolerance (``win_rate`` combinations)."""
    combine = COMBINATIONS.get(mode)
    total = weighted_total(per_reward, weights, group_size)
    return combine(per_reward, weights, group_size, total, scale, eps, tie), total


@COMBINATIONS.register("sum_then_normalize")
def _sum_then_normalize(per_reward, weights, group_size, total, scale, eps, tie):
    partly = torch.stack([torch.isnan(v) for v in per_reward.values()]).any(0) & ~torch.isnan(total)
    if not partly.any() or scale not in ("group", "batch", "rloo"):  # "none": the imputed total's centering is exact
        return group_advantages(total, group_size, scale, eps)
    # Some sample lacks some reward. Its imputed group mean moves it neither up nor down, but counted as a sample it
    # shrinks the total's spread (and stands in an RLOO baseline): A = [1, 2, -, -] beside a constant B gave +-1.22
    # instead of A's own +-0.71. The spread comes from each pair of rewards over the samples that have both instead.
    g = groups(total, group_size)
    if scale == "rloo":
        return g.finish(_leave_one_out_per_reward(per_reward, weights, group_size))
    if scale == "group":
        pairwise, imputed = _pairwise_total_var(per_reward, weights, g.rewards.shape[0]), g.variance
    else:
        pairwise, defined = _pairwise_total_var(per_reward, weights, 1), total[~torch.isnan(total)]
        imputed = defined.var() if defined.numel() > 1 else total.new_zeros(())
    # pairwise estimates need not form a valid covariance: never below the imputed total's own spread
    return g.finish(g.centered / (torch.maximum(pairwise, imputed).sqrt() + eps))


def _pairwise_total_var(per_reward, weights, rows: int) -> torch.Tensor:
    """``[rows, 1]``: the variance of sum_k w_k r_k over each row of the rewards (the groups, or the batch as one row)
    as sum_kl w_k w_l cov(r_k, r_l), each covariance unbiased over the samples defined for both (pairwise deletion):
    with no reward missing, exactly the variance of the total."""
    values = {label: v.reshape(rows, -1) for label, v in per_reward.items()}
    var = 0
    for k, a in values.items():
        for m, b in values.items():
            both = ~torch.isnan(a) & ~torch.isnan(b)
            n = both.sum(1, keepdim=True)
            x, y = torch.where(both, a, 0), torch.where(both, b, 0)
            dx = torch.where(both, x - x.sum(1, keepdim=True) / n.clamp(min=1), 0)
            dy = torch.where(both, y - y.sum(1, keepdim=True) / n.clamp(min=1), 0)
            var = var + weights[k] * weights[m] * (dx * dy).sum(1, keepdim=True) / (n - 1).clamp(min=1)
    return var


def _leave_one_out_per_reward(per_reward, weights, group_size: int) -> torch.Tensor:
    """``[num_groups, G]``: sum_k w_k (r_k - the mean of the other samples defined for r_k), 0 for a reward a sample
    lacks or no other sample has: RLOO of the total, without an imputed mean (which holds the sample's own reward)
    standing in for another sample."""
    adv = 0
    for label, values in per_reward.items():
        g = groups(values, group_size)
        adv = adv + weights[label] * torch.where(g.valid & (g.count > 1), g.rewards - g.others_mean, 0)
    return adv


@COMBINATIONS.register("normalize_then_sum")
def _normalize_then_sum(per_reward, weights, group_size, total, scale, eps, tie):
    adv = torch.zeros_like(total)
    for label, values in per_reward.items():
        adv = adv + weights[label] * group_advantages(values, group_size, scale, eps)
    return adv


@COMBINATIONS.register("win_rate")
def _win_rate(per_reward, weights, group_size, total, scale, eps, tie):
    return group_advantages(group_win_rates(total, group_size, tie), group_size, scale, eps)


@COMBINATIONS.register("win_rate_per_reward")
def _win_rate_per_reward(per_reward, weights, group_size, total, scale, eps, tie):
    summed = torch.zeros_like(total)
    for label, values in per_reward.items():
        summed = summed + weights[label] * torch.nan_to_num(group_win_rates(values, group_size, tie), nan=0.5)
    # a sample undefined for every reward stays undefined (advantage 0)
    return group_advantages(torch.where(torch.isnan(total), total, summed), group_size, scale, eps)


def reward_disagreement(per_reward: dict[str, torch.Tensor], group_size: int, eps: float = 1e-4) -> torch.Tensor | None:
    """``[N]``: how far a sample's other rewards disagree with the main one (the first configured): the largest
    ``|z_main - z_k|`` over the others, each reward standardized within its group (:func:`group_zscore`; a group
    whose reward is constant has z = 0). 0 = every reward ranks the sample alike within its group; two rewards
    that rank a group of G in opposite order reach ~2 at its ends. NaN where the main reward, or every other, is
    undefined; None with one reward. GARDO's signal for samples whose reward is uncertain (docs/monitoring.md)."""
    if len(per_reward) < 2:
        return None
    main, *others = per_reward.values()
    z_main = group_zscore(main, group_size, eps)
    gaps = []
    for values in others:
        gap = (z_main - group_zscore(values, group_size, eps)).abs()
        gaps.append(torch.where(torch.isnan(values), torch.full_like(gap, float("-inf")), gap))
    worst = torch.stack(gaps).amax(dim=0)
    undefined = torch.isnan(main) | torch.isinf(worst)
    return torch.where(undefined, torch.full_like(worst, float("nan")), worst)


def gate_disagreeing(advantages: torch.Tensor, disagreement: torch.Tensor | None, gate: float | None) -> torch.Tensor:
    """``advantages`` with 0 for the samples whose :func:`reward_disagreement` exceeds ``gate``
    (``grpo.disagreement_gate``; None = no gate): their rewards disagree, so their sign is not trusted."""
    if gate is None or disagreement is None:
        return advantages
    return torch.where(disagreement > gate, torch.zeros_like(advantages), advantages)


# a group whose mean nearest-neighbour cosine distance is below this holds copies: their distances are rounding
# (1e-16 in float64, 1e-7 in float32), which a ratio would blow up into arbitrary multipliers
COPIES = 1e-6
FLAT = 1e-6  # a feature vector this short has no direction (a flat image's pixel features are exactly 0)


def nearest_distances(features: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[N]``: each sample's cosine distance (1 - cosine similarity, in [0, 2]) to the nearest other sample of its
    group, from image ``features [N, D]`` ordered group by group: how far it is from being a copy of another. Two
    vectors of norm at most :data:`FLAT` are copies (distance 0)."""
    x = features.double()
    unit = torch.nn.functional.normalize(x, dim=-1).view(-1, group_size, features.shape[-1])
    distance = (1.0 - unit @ unit.transpose(1, 2)).clamp(0.0, 2.0)  # [groups, G, G]
    # a zero vector (a flat image under the pixel features) has no direction: it is a copy of another zero vector
    # and at distance 1 from the rest, not "unlike everything"
    zero = (x.norm(dim=-1) <= FLAT).view(-1, group_size)
    distance = torch.where(zero[:, :, None] & zero[:, None, :], torch.zeros_like(distance), distance)
    distance = distance + torch.diag(torch.full((group_size,), torch.inf, dtype=distance.dtype, device=unit.device))
    return distance.amin(dim=-1).reshape(-1).to(features.dtype)


def diversity_multipliers(distances: torch.Tensor, advantages: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[N]``: GARDO's diversity-aware shaping (arXiv:2512.24138): a sample with a positive advantage gets its
    :func:`nearest_distances` over the mean of its group's, so a good image unlike the others teaches more and a good
    near-copy less; the others 1 (a worse-than-average sample is not pushed down harder for being novel). A group
    whose images are all copies (mean distance below :data:`COPIES`: rounding, not difference) keeps 1."""
    d = distances.view(-1, group_size).double()
    mean = d.mean(dim=1, keepdim=True)
    scaled = torch.where(mean > COPIES, d / mean.clamp(min=COPIES), torch.ones_like(d))
    return torch.where(advantages.view(-1, group_size) > 0, scaled, torch.ones_like(d)).reshape(-1).to(advantages.dtype)
