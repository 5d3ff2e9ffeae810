"""``glm-grpo evaluate``'s statistics (glm_grpo_ds/evaluation/stats.py) against values computed by hand, and the
interval's coverage on simulated evaluations (the full table: benchmarks/interval_coverage.py, docs/evaluate.md)."""

import math

import numpy as np
import pytest
import torch

from glm_grpo_ds.evaluation.report import summarise, table, weighted_sum
from glm_grpo_ds.evaluation.stats import family_level, mean_interval, paired_summary

NAN = float("nan")


def test_paired_summary_by_hand():
    base = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [NAN, NAN]])
    model = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    s = paired_summary(base, model)
    # prompt means: base 0.5 1 0 (the 4th undefined: left out), model 1 1 0.5; differences 0.5 0 0.5
    assert s["prompts"] == 3
    assert (
        s["base"] == pytest.approx(0.5) and s["model"] == pytest.approx(2.5 / 3) and s["diff"] == pytest.approx(1 / 3)
    )
    assert s["win_rate"] == pytest.approx((1 + 0.5 + 1) / 3)  # the tie counts half
    # sd of (0.5, 0, 0.5) = sqrt(1/12); t(0.975, 2 degrees of freedom) = 4.302653; half-width t sd / sqrt(3)
    half = 4.302653 * math.sqrt(1 / 12) / math.sqrt(3)
    assert s["ci"] == pytest.approx([1 / 3 - half, 1 / 3 + half], abs=1e-6)
    assert s["verdict"] == "holds 0" and not s["ci_excludes_0"] and s["caveat"]


def test_a_seed_undefined_under_one_model_is_left_out_under_the_other_too():
    """Paired seed by seed: a reward that failed for seed 0 under the model must not compare the model's seed 1
    with the mean of the base's seeds 0 and 1 (the helper's finding: diff -0.5, "down", for identical samples)."""
    base = torch.tensor([[1.0, 0.0]] * 3)
    model = torch.tensor([[NAN, 0.0]] * 3)
    s = paired_summary(base, model)
    assert s["prompts"] == 3 and s["base"] == 0.0 and s["model"] == 0.0 and s["diff"] == 0.0
    assert s["verdict"] == "holds 0" and s["win_rate"] == 0.5
    assert paired_summary(model, base)["diff"] == 0.0  # either side
    # each model's own undefined samples are counted, for the line under the table (evaluation/report.py)
    assert s["undefined"] == [0, 3] and s["samples"] == 6
    assert paired_summary(model, base)["undefined"] == [3, 0]


def test_the_same_rewards_give_exactly_zero_and_an_interval_that_holds_it():
    r = torch.rand(6, 4, generator=torch.Generator().manual_seed(0))
    s = paired_summary(r, r.clone())
    assert s["diff"] == 0.0 and s["ci"] == [0.0, 0.0] and not s["ci_excludes_0"] and s["win_rate"] == 0.5


def test_a_clear_gain_excludes_zero_and_noise_does_not():
    g = torch.Generator().manual_seed(1)
    base = torch.rand(40, 4, generator=g)
    gain = paired_summary(base, base + 0.3)
    assert gain["ci_excludes_0"] and gain["verdict"] == "up" and not gain["caveat"]  # 40 prompts: no caveat
    noise = base + 0.05 * torch.randn(40, 4, generator=g)
    s = paired_summary(base, noise)
    assert s["ci"][0] < 0 < s["ci"][1] and not s["ci_excludes_0"]
    assert paired_summary(base, base - 0.3)["verdict"] == "down"


def test_two_prompts_get_no_interval_and_the_table_says_so():
    """Below 3 prompts there is no interval: a clear-looking gain on 2 prompts is "too few prompts", not green."""
    s = paired_summary(torch.zeros(2, 4), torch.tensor([[0.5] * 4, [0.6] * 4]))
    assert all(math.isnan(v) for v in s["ci"]) and s["verdict"] == "too few prompts" and not s["ci_excludes_0"]
    text = table({"adapter_0": {"path": "a", "rewards": {"r": {**s, "trained_on": True}}, "categories": {}}})
    assert "too few prompts" in text.splitlines()[2] and "no interval below 3 prompts" in text
    eight = paired_summary(torch.zeros(8, 2), torch.rand(8, 2, generator=torch.Generator().manual_seed(0)))
    assert "with fewer than 20 prompts" in table(
        {"a": {"path": "a", "rewards": {"r": {**eight, "trained_on": None}}, "categories": {}}}
    )
    with pytest.raises(ValueError, match="differ in shape"):
        paired_summary(torch.zeros(2, 3), torch.zeros(3, 2))


def test_every_prompt_moving_by_the_same_amount_is_judged_by_the_sign_test():
    """No spread leaves the t interval no width; 3 of 3 prompts up is p = 0.25 by the exact sign test (not "up"),
    6 of 6 is p = 0.031."""
    three = paired_summary(torch.zeros(3, 1), torch.ones(3, 1))
    assert three["ci"] == [1.0, 1.0] and three["verdict"] == "holds 0" and not three["ci_excludes_0"]
    assert three["sign_test"]
    assert "exact sign test" in table(
        {"a": {"path": "a", "rewards": {"r": {**three, "trained_on": None}}, "categories": {}}}
    )
    assert paired_summary(torch.zeros(6, 2), torch.full((6, 2), 0.25))["verdict"] == "up"
    assert paired_summary(torch.ones(6, 2), torch.full((6, 2), 0.75))["verdict"] == "down"
    spread = paired_summary(torch.zeros(3, 1), torch.tensor([[1.0], [1.1], [1.2]]))
    assert spread["verdict"] == "up" and not spread["sign_test"]  # t: 1.1 +- 4.303 x 0.1 / sqrt(3)


def test_a_reward_failing_under_one_model_only_leaves_the_total_of_identical_models_unmoved():
    """The helper's finding: reward a timed out for 5 of 20 prompts under the adapter; the total filled it from the
    adapter's own samples and said "down" (-0.107) for identical models."""
    g = torch.Generator().manual_seed(0)
    base = {"a": torch.rand(20, 2, generator=g), "b": torch.rand(20, 2, generator=g)}
    model = {label: v.clone() for label, v in base.items()}
    model["a"][:5] = NAN
    weights = {"a": 1.0, "b": 0.5}
    s = paired_summary(weighted_sum(base, weights), weighted_sum(model, weights))
    assert s["diff"] == 0.0 and s["verdict"] == "holds 0" and s["prompts"] == 15
    assert weighted_sum(base, weights)[7, 1].item() == pytest.approx(
        base["a"][7, 1].item() + 0.5 * base["b"][7, 1].item()
    )


def test_a_rewards_categories_are_read_together_at_the_bonferroni_level():
    """6 categories: each interval at 1 - 0.05 / 6 = 99.17 %, wider than the 95 % one over the same prompts."""
    assert family_level(6) == pytest.approx(1 - 0.05 / 6) and family_level(1) == pytest.approx(0.95)

    class Result:
        def __init__(self, rewards):
            self.rewards = rewards

    g = torch.Generator().manual_seed(2)
    base = torch.rand(24, 2, generator=g)
    results = {"base": Result({"r": base}), "a": Result({"r": base + 0.1 * torch.randn(24, 2, generator=g)})}
    categories = [f"c{i % 6}" for i in range(24)]
    summary = summarise(results, {"a": "a"}, categories, [{"name": "r"}])
    c0 = summary["a"]["categories"]["c0"]["r"]
    alone = paired_summary(base[0::6], results["a"].rewards["r"][0::6])
    assert c0["level"] == pytest.approx(1 - 0.05 / 6) and c0["diff"] == pytest.approx(alone["diff"])
    assert c0["ci"][0] < alone["ci"][0] and c0["ci"][1] > alone["ci"][1]
    assert summary["a"]["rewards"]["r"]["level"] == 0.95
    assert "each interval at 99.2% (Bonferroni over the 6 categories" in table(summary)


def test_the_95_interval_holds_the_true_difference_95_percent_of_the_time_at_8_prompts():
    """4 000 simulated evaluations of 8 prompts: normal differences, and reward-like ones (means of 4 Bernoulli
    draws per prompt and model); the percentile bootstrap used before held ~88 % on both."""
    rng = np.random.default_rng(0)
    normal = rng.normal(0.1, 0.2, (4000, 8))
    p = rng.uniform(0.2, 1.0, (4000, 8))
    rewardlike = rng.binomial(4, p) / 4 - rng.binomial(4, p - 0.1) / 4
    for x in (normal, rewardlike):
        held = np.mean([lo <= 0.1 <= hi for lo, hi in (mean_interval(torch.from_numpy(row)) for row in x)])
        assert abs(held - 0.95) < 0.015, held
