"""GRPO math against hand-computed values (see the comments for the arithmetic)."""

import math

import pytest
import torch
from plain_loss import plain

from glm_grpo_ds.advantages import group_advantages
from glm_grpo_ds.grpo import k3_kl, loss_normalizer, policy_loss


# ---------------------------------------------------------------- advantages
def test_group_scale_hand_values():
    # group 1: mean 2, centered [-1, 0, 1], unbiased std sqrt(2/2) = 1
    # group 2: all equal -> exactly 0
    # group 3: [0, 0, 3]: mean 1, centered [-1, -1, 2], unbiased std sqrt(6/2) = sqrt(3)
    r = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0, 0.0, 0.0, 3.0], dtype=torch.float64)
    adv = group_advantages(r, group_size=3, scale="group", eps=1e-4)
    s3 = math.sqrt(3.0)
    expected = [-1 / 1.0001, 0.0, 1 / 1.0001, 0.0, 0.0, 0.0, -1 / (s3 + 1e-4), -1 / (s3 + 1e-4), 2 / (s3 + 1e-4)]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    assert adv[3:6].eq(0).all()


def test_batch_scale_hand_values():
    # std of all six rewards: mean 3.5, squared deviations sum 15.5, /5 = 3.1
    r = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0], dtype=torch.float64)
    adv = group_advantages(r, group_size=3, scale="batch", eps=1e-4)
    std = math.sqrt(3.1)
    expected = [-1 / (std + 1e-4), 0.0, 1 / (std + 1e-4), 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


def test_none_scale_and_constant_group_exact_zero():
    r = torch.tensor([1.0, 2.0, 3.0, 0.1, 0.1, 0.1])
    adv = group_advantages(r, group_size=3, scale="none")
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]))
    # 0.1 * 3 / 3 != 0.1 in floating point: the constant group must still be exactly 0.
    assert adv[3:].eq(0).all()
    assert group_advantages(r, 3, scale="group")[3:].eq(0).all()


def test_rloo_hand_values():
    # leave-one-out: r_i - mean of the other G-1 rewards of its group
    # group 1 [1, 2, 3, 6]: others' means 11/3, 10/3, 9/3, 6/3
    # group 2 [1, NaN, 3, 5]: NaN is left out (advantage 0); others' means (3+5)/2, (1+5)/2, (1+3)/2
    # group 3 [4, 4, 4, 4]: constant -> exactly 0
    r = torch.tensor([1.0, 2.0, 3.0, 6.0, 1.0, math.nan, 3.0, 5.0, 4.0, 4.0, 4.0, 4.0], dtype=torch.float64)
    adv = group_advantages(r, group_size=4, scale="rloo")
    expected = [1 - 11 / 3, 2 - 10 / 3, 3 - 3, 6 - 2, 1 - 4, 0.0, 3 - 3, 5 - 2, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    assert adv[8:].eq(0).all() and adv[5] == 0
    # a group with one defined reward has no baseline: 0
    assert group_advantages(torch.tensor([2.0, math.nan]), 2, scale="rloo").eq(0).all()


def test_advantages_are_zero_mean_per_group():
    torch.manual_seed(0)
    r = torch.randn(4 * 5, dtype=torch.float64)
    for scale in ("group", "batch", "none", "rloo"):
        adv = group_advantages(r, 5, scale=scale).view(4, 5)
        torch.testing.assert_close(adv.sum(1), torch.zeros(4, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("bad", [dict(group_size=4), dict(group_size=3, scale="zscore")])
def test_advantage_input_errors(bad):
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(6), **bad)


# ---------------------------------------------------------------- policy loss
# Two rows, T = 3; old_logp = 0 so ratio = exp(logp). Clip range [0.8, 1.28].
#   row 0, A = +1, ratios [1.0, 1.5, 0.5], mask [1, 1, 1]
#     -min(r, clip r): -1.0, -1.28 (high clip), -0.5 (no clip: A > 0, low ratio)  -> sum -2.78
#   row 1, A = -2, ratios [1.3, 0.7, 2.0], mask [1, 1, 0]
#     -min(-2r, -2 clip r): 2.6 (no clip: A < 0, high ratio), 1.6 (low clip), masked  -> sum 4.2
RATIOS = [[1.0, 1.5, 0.5], [1.3, 0.7, 2.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
ADV = [1.0, -2.0]
EPS_LOW, EPS_HIGH = 0.2, 0.28


def _inputs():
    logp = torch.tensor(RATIOS, dtype=torch.float64).log().requires_grad_(True)
    old = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor(ADV, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor(MASK, dtype=torch.float64)
    return logp, old, adv, mask


@pytest.mark.parametrize(
    "aggregation,expected",
    [
        ("token_mean", (-2.78 + 4.2) / 5),
        ("seq_mean", (-2.78 / 3 + 4.2 / 2) / 2),
        ("dr_grpo", (-2.78 + 4.2) / (2 * 3)),
    ],
)
def test_policy_loss_hand_values(aggregation, expected):
    logp, old, adv, mask = _inputs()
    loss, stats = policy_loss(
        logp, old, adv, mask, plain(epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, aggregation=aggregation)
    )
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    # one high-side clip (row 0, r=1.5, A>0) and one low-side clip (row 1, r=0.7, A<0) of 5 tokens
    assert stats["clip_frac_high"].item() == pytest.approx(0.2)
    assert stats["clip_frac_low"].item() == pytest.approx(0.2)
    # masked ratios 1, 1.5, 0.5, 1.3, 0.7: the masked-out 2.0 must not count
    assert stats["ratio_mean"].item() == pytest.approx(1.0)
    assert stats["ratio_min"].item() == pytest.approx(0.5)
    assert stats["ratio_max"].item() == pytest.approx(1.5)
    assert stats["num_tokens"].item() == 5
    assert all(not v.requires_grad for v in stats.values())


def test_symmetric_epsilon_changes_high_clip():
    # With epsilon_high = 0.2 the clip range is [0.8, 1.2]: row 0 r=1.5 contributes -1.2 and
    # row 1 r=1.3 (A<0) is still unclipped: sum = -1 - 1.2 - 0.5 + 2.6 + 1.6 = 1.5
    logp, old, adv, mask = _inputs()
    loss, _ = policy_loss(logp, old, adv, mask, plain(epsilon_low=0.2, epsilon_high=0.2))
    assert loss.item() == pytest.approx(1.5 / 5, abs=1e-12)


def test_gradient_only_through_logp_and_hand_values():
    logp, old, adv, mask = _inputs()
    ref = (logp.detach() + 0.1).requires_grad_(True)
    loss, _ = policy_loss(
        logp, old, adv, mask, plain(epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, beta=0.0), ref_logp=ref
    )
    loss.backward()
    assert old.grad is None and adv.grad is None and ref.grad is None
    # d/dlogp of -A r = -A r on unclipped tokens, 0 on clipped and masked ones; / 5 tokens
    expected = torch.tensor([[-1.0, 0.0, -0.5], [2.6, 0.0, 0.0]], dtype=torch.float64) / 5
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-12)


def test_without_a_reference_the_kl_is_not_measured_not_zero():
    """beta 0 loads no reference: the kl statistic was a 0 nobody measured; NaN, which metrics.jsonl writes null."""
    import math

    logp, old, adv, mask = _inputs()
    _, stats = policy_loss(logp, old, adv, mask, plain(beta=0.0))
    assert math.isnan(stats["kl"].item())


def test_kl_zero_when_ref_equals_policy():
    logp, old, adv, mask = _inputs()
    base, _ = policy_loss(logp, old, adv, mask, plain(epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH))
    loss, stats = policy_loss(
        logp, old, adv, mask, plain(epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, beta=0.7), ref_logp=logp.detach()
    )
    assert stats["kl"].item() == 0.0
    assert loss.item() == base.item()


def test_kl_hand_value():
    # ref - logp = 0.1 everywhere: k3 = e^0.1 - 0.1 - 1 per token; beta 0.5, token mean
    logp, old, adv, mask = _inputs()
    k3 = math.exp(0.1) - 1.1
    loss, stats = policy_loss(
        logp, old, adv, mask, plain(epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, beta=0.5), ref_logp=logp.detach() + 0.1
    )
    assert stats["kl"].item() == pytest.approx(k3, abs=1e-12)
    assert loss.item() == pytest.approx(1.42 / 5 + 0.5 * k3, abs=1e-12)
    assert k3_kl(torch.tensor(0.3), torch.tensor(0.3)).item() == 0.0


def test_ratio_one_when_policy_equals_old():
    logp = torch.randn(3, 4, dtype=torch.float64)
    _, stats = policy_loss(
        logp, logp.clone(), torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64), torch.ones(3, 4), plain()
    )
    assert stats["ratio_min"].item() == stats["ratio_max"].item() == 1.0
    assert stats["clip_frac_low"].item() == stats["clip_frac_high"].item() == 0.0


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "dr_grpo"])
def test_micro_batches_sum_to_full_batch(aggregation):
    torch.manual_seed(0)
    n, t = 6, 5
    logp = (torch.randn(n, t, dtype=torch.float64) * 0.3).requires_grad_(True)
    old = logp.detach() + 0.2 * torch.randn(n, t, dtype=torch.float64)
    ref = logp.detach() + 0.1 * torch.randn(n, t, dtype=torch.float64)
    adv = torch.randn(n, dtype=torch.float64)
    mask = (torch.rand(n, t) > 0.3).double()
    settings = plain(beta=0.05, aggregation=aggregation)

    full, _ = policy_loss(logp, old, adv, mask, settings, ref_logp=ref)
    (g_full,) = torch.autograd.grad(full, logp)

    norm = loss_normalizer(mask, aggregation)
    total = 0.0
    for sl in (slice(0, 2), slice(2, 3), slice(3, 6)):
        part, _ = policy_loss(logp[sl], old[sl], adv[sl], mask[sl], settings, ref_logp=ref[sl], normalizer=norm)
        total = total + part
    (g_micro,) = torch.autograd.grad(total, logp)
    torch.testing.assert_close(total, full, rtol=0, atol=1e-12)
    torch.testing.assert_close(g_micro, g_full, rtol=0, atol=1e-12)


def test_policy_loss_input_errors():
    logp, old, adv, mask = _inputs()
    with pytest.raises(ValueError, match="beta"):
        policy_loss(logp, old, adv, mask, plain(beta=0.1))
    with pytest.raises(ValueError, match="aggregation"):
        policy_loss(logp, old, adv, mask, plain(aggregation="mean"))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old, adv[:1], mask, plain())


def test_preview_tokens_can_be_left_out_of_the_loss(preview_batch):
    """grpo.preview_in_loss=false: only the target grid's tokens count (mask and normaliser)."""
    from glm_grpo_ds.update import without_preview_loss

    batch = preview_batch  # 3 preview + 2 target tokens
    n = batch.grid.num_tokens
    masked = without_preview_loss(batch)
    assert masked.completion_mask.tolist() == [[0, 0, 0, 1, 1]] * 2
    assert batch.completion_mask.sum() == 2 * n  # the rollout itself is untouched
    # the loss only sees target tokens: changing a preview log-prob changes nothing
    logp = torch.randn(2, n, requires_grad=True)
    loss, stats = policy_loss(logp, logp.detach(), torch.tensor([1.0, -1.0]), masked.completion_mask, plain())
    loss.backward()
    assert torch.equal(logp.grad[:, :3], torch.zeros(2, 3)) and stats["num_tokens"] == 4


# ---------------------------------------------------------------- registries of the math variants
def test_registry_lookups_list_the_valid_names():
    from glm_grpo_ds.advantages import COMBINATIONS, ESTIMATORS
    from glm_grpo_ds.grpo import AGGREGATIONS

    with pytest.raises(
        ValueError, match=r"^unknown aggregation 'nope'; expected one of \('token_mean', 'seq_mean', 'dr_grpo'\)$"
    ):
        AGGREGATIONS.get("nope")
    with pytest.raises(
        ValueError,
        match=r"^unknown advantage estimator 'zscore'; expected one of \('group', 'batch', 'none', 'rloo'\)$",
    ):
        ESTIMATORS.get("zscore")
    with pytest.raises(
        ValueError,
        match=r"^unknown reward combination 'mix'; expected one of "
        r"\('sum_then_normalize', 'normalize_then_sum', 'win_rate', 'win_rate_per_reward'\)$",
    ):
        COMBINATIONS.get("mix")
    with pytest.raises(ValueError, match="unknown aggregation 'nope'"):
        loss_normalizer(torch.ones(2, 3), "nope")
    with pytest.raises(ValueError, match="unknown aggregation 'nope'"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), plain(aggregation="nope"))


def test_registered_variant_is_used_by_name(monkeypatch):
    from glm_grpo_ds.advantages import ESTIMATORS
    from glm_grpo_ds.grpo import AGGREGATIONS, Aggregation

    half = Aggregation(AGGREGATIONS.get("token_mean").per_sequence, lambda mask: torch.tensor(mask.numel() / 2.0))
    monkeypatch.setitem(AGGREGATIONS, "half_slots", half)
    mask = torch.ones(2, 4)
    assert loss_normalizer(mask, "half_slots").item() == 4.0
    # the aggregation owns its per-sequence step: the loss has no special case for any name
    logp = torch.full((2, 4), math.log(1.0))
    loss, _ = policy_loss(logp, logp, torch.tensor([1.0, 1.0]), mask, plain(aggregation="half_slots"))
    assert loss.item() == pytest.approx(-8 / 4)
    assert set(ESTIMATORS) == {"group", "batch", "none", "rloo"}


def test_registry_helper_refuses_a_second_registration_and_lists_names():
    from glm_grpo_ds.runtime.registries import Registry

    reg = Registry("thing")
    reg.register("a", 1)

    @reg.register("b")
    def b():
        return 2

    assert tuple(reg) == ("a", "b") and reg.get("b") is b and reg["a"] == 1 and "a" in reg and len(reg) == 2
    with pytest.raises(ValueError, match=r"^thing 'a' is already registered$"):
        reg.register("a", 3)
    with pytest.raises(ValueError, match=r"^unknown thing 'c'; expected one of \('a', 'b'\)$"):
        reg.get("c")
    del reg["a"]
    assert tuple(reg) == ("b",)


def test_reward_disagreement_by_hand_and_the_gate():
    """Two rewards over one group of 3 and one of 2: z within each group (unbiased std), the gap |z_main - z_aux|,
    NaN where a reward is undefined, and the gate zeroing only the samples above it."""
    from glm_grpo_ds.advantages import gate_disagreeing, reward_disagreement

    main = torch.tensor([0.0, 1.0, 2.0, 5.0, 5.0])
    aux = torch.tensor([2.0, 1.0, 0.0, 1.0, float("nan")])  # group 1 in the opposite order; one undefined
    d = reward_disagreement({"main": main[:3], "aux": aux[:3]}, group_size=3)
    # group (0, 1, 2): mean 1, std 1, z = (-1, 0, 1) against (1, 0, -1); eps 1e-4 in the std
    assert d.tolist() == pytest.approx([2 / 1.0001, 0.0, 2 / 1.0001])
    d = reward_disagreement({"main": main[3:], "aux": aux[3:]}, group_size=2)
    assert d[0].item() == 0.0 and math.isnan(d[1].item())  # a constant group has z 0; aux undefined: NaN
    third = torch.tensor([0.0, 1.0, 2.0])  # agrees with main: the worst gap is the other reward's
    d = reward_disagreement({"main": main[:3], "agree": third, "aux": aux[:3]}, group_size=3)
    assert d.tolist() == pytest.approx([2 / 1.0001, 0.0, 2 / 1.0001])
    assert reward_disagreement({"main": main}, group_size=5) is None
    adv = torch.tensor([-1.0, 0.0, 1.0])
    assert gate_disagreeing(adv, d, 1.5).tolist() == [0.0, 0.0, 0.0]
    assert gate_disagreeing(adv, d, 2.5).tolist() == adv.tolist()
    assert gate_disagreeing(adv, d, None) is adv
    gaps = torch.tensor([float("nan"), 3.0, 0.0])
    assert gate_disagreeing(torch.tensor([-1.0, 0.5, 1.0]), gaps, 1.0).tolist() == [-1.0, 0.0, 1.0]  # NaN: kept


def test_advantage_record_by_hand():
    """``advantages/mean`` and ``advantages/std`` of metrics.jsonl (observability/metrics.py advantage_fields): the
    mean and the unbiased std of the advantages the update trains on, zeros of dead groups included."""
    from glm_grpo_ds.advantages import combine_advantages
    from glm_grpo_ds.observability.metrics import advantage_fields

    # [1, 2, 3, 6]: mean 3; squared deviations 4 + 1 + 0 + 9 = 14, / 3 -> std sqrt(14 / 3) = 2.1602
    # (a population std, / 4, would be 1.8708; a mean of |A| would be 3 too, so the next case tells them apart)
    fields = advantage_fields(torch.tensor([1.0, 2.0, 3.0, 6.0]))
    assert fields == {"advantages/mean": pytest.approx(3.0), "advantages/std": pytest.approx(math.sqrt(14 / 3))}
    # the trainer's path: groups [1, 2, 3] (z = (-1, 0, 1) / 1.0001) and [5, 5, 5] (dead: 0, 0, 0); mean 0 and
    # std sqrt(2 / 1.0001^2 / 5) = 0.63239 - below 1 because half the batch teaches nothing
    adv, _ = combine_advantages({"r": torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])}, {"r": 1.0}, group_size=3)
    fields = advantage_fields(adv)
    assert fields["advantages/mean"] == pytest.approx(0.0, abs=1e-7)
    assert fields["advantages/std"] == pytest.approx(math.sqrt(0.4) / 1.0001, rel=1e-6)
    assert advantage_fields(torch.tensor([0.5])) == {"advantages/mean": 0.5, "advantages/std": None}


# ---------------------------------------------------------------- objectives (grpo.objective)
def _two_tokens(objective: str, **settings):
    """Two one-token rows: ratio 7 with A = +2 and log pi = -0.5; ratio 0.5 with A = -1 and log pi = -1.0."""
    logp = torch.tensor([[-0.5], [-1.0]], dtype=torch.float64, requires_grad=True)
    old = logp.detach() - torch.tensor([[math.log(7.0)], [math.log(0.5)]], dtype=torch.float64)
    adv = torch.tensor([2.0, -1.0], dtype=torch.float64)
    loss, stats = policy_loss(logp, old, adv, torch.ones_like(old), plain(objective=objective, **settings))
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.item(), grad.flatten().tolist(), stats


def test_cispo_by_hand():
    # loss per token -min(r, cap) A log pi, the weight detached; token mean over 2 tokens:
    # row 1: -min(7, 5) * 2 * -0.5 = 5; row 2: -0.5 * -1 * -1.0 = -0.5; (5 - 0.5) / 2 = 2.25
    # d/dlogp: -min(r, cap) A / 2 = -5, +0.25 (the weight's own dependence on logp cut)
    loss, grad, stats = _two_tokens("cispo", cispo_max=5.0)
    assert loss == pytest.approx(2.25, abs=1e-12) and grad == pytest.approx([-5.0, 0.25], abs=1e-12)
    assert stats["clip_frac_high"].item() == 0.5 and stats["clip_frac_low"].item() == 0  # row 1 capped, A > 0


def test_sapo_by_hand():
    # loss per token -(4 / tau) sigmoid(tau (r - 1)) A, tau 1 for A > 0 and 1.05 otherwise; token mean over 2:
    # d/dlogp = -(4 / tau) sigmoid'(tau (r - 1)) tau r A / 2 = -4 s (1 - s) r A / 2 with s the sigmoid
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    s1, s2 = sig(1.0 * (7 - 1)), sig(1.05 * (0.5 - 1))
    loss, grad, stats = _two_tokens("sapo", sapo_temperature_pos=1.0, sapo_temperature_neg=1.05)
    assert loss == pytest.approx((-4 * s1 * 2 - 4 / 1.05 * s2 * -1) / 2, abs=1e-12)
    assert grad == pytest.approx([-4 * s1 * (1 - s1) * 7 * 2 / 2, -4 * s2 * (1 - s2) * 0.5 * -1 / 2], abs=1e-12)
    assert stats["clip_frac_high"].item() == 0 and stats["clip_frac_low"].item() == 0  # a soft gate cuts nothing


def test_vespo_by_hand():
    # loss per token -phi(w) A log pi, phi detached, phi(w) = e^lam w^k e^(-lam w); token mean over 2 tokens:
    # row 1 (A > 0: k 2, lam 3): phi(7) = e^3 49 e^-21 = 49 e^-18; row 2 (A < 0: k 3, lam 2): phi(0.5) = e^2 0.125 e^-1
    phi1, phi2 = 49 * math.exp(-18), 0.125 * math.e
    loss, grad, stats = _two_tokens("vespo")
    assert loss == pytest.approx((-phi1 * 2 * -0.5 - phi2 * -1 * -1.0) / 2, abs=1e-12)
    assert grad == pytest.approx([-phi1 * 2 / 2, phi2 / 2], abs=1e-12)
    assert stats["sequence_weight_sum"].item() == pytest.approx(phi1 + phi2) and stats["sequences"] == 2


def test_vespo_weight_is_the_product_over_a_sequence_and_skips_its_padding():
    # one row of 3 tokens, the last padding: ratios 2 and 0.5 multiply to w = 1, so phi = 1 whatever the ratio on
    # the padding (20) and the sampler correction's weight there (0.01); a correction weight of 2 on a real token
    # makes w = 2: phi = e^3 4 e^-6 = 4 e^-3 (A > 0)
    logp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, requires_grad=True)
    old = logp.detach() - torch.log(torch.tensor([[2.0, 0.5, 20.0]], dtype=torch.float64))
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([1.0], dtype=torch.float64)

    def weight(is_weights):
        _, stats = policy_loss(logp, old, adv, mask, plain(objective="vespo"), is_weights=is_weights)
        return stats["sequence_weight_sum"].item()

    assert weight(None) == pytest.approx(1.0, abs=1e-12)
    assert weight(torch.tensor([[1.0, 1.0, 0.01]], dtype=torch.float64)) == pytest.approx(1.0, abs=1e-12)
    assert weight(torch.tensor([[2.0, 1.0, 1.0]], dtype=torch.float64)) == pytest.approx(4 * math.exp(-3), abs=1e-12)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_on_policy_every_objective_has_the_clipped_surrogates_gradient(level):
    """At ratio 1 (one update per rollout, the sampler exact) the objectives differ in value only: CISPO's weight
    is 1 under its cap, SAPO's gate has slope 1 at r = 1 (sigmoid'(0) x 4 = 1), VESPO's phi(1) = 1, so each gives
    -A grad log pi."""
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 3
    adv = torch.randn(4, generator=g, dtype=torch.float64)
    grads = {}
    for objective in ("clip", "cispo", "sapo", "vespo"):
        logp = old.clone().requires_grad_()
        loss, _ = policy_loss(logp, old, adv, torch.ones_like(old), plain(objective=objective,
                              importance_sampling_level=level))  # fmt: skip
        grads[objective] = torch.autograd.grad(loss, logp)[0]
    torch.testing.assert_close(grads["cispo"], grads["clip"], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grads["sapo"], grads["clip"], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grads["vespo"], grads["clip"], rtol=1e-12, atol=1e-14)


def test_mini_batches_are_a_kth_of_every_group_and_the_same_on_any_number_of_ranks():
    """update.py mini_batch_order, by hand: 2 groups of 4 in 2 mini-batches are samples 0-1 of both groups, then 2-3.
    The k-th mini-batch of a step (the union over ranks, each holding whole groups in the draw's order) is the same
    set of (prompt, sample) on 1, 2 and 4 ranks; a K that does not divide G leaves the rows in order (None)."""
    from glm_grpo_ds.update import mini_batch_order

    assert mini_batch_order(8, 4, 2).tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    assert mini_batch_order(8, 4, 4).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert mini_batch_order(8, 4, 1) is None and mini_batch_order(6, 3, 2) is None

    def global_mini_batches(world, prompts=4, group=8, k=4):
        per_rank = prompts // world * group
        out = [set() for _ in range(k)]
        for rank in range(world):
            order = mini_batch_order(per_rank, group, k)
            for j, chunk in enumerate(order.view(k, -1)):
                rows = rank * per_rank + chunk  # a row of the step's draw: prompt row // group, sample row % group
                out[j] |= {(int(r) // group, int(r) % group) for r in rows}
        return out

    one = global_mini_batches(1)
    assert one == global_mini_batches(2) == global_mini_batches(4)
    assert one[1] == {(p, s) for p in range(4) for s in (2, 3)}
