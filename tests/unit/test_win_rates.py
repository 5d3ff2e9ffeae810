"""Rank-based reward combinations (glm_grpo_ds/advantages.py ``win_rate``, ``win_rate_per_reward``) against values
computed by hand and against scipy's average ranks."""

import math

import pytest
import torch
from scipy.stats import rankdata

from glm_grpo_ds.advantages import combine_advantages, group_win_rates

NAN = float("nan")


def test_win_rates_by_hand():
    rates = group_win_rates(torch.tensor([3.0, 1.0, 2.0, 2.0, 5.0, NAN, 1.0, 4.0]), 4)
    # group 1: 3 beats all three; 1 none; each 2 beats the 1 and ties the other 2: (1 + 0.5) / 3
    assert rates[:4].tolist() == pytest.approx([1.0, 0.0, 0.5, 0.5])
    # group 2: the undefined sample neither counts nor gets a rate
    assert rates[4:].tolist()[0] == pytest.approx(1.0) and math.isnan(rates[5])
    assert rates[6:].tolist() == pytest.approx([0.0, 0.5])
    assert group_win_rates(torch.tensor([7.0, NAN]), 2).tolist()[0] == 0.5  # alone in its group: neutral


def test_a_tie_tolerance_makes_tiny_gaps_ties():
    rewards = torch.tensor([1.0, 1.1, 2.0])
    assert group_win_rates(rewards, 3).tolist() == pytest.approx([0.0, 0.5, 1.0])
    assert group_win_rates(rewards, 3, tie=0.15).tolist() == pytest.approx([0.25, 0.25, 1.0])
    # the z-score turns a 1e-6 gap into a full standard deviation; the tolerant win rate does not see it
    near = torch.tensor([0.5, 0.5 + 1e-6, 0.5 + 2e-6, 0.9])
    adv, _ = combine_advantages({"r": near}, {"r": 1.0}, 4, "win_rate", "none", tie=1e-3)
    assert adv[0] == adv[1] == adv[2] and adv[3] > 0


def test_win_rate_is_the_normalised_average_rank():
    rewards = torch.randint(0, 5, (6 * 8,), generator=torch.Generator().manual_seed(0)).double()
    rates = group_win_rates(rewards, 8).view(6, 8)
    for row, group in zip(rates, rewards.view(6, 8)):
        expected = (rankdata(group.numpy()) - 1) / 7  # ties get their average rank
        assert row.tolist() == pytest.approx(expected.tolist())


def test_win_rate_combinations_by_hand():
    a = torch.tensor([0.0, 10.0, 20.0])  # a large spread
    b = torch.tensor([0.3, 0.2, 0.1])  # a small one, reversed
    weights = {"a": 1.0, "b": 1.0}
    adv, total = combine_advantages({"a": a, "b": b}, weights, 3, "win_rate", "none")
    # the total 0.3, 10.2, 20.1 is ordered by a: win rates 0, 0.5, 1 minus their mean 0.5
    assert adv.tolist() == pytest.approx([-0.5, 0.0, 0.5]) and total.tolist() == pytest.approx([0.3, 10.2, 20.1])
    adv, _ = combine_advantages({"a": a, "b": b}, weights, 3, "win_rate_per_reward", "none")
    assert adv.tolist() == pytest.approx([0.0, 0.0, 0.0])  # each reward's order cancels the other's
    adv, _ = combine_advantages({"a": a, "b": b}, {"a": 1.0, "b": 0.5}, 3, "win_rate_per_reward", "none")
    assert adv.tolist() == pytest.approx([-0.25, 0.0, 0.25])  # (0, .5, 1) + .5 (1, .5, 0) = (.5, .75, 1), minus .75
    # a sample undefined for one reward takes that reward's neutral 0.5; undefined for all: advantage 0
    adv, _ = combine_advantages({"a": torch.tensor([0.0, NAN, 2.0]), "b": b}, weights, 3, "win_rate_per_reward", "none")
    assert adv.tolist() == pytest.approx([0.0, 0.0, 0.0])  # (0 + 1, .5 + .5, 1 + 0) -> all 1
    adv, _ = combine_advantages({"a": torch.tensor([NAN, 1.0, 2.0])}, {"a": 1.0}, 3, "win_rate", "none")
    assert adv[0] == 0 and adv[1:].tolist() == pytest.approx([-0.5, 0.5])
