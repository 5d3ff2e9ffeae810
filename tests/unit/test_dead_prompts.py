"""Groups without reward variance (`frac_reward_zero_std`) and skipping their prompts
(`data.dead_prompt_skip_prob`): the flag by hand and against the advantages, the sampler's skips."""

import pytest
import torch

from glm_grpo_ds.advantages import (
    COMBINATIONS,
    ESTIMATORS,
    combine_advantages,
    signal_free_groups,
    unmeasured_groups,
)
from glm_grpo_ds.data import PromptOrder, load_prompts

NAN = float("nan")


def test_signal_free_groups_by_hand():
    per_reward = {
        "a": torch.tensor([1.0, 1.0, 1.0, 2.0, NAN, 3.0, NAN, NAN, 0.5, 0.5]),
        "b": torch.tensor([0.0, 0.0, 0.0, 0.0, 5.0, 5.0, 1.0, 1.0, 0.0, 7.0]),
    }
    # 1: both constant; 2: a varies; 3: a has one defined value, b constant; 4: a undefined, b constant;
    # 5: b varies
    advantages, _ = combine_advantages(per_reward, {"a": 1.0, "b": 1.0}, 2)
    assert signal_free_groups(advantages, 2).tolist() == [True, False, True, True, False]


@pytest.mark.parametrize("combination", list(COMBINATIONS))
def test_a_weight_0_reward_or_rewards_that_cancel_leave_a_group_dead(combination):
    """The groups whose advantages are all 0, not those whose every reward is constant: a weight-0 reward (logged,
    not trained on) that varies beside a constant one, and two rewards whose sum is constant, teach nothing either
    (the per-reward test called both alive: frac_reward_zero_std 0 where TRL's is 1, and their prompts never
    skipped). A weight-0 reward's failure leaves the group measured."""
    a, b = torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0.3, 0.7, 1.0, 0.0])
    advantages, _ = combine_advantages({"a": a, "b": b}, {"a": 1.0, "b": 0.0}, 2, combination)
    assert signal_free_groups(advantages, 2).tolist() == [True, False]  # group 2: a itself varies
    if combination.startswith("sum"):  # the weighted total [1, 1] is constant (win rates rank each reward apart)
        advantages, _ = combine_advantages({"a": a, "b": b}, {"a": 1.0, "b": 1.0}, 2, combination)
        assert signal_free_groups(advantages, 2).tolist() == [False, True]
    failed = {"a": a, "b": torch.tensor([NAN, NAN, 1.0, 0.0])}
    assert unmeasured_groups(failed, 2, {"a": 1.0, "b": 0.0}).tolist() == [False, False]
    assert unmeasured_groups(failed, 2, {"a": 1.0, "b": 0.5}).tolist() == [True, False]
    assert unmeasured_groups(failed, 2).tolist() == [True, False]  # no weights: every reward counts


@pytest.mark.parametrize("combination", list(COMBINATIONS))
@pytest.mark.parametrize("scale", list(ESTIMATORS))
def test_flagged_exactly_where_every_advantage_is_zero(combination, scale):
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(40, generator=g), torch.rand(40, generator=g)
    a[:8], b[:8] = 0.25, 0.75  # groups 0-1 dead
    a[8:12] = 0.5  # group 2: a constant, b varies
    b[16:20] = NAN  # group 4: b undefined, a varies
    # group 5: dead with a hole; 0.003 is a value whose float32 mean of three is 1 ulp off it
    a[20:24], b[20:24] = torch.tensor([0.003, NAN, 0.003, 0.003]), 0.0
    per_reward = {"a": a, "b": b}
    advantages, _ = combine_advantages(per_reward, {"a": 1.0, "b": 0.5}, 4, combination, scale)
    # exactly 0 (not rounding noise) where every reward is constant, and nowhere else
    dead = signal_free_groups(advantages, 4)
    assert dead.tolist() == [True, True, False, False, False, True, False, False, False, False]


def rows_of(tmp_path, n):
    (tmp_path / "p.txt").write_text("\n".join(f"prompt {i}" for i in range(n)))
    return load_prompts(tmp_path / "p.txt")


def epoch_of_steps(sampler, steps):
    return [[r.index for r in sampler.next()] for _ in range(steps)]


def test_a_dead_prompt_is_skipped_and_taken_again_once_alive(tmp_path):
    rows = rows_of(tmp_path, 4)
    s = PromptOrder(rows, 1, 0, 1, seed=0, shuffle=False, dead_skip_prob=0.999999)
    for row in range(4):  # epoch 0 in file order: rows 0 and 1 come out dead
        assert [r.index for r in s.next()] == [row]
        s.observe([row < 2])
    assert s.dead == {0, 1}
    assert epoch_of_steps(s, 2) == [[2], [3]] and s.last_skipped == 0  # skipped 0 and 1 in the first
    assert s.skipped_total == 2
    assert [r.index for r in s.next()] == [2] and s.last_skipped == 2  # next epoch alike
    s.observe([False])
    s.dead.discard(0)  # as if row 0 had shown variance
    assert epoch_of_steps(s, 3) == [[3], [0], [2]]


def test_a_failed_reward_never_marks_a_prompt_dead_nor_alive(tmp_path):
    """A group where a reward has fewer than two defined samples (it raised, its server was down) teaches nothing, but
    whether its prompt has variance is unknown: the sampler leaves that prompt's state as it was (one step of a
    failing reward server made every prompt of the step dead, then skipped for epochs)."""
    nan = float("nan")
    per_reward = {"a": torch.tensor([nan, nan, 1.0, 1.0, 0.5, nan]), "b": torch.tensor([0.0, 0.0, 2.0, 2.0, 3.0, 3.0])}
    advantages, _ = combine_advantages(per_reward, {"a": 1.0, "b": 1.0}, 2)
    assert signal_free_groups(advantages, 2).tolist() == [True, True, True]
    # nor counts in frac_reward_zero_std (TRL's nanstd is NaN there, not 0, too): an outage is not easy prompts
    assert unmeasured_groups(per_reward, 2, {"a": 1.0, "b": 1.0}).tolist() == [True, False, True]
    s = PromptOrder(rows_of(tmp_path, 3), 1, 0, 3, seed=0, shuffle=False, dead_skip_prob=0.5)
    s.next()
    s.dead = {2}
    s.observe([None, True, None])
    assert s.dead == {1, 2}


def test_off_by_default_and_identical_to_the_plain_order(tmp_path):
    rows = rows_of(tmp_path, 10)
    plain = PromptOrder(rows, 2, 0, 2, seed=3)
    off = PromptOrder(rows, 2, 0, 2, seed=3)
    for _ in range(6):
        assert [r.index for r in plain.next()] == [r.index for r in off.next()]
        off.observe([True] * 4)  # remembered only when skipping is on
    assert off.dead == set() and off.state() == plain.state()


def test_ranks_agree_resume_is_exact_and_the_skip_rate_is_p(tmp_path):
    rows = rows_of(tmp_path, 20)
    ranks = [PromptOrder(rows, 2, r, 2, seed=5, dead_skip_prob=0.5) for r in range(2)]
    for s in ranks:
        s.next()
        s.observe([True, False, True, False])  # the same gathered flags on every rank
    for _ in range(300):
        picks = [s.next() for s in ranks]
        assert ranks[0].last_picked == ranks[1].last_picked
        assert [r.index for part in picks for r in part] == ranks[0].last_picked  # rank-major
        for s in ranks:  # the dead rows are skipped (or not) alike: their verdict stays, the rest are alive
            s.observe([row in s.dead for row in s.last_picked])
    dead = ranks[0].dead
    assert len(dead) == 2
    # each dead row came up once per epoch (about 60 epochs) and was passed over with probability 0.5
    turns = ranks[0].epoch
    assert 0.35 < ranks[0].skipped_total / (2 * turns) < 0.65
    resumed = PromptOrder(rows, 2, 0, 2, seed=5, dead_skip_prob=0.5)
    resumed.load_state(ranks[0].state())
    assert resumed.dead == dead
    assert epoch_of_steps(resumed, 30) == epoch_of_steps(ranks[0], 30)


def test_when_every_prompt_is_dead_a_step_still_gets_its_prompts(tmp_path):
    rows = rows_of(tmp_path, 3)
    s = PromptOrder(rows, 1, 0, 2, seed=0, dead_skip_prob=0.999999)
    s.next()
    s.last_picked = [0, 1, 2]
    s.observe([True, True, True])
    picked = [r.index for r in s.next()]
    assert len(picked) == 2 and s.last_skipped == 3  # at most len(rows) skips, then taken anyway


@pytest.mark.parametrize("n, world, per, seed", [(5, 1, 3, 197), (100, 8, 8, 0)])
def test_skips_that_carry_a_step_across_two_epochs_never_repeat_a_prompt_in_it(tmp_path, n, world, per, seed):
    """The helper's finding: half the prompts dead at p 0.9 used up whole epochs within a step; a row met twice went
    to the deferred list twice and came back twice in one step (5 rows, 3 a step: [2, 1, 2]; 100 rows, 64 a step:
    up to 21 repeats, the list past 100 rows)."""
    import random

    rows = rows_of(tmp_path, n)
    order = PromptOrder(rows, world, 0, per, seed=seed, dead_skip_prob=0.9)
    dead = set(random.Random(1).sample(range(n), int(0.6 * n)))
    for _ in range(400):
        picked = [r.index for part in order.next_global() for r in part]
        assert len(set(picked)) == len(picked) == world * per, picked
        assert len(order.deferred) == len(set(order.deferred)) <= n
        order.observe([row in dead for row in picked])


def test_probability_must_be_below_1():
    from glm_grpo_ds.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"data.dead_prompt_skip_prob must be in \[0, 1\)"):
        load_config(None, ["data.train_file=p.txt", "data.dead_prompt_skip_prob=1"])
