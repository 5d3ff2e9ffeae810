"""grpo.entropy_target's adaptive entropy coefficient (glm_grpo_ds/entropy_control.py): by hand, and step by step
against TRL 1.16's own controller (``use_adaptive_entropy``) driving the same losses (tests/trl_reference.py)."""

import json
import math

import pytest
import torch
from plain_loss import plain
from trl_reference import trl_loss

from glm_grpo_ds.entropy_control import EntropyControl
from glm_grpo_ds.grpo import high_entropy_mask, loss_normalizer, policy_loss


def test_the_coefficient_by_hand():
    """Target 1 nat, start 0.01, delta 0.005 within [0, 0.02]: no bonus before any entropy is measured; each
    entropy at or below the target raises the coefficient (to the ceiling), each above lowers it (to the floor),
    and the bonus takes it only while the last entropy was at or below the target."""
    c = EntropyControl(coef=0.01, target=1.0, delta=0.005, low=0.0, high=0.02)
    seen = []
    for entropy in (0.5, 1.0, 0.9, 2.0, 3.0, 3.0, 3.0, 0.2):
        applied = c.applied
        c.update(entropy)
        seen.append((applied, round(c.coef, 12)))
    assert seen == [
        (0.0, 0.015),  # nothing measured yet: no bonus
        (0.015, 0.02),
        (0.02, 0.02),  # the ceiling
        (0.02, 0.015),  # 0.9 <= 1 applied it; 2.0 lowers it
        (0.0, 0.01),  # above the target: no bonus
        (0.0, 0.005),
        (0.0, 0.0),  # the floor
        (0.0, 0.005),
    ]
    assert c.applied == 0.005


def test_the_state_round_trips_through_strict_json():
    c = EntropyControl(coef=0.01, target=1.0, delta=0.005, low=0.0, high=1.0)
    assert json.loads(json.dumps(c.state(), allow_nan=False)) == {"coef": 0.01, "last_entropy": None}
    c.update(0.4)
    d = EntropyControl(coef=0.0, target=1.0, delta=0.005, low=0.0, high=1.0)
    d.load_state(json.loads(json.dumps(c.state(), allow_nan=False)))
    assert (d.coef, d.last_entropy, d.applied) == (c.coef, 0.4, c.applied)
    d.load_state({"coef": 0.2, "last_entropy": None})
    assert d.last_entropy == math.inf and d.applied == 0.0
    narrow = EntropyControl(coef=0.0, target=1.0, delta=0.005, low=0.0, high=0.1)  # a resume that lowered the max
    narrow.load_state({"coef": 0.2, "last_entropy": 0.5})
    assert narrow.coef == 0.1


def test_a_non_finite_entropy_leaves_the_controller_as_it_was():
    """A step of non-finite numbers, or one with no trained token (NaN): TRL's would lower the coefficient and stop
    the bonus (NaN <= target is false); a measured entropy of 0 for no token would raise it. Held instead, and the
    checkpoint's state stays strict JSON."""
    c = EntropyControl(coef=0.01, target=1.0, delta=0.005, low=0.0, high=1.0)
    c.update(0.5)
    for bad in (math.nan, math.inf):
        c.update(bad)
        assert (c.coef, c.last_entropy, c.applied) == (0.015, 0.5, 0.015)
    json.dumps(c.state(), allow_nan=False)


@pytest.mark.parametrize("quantile", [1.0, 0.5])
def test_each_steps_loss_and_coefficient_equal_trls(quantile):
    """Eight optimizer steps (one micro-batch each) whose entropies cross the target both ways: TRL's loss with its
    controller and ours with the coefficient EntropyControl applies, updated from the trained tokens' mean entropy
    (the top-entropy selection's with a quantile), are equal at every step, and so are the coefficients."""
    target, g = 0.9, torch.Generator().manual_seed(4)
    theirs = {"coef": 0.01, "last": math.inf, "target": target, "delta": 0.005, "min": 0.0, "max": 0.02}
    ours = EntropyControl(coef=0.01, target=target, delta=0.005, low=0.0, high=0.02)
    applied = []
    for scale in (2.0, 1.0, 0.5, 0.5, 0.5, 2.0, 3.0, 0.2):
        old = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
        logp = (old + torch.randn(4, 6, generator=g, dtype=torch.float64) * 0.2).requires_grad_()
        adv = torch.randn(4, generator=g, dtype=torch.float64)
        mask = torch.ones(4, 6, dtype=torch.float64)
        mask[2, 4:] = 0
        entropy = (torch.rand(4, 6, generator=g, dtype=torch.float64) * scale).requires_grad_()
        expected = trl_loss(logp, old, adv, mask, entropies=entropy, top_entropy_quantile=quantile, adaptive=theirs)
        weights = high_entropy_mask(entropy, mask, quantile).double() if quantile < 1 else None
        got, _ = policy_loss(
            logp, old, adv, mask, plain(entropy_coef=ours.applied), entropy=entropy, token_weights=weights,
            normalizer=loss_normalizer(mask, "token_mean"),
        )  # fmt: skip
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        trained = mask if weights is None else mask * weights
        applied.append(ours.applied)
        ours.update(((entropy.detach() * trained).sum() / trained.sum()).item())
        assert ours.coef == pytest.approx(theirs["coef"], abs=1e-15) and ours.last_entropy == theirs["last"]
    assert 0 in applied and max(applied) > 0.01  # the bonus was off, then on and raised: both branches ran
