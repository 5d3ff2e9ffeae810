"""``glm-grpo evaluate``'s statistics (glm_grpo_ds/evaluation/stats.py) against values computed by hand."""

import math

import pytest
import torch

from glm_grpo_ds.evaluation.stats import bootstrap_mean_ci, paired_summary

NAN = float("nan")


def test_paired_summary_by_hand():
    base = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [NAN, NAN]])
    model = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    s = paired_summary(base, model, seed=0)
    # prompt means: base 0.5 1 0 (the 4th undefined: left out), model 1 1 0.5; differences 0.5 0 0.5
    assert s["prompts"] == 3
    assert (
        s["base"] == pytest.approx(0.5) and s["model"] == pytest.approx(2.5 / 3) and s["diff"] == pytest.approx(1 / 3)
    )
    assert s["win_rate"] == pytest.approx((1 + 0.5 + 1) / 3)  # the tie counts half
    low, high = s["ci"]
    assert 0 <= low <= 1 / 3 <= high <= 0.5  # resampled means of {0.5, 0, 0.5} lie in [0, 0.5]


def test_the_same_rewards_give_exactly_zero_and_an_interval_that_holds_it():
    r = torch.rand(6, 4, generator=torch.Generator().manual_seed(0))
    s = paired_summary(r, r.clone(), seed=0)
    assert s["diff"] == 0.0 and s["ci"] == [0.0, 0.0] and not s["ci_excludes_0"] and s["win_rate"] == 0.5


def test_a_clear_gain_excludes_zero_and_noise_does_not():
    g = torch.Generator().manual_seed(1)
    base = torch.rand(40, 4, generator=g)
    assert paired_summary(base, base + 0.3, seed=0)["ci_excludes_0"]
    noise = base + 0.05 * torch.randn(40, 4, generator=g)
    s = paired_summary(base, noise, seed=0)
    assert s["ci"][0] < 0 < s["ci"][1] and not s["ci_excludes_0"]


def test_bootstrap_is_seeded_and_needs_two_values():
    x = torch.tensor([0.1, 0.5, 0.2, 0.9, 0.4])
    assert bootstrap_mean_ci(x, seed=3) == bootstrap_mean_ci(x, seed=3)
    assert all(math.isnan(v) for v in bootstrap_mean_ci(torch.tensor([0.3]), seed=0))
    with pytest.raises(ValueError, match="differ in shape"):
        paired_summary(torch.zeros(2, 3), torch.zeros(3, 2))
