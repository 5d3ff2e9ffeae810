"""The loss options of glm_grpo_ds/grpo.py against TRL's GRPOTrainer on the same inputs (tests/trl_reference.py):
token- and sequence-level ratios (GSPO), the top-entropy token selection, the sampler-correction weights and the
entropy bonus; values and gradients."""

import pytest
import torch
from plain_loss import plain
from trl.trainer.utils import entropy_from_logits
from trl_reference import trl_loss

from glm_grpo_ds.grpo import high_entropy_mask, loss_normalizer, policy_loss
from glm_grpo_ds.sampling import entropy_of

OURS = {"bnpo": "token_mean", "grpo": "seq_mean", "dr_grpo": "dr_grpo"}  # TRL loss_type -> our aggregation


def inputs(seed=0, n=6, t=9):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=g, dtype=torch.float64) * 3
    logp = (old + torch.randn(n, t, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    ref = old + torch.randn(n, t, generator=g, dtype=torch.float64) * 0.1
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = torch.ones(n, t, dtype=torch.float64)
    mask[1, 6:] = 0  # a shorter row: the aggregations differ
    mask[4, 3:] = 0
    entropy = (torch.rand(n, t, generator=g, dtype=torch.float64) * 2).requires_grad_()
    return logp, old, adv, mask, ref, entropy


def both(loss_type, beta=0.0, level="token", quantile=1.0, coef=0.0, is_ratio=None, eps=(0.2, 0.28)):
    logp, old, adv, mask, ref, entropy = inputs()
    theirs = trl_loss(
        logp,
        old,
        adv,
        mask,
        loss_type=loss_type,
        beta=beta,
        ref_logp=ref,
        epsilon_low=eps[0],
        epsilon_high=eps[1],
        importance_sampling_level=level,
        top_entropy_quantile=quantile,
        entropies=entropy,
        entropy_coef=coef,
        importance_sampling_ratio=is_ratio,
    )
    grads_theirs = torch.autograd.grad(theirs, [logp, entropy], allow_unused=True)
    ours, _ = policy_loss(
        logp,
        old,
        adv,
        mask,
        plain(
            beta=beta,
            epsilon_low=eps[0],
            epsilon_high=eps[1],
            aggregation=OURS[loss_type],
            importance_sampling_level=level,
            entropy_coef=coef,
        ),
        ref_logp=ref,
        normalizer=loss_normalizer(mask, OURS[loss_type]),
        token_weights=high_entropy_mask(entropy, mask, quantile) if quantile < 1 else None,
        is_weights=is_ratio,
        entropy=entropy,
    )
    grads_ours = torch.autograd.grad(ours, [logp, entropy], allow_unused=True)
    return (ours, grads_ours), (theirs, grads_theirs)


def assert_same(pair):
    (ours, g_ours), (theirs, g_theirs) = pair
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    for a, b in zip(g_ours, g_theirs):
        if a is None or b is None:
            assert (a is None or not a.any()) and (b is None or not b.any())
        else:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("loss_type", ["bnpo", "grpo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_token_level_loss_equals_trl(loss_type, beta):
    assert_same(both(loss_type, beta))


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_sequence_level_gspo_equals_trl(loss_type, beta):
    assert_same(both(loss_type, beta, level="sequence", eps=(3e-4, 4e-4)))  # GSPO's own clip range
    assert_same(both(loss_type, beta, level="sequence"))


@pytest.mark.parametrize("quantile", [0.0, 0.2, 0.5])
def test_top_entropy_selection_equals_trl(quantile):
    from trl import GRPOTrainer
    from trl_reference import _OneProcess

    _, _, _, mask, _, entropy = inputs()
    fake = type("Fake", (), {"accelerator": _OneProcess()})()
    theirs = GRPOTrainer.get_high_entropy_mask(fake, entropy.detach(), mask, 1 - quantile)
    assert torch.equal(high_entropy_mask(entropy, mask, quantile), theirs)
    assert_same(both("bnpo", 0.04, quantile=quantile))


@pytest.mark.parametrize("shape", ["token", "sequence"])
def test_sampler_correction_weights_apply_as_in_trl(shape):
    logp, *_ = inputs()
    g = torch.Generator().manual_seed(5)
    size = logp.shape if shape == "token" else (logp.shape[0], 1)
    ratio = torch.rand(size, generator=g, dtype=torch.float64) * 2
    assert_same(both("bnpo", 0.04, is_ratio=ratio))
    assert_same(both("grpo", 0.0, level="sequence", is_ratio=ratio))


@pytest.mark.parametrize("loss_type", ["bnpo", "grpo", "dr_grpo"])
@pytest.mark.parametrize("quantile", [1.0, 0.5, 0.2])
def test_entropy_bonus_equals_trl(loss_type, quantile):
    """TRL: the policy loss minus coef x the mean entropy of the tokens it trains on (the top-entropy selection's),
    whatever the loss type; rows of unequal length included."""
    assert_same(both(loss_type, 0.04, quantile=quantile, coef=0.1))


def test_entropy_bonus_of_micro_batches_is_trls_gradient_accumulation():
    """Two micro-batches, each with its share of the tokens: their losses add up to TRL's two accumulated halves."""
    logp, old, adv, mask, ref, entropy = inputs()
    mask = torch.ones_like(mask)  # equal micro-batches, as the visual grids make them
    halves = [slice(0, 3), slice(3, 6)]
    theirs = sum(
        trl_loss(logp[h], old[h], adv[h], mask[h], loss_type="bnpo", entropies=entropy[h], entropy_coef=0.1) / 2
        for h in halves
    )
    ours = sum(
        policy_loss(
            logp[h],
            old[h],
            adv[h],
            mask[h],
            plain(entropy_coef=0.1),
            normalizer=loss_normalizer(mask, "token_mean"),
            entropy=entropy[h],
            entropy_share=mask[h].sum() / mask.sum(),
        )[0]
        for h in halves
    )
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_entropy_equals_trls_on_unmasked_logits_and_ignores_forbidden_ids():
    logits = torch.randn(3, 5, 24, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(entropy_of(logits), entropy_from_logits(logits), rtol=1e-12, atol=1e-12)
    masked = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")]], requires_grad=True)
    h = entropy_of(masked)
    h.sum().backward()
    assert h.item() == pytest.approx(torch.log(torch.tensor(2.0)).item()) and torch.isfinite(masked.grad).all()
