"""The rank agreement of `glm-grpo decode-agreement` on groups computed by hand."""

import math

import torch

from glm_grpo_ds.commands.decode_agreement import group_rank_agreement

NAN = float("nan")


def test_spearman_and_best_sample_by_hand():
    reference = torch.tensor([1.0, 2, 3, 4] + [4, 3, 2, 1] + [1, 1, 1, 1] + [1, NAN, 2, 3])
    candidate = torch.tensor([0.1, 0.2, 0.4, 0.3] + [8, 6, 4, 2] + [1, 2, 3, 4] + [3, 2, 1, 0])
    a = group_rank_agreement(reference, candidate, 4)
    # group 1: ranks 1 2 3 4 vs 1 2 4 3, sum d^2 = 2: rho = 1 - 6*2 / (4 * 15) = 0.8; best: sample 3 vs 2
    # group 2: the same order: rho = 1, best sample 0 in both
    # group 3: constant under the reference (no ranking), group 4: an undefined reward: both left out
    assert a["groups"] == 4 and a["groups_ranked"] == 2
    assert math.isclose(a["spearman"], (0.8 + 1.0) / 2, abs_tol=1e-12)
    assert a["best_same"] == 0.5
    assert a["max_reward_diff"] == 4.0  # group 2's first sample, 4 against 8 (an undefined reward counts 0)


def test_reversed_order_is_minus_one_and_ties_rank_by_average():
    a = group_rank_agreement(torch.tensor([1.0, 2, 3]), torch.tensor([3.0, 2, 1]), 3)
    assert a["spearman"] == -1.0 and a["best_same"] == 0.0
    # candidate ties the top two: average ranks 1, 2.5, 2.5 vs 1, 2, 3 -> Pearson of the ranks = sqrt(3) / 2
    b = group_rank_agreement(torch.tensor([1.0, 2, 3]), torch.tensor([0.0, 5, 5]), 3)
    assert math.isclose(b["spearman"], math.sqrt(3) / 2, abs_tol=1e-12)
    assert b["best_same"] == 0.0  # argmax takes the first of the tied best (sample 1), the reference's is 2


def test_no_ranked_group_is_nan_not_zero():
    a = group_rank_agreement(torch.ones(4), torch.arange(4.0), 2)
    assert a["groups_ranked"] == 0 and math.isnan(a["spearman"]) and math.isnan(a["best_same"])


def test_report_labels_guidance_and_names_a_candidate_that_saves_no_time():
    from glm_grpo_ds.commands.decode_agreement import report

    agreement = {"spearman": 0.5, "best_same": 0.75, "groups_ranked": 4, "groups": 4}
    result = {
        "reference": {"num_inference_steps": 50, "guidance_scale": 1.5, "seconds": 10.0},
        "groups": 4,
        "group_size": 4,
        "image": [64, 64],
        "candidates": [
            {"num_inference_steps": 1, "guidance_scale": 1.0, "time_ratio": 0.1, "rewards": {"ssim": agreement}},
            {"num_inference_steps": 50, "guidance_scale": 1.5, "time_ratio": 1.08, "rewards": {"ssim": agreement}},
        ],
    }
    text = report(result)
    assert "reference: 50 steps, guidance 1.5, 10.00 s" in text
    rows = text.splitlines()[2:4]
    assert rows[0].startswith("1 step, guidance 1 ") and "0.10x" in rows[0]
    assert rows[1].startswith("50 steps, guidance 1.5 ") and "1.08x" in rows[1]
    assert text.splitlines()[-1] == "not cheaper than the reference (saves no time): 50 steps, guidance 1.5 (1.08x)"
    result["candidates"].pop()
    assert "not cheaper" not in report(result)
    # a long reward name (a python: reward) widens its column; the figures stay under their headers
    long = "python:glm_grpo_ds.testing.tiny_data:mean_brightness"
    result["candidates"][0]["rewards"] = {long: agreement, "ssim": agreement}
    head, *rows = report(result).splitlines()[1:4]
    assert all(row.index("0.500") + 5 == head.index("spearman") + 8 for row in rows), report(result)
