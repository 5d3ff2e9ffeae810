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

# TRL loss_type -> our (objective, aggregation)
OURS = {
    "bnpo": ("clip", "token_mean"),
    "grpo": ("clip", "seq_mean"),
    "dr_grpo": ("clip", "dr_grpo"),
    "cispo": ("cispo", "token_mean"),
    "sapo": ("sapo", "seq_mean"),
    "vespo": ("vespo", "token_mean"),
}
VESPO_KEYS = ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")


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


def both(loss_type, beta=0.0, level="token", quantile=1.0, coef=0.0, is_ratio=None, eps=(0.2, 0.28), **new):
    """Ours and TRL's ``(loss, gradients)``; ``new``: ``delta``, ``off_policy_mask_threshold`` (with the sampler's
    log-probs of :func:`sampler_logp`), ``kl_bias_correction`` (TRL's use_bias_correction_kl), ``sapo_temperature_pos``
    / ``_neg``, ``vespo_k_pos`` / ... (TRL's defaults where not given). Under cispo ``eps[1]`` is the weight's cap
    (TRL's epsilon_high, our cispo_max). SAPO's temperatures default to 1 and 1.25 here, not 1.05: TRL rounds them to
    float32 (``torch.where`` of two Python floats), we keep the loss's dtype, and 1.05 differs by 5e-8 in float32
    (tests/unit/test_grpo_math.py checks 1.05 by hand)."""
    objective, aggregation = OURS[loss_type]
    new = {"sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.25, **new} if objective == "sapo" else new
    temperatures = (new.get("sapo_temperature_pos"), new.get("sapo_temperature_neg"))
    logp, old, adv, mask, ref, entropy = inputs()
    sampler = sampler_logp(old) if new.get("off_policy_mask_threshold") is not None else None
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
        delta=new.get("delta"),
        off_policy_mask_threshold=new.get("off_policy_mask_threshold"),
        sampling_logp=sampler,
        use_bias_correction_kl=new.get("kl_bias_correction", False),
        sapo_temperatures=temperatures if objective == "sapo" else (1.0, 1.05),
        vespo=tuple(new.get(key, default) for key, default in zip(VESPO_KEYS, (2.0, 3.0, 3.0, 2.0))),
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
            aggregation=aggregation,
            importance_sampling_level=level,
            entropy_coef=coef,
            **{"objective": objective, "cispo_max": eps[1], **new},
        ),
        ref_logp=ref,
        normalizer=loss_normalizer(mask, aggregation),
        token_weights=high_entropy_mask(entropy, mask, quantile) if quantile < 1 else None,
        is_weights=is_ratio,
        entropy=entropy,
        sampler_logp=sampler,
    )
    grads_ours = torch.autograd.grad(ours, [logp, entropy], allow_unused=True)
    return (ours, grads_ours), (theirs, grads_theirs)


def sampler_logp(old):
    """The sampler's log-probs: the old policy's, off by enough that some sequences' mean KL passes 0.1."""
    g = torch.Generator().manual_seed(9)
    return old + torch.randn(old.shape, generator=g, dtype=old.dtype) * 0.6 + 0.05


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


@pytest.mark.parametrize("loss_type", ["bnpo", "grpo", "dr_grpo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_two_sided_clip_equals_trl(loss_type, level):
    """grpo.delta (TRL's delta, INTELLECT-2): the unclipped ratio capped at 1.3, above 1 + epsilon_high = 1.28."""
    assert_same(both(loss_type, 0.04, level=level, delta=1.3))
    if level == "token":  # tokens' ratios reach 1.56: the cap acts
        capped, uncapped = both(loss_type, 0.04, delta=1.3)[0][0], both(loss_type, 0.04)[0][0]
        assert not torch.equal(capped, uncapped)


@pytest.mark.parametrize("loss_type", ["bnpo", "grpo"])
@pytest.mark.parametrize("threshold", [0.0, 0.1, 10.0])
def test_off_policy_sequence_mask_equals_trl(loss_type, threshold):
    """grpo.off_policy_mask_threshold (TRL's, DeepSeek-V3.2) on the sampler's log-probs: 0 drops every negative-
    advantage sequence the sampler rated likelier, 10 none; 0.1 some. The KL term and the entropy bonus stay."""
    assert_same(both(loss_type, 0.04, coef=0.1, off_policy_mask_threshold=threshold))
    logp, old, adv, mask, *_ = inputs()
    from glm_grpo_ds.corrections import off_policy_keep

    keep = off_policy_keep(adv, logp, sampler_logp(old), mask, threshold).squeeze(1)
    dropped = {0.0: (0 < keep.numel() - keep.sum()), 0.1: (0 < keep.numel() - keep.sum() < (adv < 0).sum())}
    assert dropped.get(threshold, keep.all()), keep
    assert keep[adv >= 0].all()


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_bias_corrected_kl_equals_trl(level):
    """grpo.kl_bias_correction (TRL's use_bias_correction_kl): the k3 term weighted by the ratio, its gradient too."""
    assert_same(both("bnpo", 0.04, level=level, kl_bias_correction=True))
    assert not torch.equal(both("bnpo", 0.04, kl_bias_correction=True)[0][0], both("bnpo", 0.04)[0][0])


@pytest.mark.parametrize("options", [{}, {"kl_bias_correction": True}, {"delta": 1.5}], ids=["plain", "bias", "delta"])
def test_the_logged_kl_entropy_and_clip_fractions_equal_trls(options):
    """What metrics.jsonl logs of a loss call (kl, entropy, clip_frac_low / high) against what TRL logs of the same
    call (kl, entropy, clip_ratio/low_mean / high_mean), token level. The bias-corrected KL logged the plain k3 mean
    (0.0405 where TRL's, the one the loss takes, was 0.0396)."""
    logp, old, adv, mask, ref, entropy = inputs(seed=1)  # seed 1: ratios clipped on both sides
    theirs: dict = {}
    trl_loss(logp, old, adv, mask, beta=0.04, ref_logp=ref, epsilon_high=0.28, entropies=entropy, metrics=theirs,
             delta=options.get("delta"), use_bias_correction_kl=options.get("kl_bias_correction", False))  # fmt: skip
    _, ours = policy_loss(
        logp, old, adv, mask, plain(beta=0.04, epsilon_high=0.28, **options), ref_logp=ref, entropy=entropy,
        normalizer=loss_normalizer(mask, "token_mean"),
    )  # fmt: skip
    pairs = {"kl": "kl", "entropy": "entropy", "clip_frac_low": "clip_ratio/low_mean"}
    pairs["clip_frac_high"] = "clip_ratio/high_mean"
    for key, trl_key in pairs.items():
        assert ours[key].item() == pytest.approx(theirs[trl_key], rel=1e-12, abs=1e-15), key
    assert 0 < theirs["clip_ratio/low_mean"] and 0 < theirs["clip_ratio/high_mean"]  # the inputs clip both ways


@pytest.mark.parametrize("loss_type", ["cispo", "sapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_cispo_and_sapo_objectives_equal_trl(loss_type, beta, level):
    """grpo.objective cispo (TRL's loss_type cispo, with token_mean) and sapo (with seq_mean), values and gradients;
    the cap at 1.3 acts on the inputs' ratios (up to ~2.5), and SAPO at other temperatures too."""
    assert_same(both(loss_type, beta, level=level, eps=(0.2, 1.3)))
    assert_same(both(loss_type, beta, level=level, eps=(0.2, 5.0), sapo_temperature_pos=0.5, sapo_temperature_neg=3))
    if loss_type == "cispo" and level == "token":
        assert not torch.equal(both(loss_type, beta, eps=(0.2, 1.3))[0][1][0], both(loss_type, beta)[0][1][0])


@pytest.mark.parametrize("loss_type", ["cispo", "sapo"])
def test_cispo_and_sapo_compose_with_the_other_options_as_in_trl(loss_type):
    """The top-entropy selection, the entropy bonus, the sampler correction's weights, the off-policy mask and the
    bias-corrected KL around either objective, as TRL applies them."""
    logp, *_ = inputs()
    ratio = torch.rand(logp.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 2
    assert_same(both(loss_type, 0.04, quantile=0.5, coef=0.1, is_ratio=ratio, eps=(0.2, 1.3)))
    assert_same(both(loss_type, 0.04, off_policy_mask_threshold=0.1, kl_bias_correction=True, eps=(0.2, 1.3)))


def test_cispo_and_sapo_logged_clip_fractions_equal_trls():
    """clip_frac_high under cispo is TRL's cispo_clip_ratio (capped weights of tokens with A > 0), clip_frac_low 0;
    sapo clips nothing (TRL logs no clip ratio for it): both 0. The kl and entropy logged as TRL's."""
    logp, old, adv, mask, ref, entropy = inputs(seed=1)
    for loss_type in ("cispo", "sapo"):
        theirs: dict = {}
        trl_loss(logp, old, adv, mask, loss_type=loss_type, beta=0.04, ref_logp=ref, epsilon_high=1.3,
                 entropies=entropy, metrics=theirs)  # fmt: skip
        objective, aggregation = OURS[loss_type]
        _, ours = policy_loss(
            logp, old, adv, mask, plain(beta=0.04, objective=objective, aggregation=aggregation, cispo_max=1.3),
            ref_logp=ref, entropy=entropy, normalizer=loss_normalizer(mask, aggregation),
        )  # fmt: skip
        for key in ("kl", "entropy"):
            assert ours[key].item() == pytest.approx(theirs[key], rel=1e-12), (loss_type, key)
        high = theirs.get("cispo_clip_ratio", 0.0)
        assert ours["clip_frac_high"].item() == pytest.approx(high, rel=1e-12) and ours["clip_frac_low"] == 0
    assert high == 0 and theirs.keys().isdisjoint({"clip_ratio/high_mean", "clip_ratio/low_mean"})


def token_is_ratio(seed=5, zero=False):
    """Sampler-correction token weights in [0, 2), 1 on the inputs' padding (as TRL's, whose vespo sums every
    position's log weight); ``zero``: one token's weight 0, as a token_mask mode drops it."""
    logp, _, _, mask, *_ = inputs()
    ratio = torch.rand(logp.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2
    ratio = torch.where(mask > 0, ratio, torch.ones_like(ratio))
    if zero:
        ratio[2, 4] = 0.0
    return ratio


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize(
    "shape",
    [{}, dict(zip(VESPO_KEYS, (1.0, 0.5, 0.5, 4.0))), dict(zip(VESPO_KEYS, (2.0, 1e-5, 3.0, 2.0)))],
    ids=["trl_defaults", "other_weights", "lambda_below_trls_floor"],
)
def test_vespo_objective_equals_trl(beta, shape):
    """grpo.objective vespo (TRL's loss_type vespo, with token_mean): values and gradients, at TRL's k / lambda and
    others. The inputs' sequence weights spread (their log-ratio sums ~ +-1), so phi is far from 1 on most rows."""
    assert_same(both("vespo", beta, **shape))
    plain_reinforce = both("cispo", beta, eps=(0.2, 1e6))[0][1][0]  # -A log pi with the weight 1 on every row
    assert not torch.allclose(both("vespo", beta, **shape)[0][1][0], plain_reinforce)


def test_vespo_composes_with_the_other_options_as_in_trl():
    """The sampler correction's token weights go into vespo's sequence weight, not onto its loss (one weight 0: that
    sequence's weight falls to the floor); the top-entropy selection, the entropy bonus, the off-policy mask and the
    bias-corrected KL around it, as TRL applies them."""
    assert_same(both("vespo", 0.04, quantile=0.5, coef=0.1, is_ratio=token_is_ratio()))
    assert_same(both("vespo", 0.04, is_ratio=token_is_ratio(zero=True)))
    assert_same(both("vespo", 0.04, off_policy_mask_threshold=0.1, kl_bias_correction=True))
    zeroed = both("vespo", 0.0, is_ratio=token_is_ratio(zero=True))[0][1][0]
    assert zeroed[2].abs().max() < 1e-6 * zeroed.abs().max()  # the dropped token's sequence trains no more


def test_vespo_logged_sequence_weight_equals_trls():
    """sequence_weight_sum / sequences is TRL's vespo/phi_seq_mean; vespo clips nothing (no clip fraction)."""
    logp, old, adv, mask, ref, entropy = inputs(seed=1)
    theirs: dict = {}
    trl_loss(logp, old, adv, mask, loss_type="vespo", beta=0.04, ref_logp=ref, entropies=entropy, metrics=theirs)
    _, ours = policy_loss(
        logp, old, adv, mask, plain(beta=0.04, objective="vespo"), ref_logp=ref, entropy=entropy,
        normalizer=loss_normalizer(mask, "token_mean"),
    )  # fmt: skip
    mean = ours["sequence_weight_sum"] / ours["sequences"]
    assert mean.item() == pytest.approx(theirs["vespo/phi_seq_mean"], rel=1e-12) and ours["sequences"] == 6
    assert 0.05 < mean.item() < 0.95  # the weights are not all 1 (on-policy) nor 0
    assert ours["clip_frac_low"] == 0 and ours["clip_frac_high"] == 0
    assert ours["kl"].item() == pytest.approx(theirs["kl"], rel=1e-12)
