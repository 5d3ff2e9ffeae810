"""The #30 loss options and metrics of glm_grpo_ds/grpo.py against values computed by hand: the sequence-level
ratio (GSPO), the sampler-correction weights and the bias they remove, the top-entropy selection, and the
sampler-vs-trainer mismatch sums."""

import math

import pytest
import torch
from plain_loss import plain

from glm_grpo_ds.corrections import mismatch_sums, sampler_correction
from glm_grpo_ds.grpo import high_entropy_mask, policy_loss
from glm_grpo_ds.runtime.ports import free_port


def test_the_loss_settings_are_the_grpo_sections_own_values():
    """update.loss_settings: the run's one LossSettings, each field the grpo section's value of that name."""
    import dataclasses

    from glm_grpo_ds.config import GRPOConfig
    from glm_grpo_ds.update import loss_settings

    changed = dict(beta=0.04, epsilon_high=0.28, aggregation="seq_mean", entropy_coef=0.01, delta=1.5)
    changed.update(off_policy_mask_threshold=0.1, kl_bias_correction=True, objective="sapo", cispo_max=3.0)
    changed.update(sapo_temperature_pos=0.5, sapo_temperature_neg=2.0, vespo_k_pos=1.0, vespo_lambda_pos=2.0)
    changed.update(vespo_k_neg=4.0, vespo_lambda_neg=5.0)
    for g in (GRPOConfig(), GRPOConfig(**changed)):
        s = loss_settings(g)
        assert {f.name: getattr(g, f.name) for f in dataclasses.fields(s)} == dataclasses.asdict(s)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.beta = 0.0


def test_gspo_clips_the_geometric_mean_ratio_of_the_sequence():
    old = torch.tensor([[-1.0, -2.0]])
    logp = (old + torch.tensor([[0.2, 0.4]])).requires_grad_()  # mean log-ratio 0.3: ratio e^0.3 = 1.3499
    mask = torch.ones(1, 2)
    for adv, expect_loss, expect_grad in (
        (1.0, -1.2, [0.0, 0.0]),  # A > 0: the clipped 1.2 is the min; no gradient
        (-1.0, math.exp(0.3), [math.exp(0.3) / 2] * 2),  # A < 0: -min(-1.35, -1.2) = 1.35; d/dlogp_t = ratio / 2
    ):
        loss, stats = policy_loss(logp, old, torch.tensor([adv]), mask, plain(importance_sampling_level="sequence"))
        (grad,) = torch.autograd.grad(loss, logp)
        assert loss.item() == pytest.approx(expect_loss, rel=1e-6)
        assert grad[0].tolist() == pytest.approx(expect_grad, rel=1e-6)
        # the sequence's ratio counts once per token in the stats
        assert stats["ratio_mean"].item() == pytest.approx(math.exp(0.3), rel=1e-6)
    # token level on the same numbers: ratios e^0.2 and e^0.4, clipped one by one
    loss, _ = policy_loss(logp, old, torch.tensor([1.0]), mask, plain())
    assert loss.item() == pytest.approx(-(min(math.exp(0.2), 1.2) + 1.2) / 2, rel=1e-6)


def test_sampler_correction_weights_by_hand():
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    sampler = old - torch.tensor([[0.0, math.log(2.0), math.log(5.0)], [0.1, 0.1, -0.2]])  # old/sampler = 1, 2, 5
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    assert sampler_correction(old, sampler, mask, "none") is None
    w = sampler_correction(old, sampler, mask, "token_truncate", cap_max=3.0)
    assert w[0].tolist() == pytest.approx([1.0, 2.0, 3.0])
    assert w[1, 2].item() == 1.0  # a masked token's weight is exactly 1
    w = sampler_correction(old, sampler, mask, "token_mask", cap_max=3.0, cap_min=1.5)
    assert w[0].tolist() == pytest.approx([0.0, 2.0, 0.0])
    w = sampler_correction(old, sampler, mask, "sequence_truncate", cap_max=3.0)
    assert w.shape == (2, 1) and w[:, 0].tolist() == pytest.approx([3.0, math.exp(0.2)])  # 1 x 2 x 5 -> 3
    w = sampler_correction(old, sampler, mask, "sequence_mask", cap_max=3.0)
    assert w[:, 0].tolist() == pytest.approx([0.0, math.exp(0.2)])
    assert torch.equal(sampler_correction(old, old, mask, "token_truncate"), torch.ones_like(old))  # agree -> 1


def test_the_correction_removes_the_bias_of_a_perturbed_sampler():
    """One-token sequences over 3 ids. The policy is softmax(theta); the sampler draws at temperature 0.5
    instead of 1 (what a temperature applied in one path only does). The expected loss gradient over the
    sampler's draws is biased; weighted by pi / q (no cap) it is exactly the policy gradient -dE_pi[A]/dtheta."""
    theta = torch.tensor([0.3, -0.5, 1.1], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    pi = torch.softmax(theta, 0)
    q = torch.softmax(theta.detach() / 0.5, 0)
    (true_grad,) = torch.autograd.grad(-(pi * adv).sum(), theta)

    def expected_grad(correct: bool) -> torch.Tensor:
        total = torch.zeros(3, dtype=torch.float64)
        for x in range(3):
            logp = torch.log_softmax(theta, 0)[x].reshape(1, 1)
            old = logp.detach()
            mask = torch.ones(1, 1, dtype=torch.float64)
            w = (
                sampler_correction(old, q[x].log().reshape(1, 1), mask, "token_truncate", cap_max=1e9)
                if correct
                else None
            )
            loss, _ = policy_loss(logp, old, adv[x : x + 1], mask, plain(), is_weights=w)
            (g,) = torch.autograd.grad(loss, theta)
            total += q[x] * g  # the sampler draws x with probability q(x)
        return total

    torch.testing.assert_close(expected_grad(True), true_grad, rtol=1e-12, atol=1e-12)
    assert (expected_grad(False) - true_grad).abs().max() > 0.05


def test_high_entropy_mask_by_hand():
    entropy = torch.tensor([[0.1, 0.9, 0.5, 0.7], [0.3, 0.2, 5.0, 0.8]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 1]])  # 5.0 is masked: it neither counts nor is kept
    # 7 masked entropies 0.1 0.2 0.3 0.5 0.7 0.8 0.9; the 0.5-quantile is 0.5: keep >= 0.5
    kept = high_entropy_mask(entropy, mask, 0.5)
    assert kept.int().tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    assert high_entropy_mask(entropy, mask, 0.0).int().tolist() == [[0, 1, 0, 0], [0, 0, 0, 0]]  # the top one
    assert torch.equal(high_entropy_mask(entropy, mask, 1.0), mask.bool())


def test_mismatch_sums_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -3.0]])
    sampler = torch.tensor([[-1.0, -2.5, -2.8]])  # d = log(trainer / sampler) = 0, 0.5, -0.2
    s = mismatch_sums(trainer, sampler, torch.tensor([[1.0, 1.0, 1.0]]), threshold=0.3)
    k3 = sum(math.exp(d) - 1 - d for d in (0.0, 0.5, -0.2))
    assert s["abs"].item() == pytest.approx(0.7) and s["max"].item() == pytest.approx(0.5)
    assert s["k3"].item() == pytest.approx(k3, rel=1e-6) and s["beyond"].item() == 1 and s["tokens"].item() == 3
    s = mismatch_sums(trainer, sampler, torch.tensor([[1.0, 0.0, 1.0]]), threshold=0.3)  # masked tokens do not count
    assert s["abs"].item() == pytest.approx(0.2) and s["beyond"].item() == 0 and s["tokens"].item() == 2
    # fp32 log-probs 1e-7 apart: k3 = d^2 / 2 ~ 5e-15, not fp32's ~1e-8 rounding of exp(d) - 1
    tiny = mismatch_sums(torch.tensor([[-1.0]]), torch.tensor([[-1.0 - 1.1920929e-07]]), torch.ones(1, 1), 0.1)
    assert tiny["k3"].item() == pytest.approx(1.1920929e-07**2 / 2, rel=1e-3)


def test_preview_weight_scales_the_preview_tokens_policy_term_only(preview_batch):
    """grpo.preview_weight: the preview grid's tokens weigh w in the policy term; the normaliser and the KL
    term still count them (unlike preview_in_loss: false); with the top-entropy selection the weights multiply."""
    from types import SimpleNamespace

    from glm_grpo_ds.update import policy_token_weights

    batch = preview_batch  # 3 preview + 2 target tokens
    n = batch.grid.num_tokens
    entropy = torch.tensor([[0.1, 0.9, 0.2, 0.8, 0.3], [0.4, 0.5, 0.6, 0.7, 0.05]])
    cfg = SimpleNamespace(top_entropy_quantile=1.0, preview_weight=0.25)
    weights = policy_token_weights(batch, entropy, cfg)
    assert weights.tolist() == [[0.25, 0.25, 0.25, 1.0, 1.0]] * 2
    assert policy_token_weights(batch, entropy, SimpleNamespace(top_entropy_quantile=1.0, preview_weight=1.0)) is None
    both = policy_token_weights(batch, entropy, SimpleNamespace(top_entropy_quantile=0.5, preview_weight=0.25))
    # top half of the 10 entropies: >= their median 0.45 -> 0.9 0.8 0.5 0.6 0.7
    assert both.tolist() == [[0.0, 0.25, 0.0, 1.0, 0.0], [0.0, 0.25, 0.25, 1.0, 0.0]]
    # a peaked distribution's fp32 entropy a little below 0 is a token of the pool all the same (it was taken for
    # padding, leaving 6 tokens whose median 0.25 dropped 0.1 and 0.2): the median of the 10 is (0 + 0.1) / 2
    peaked = entropy.clone()
    peaked[1] = torch.tensor([-4e-6, -3e-6, -2e-6, -1e-6, 0.0])
    top = policy_token_weights(batch, peaked, SimpleNamespace(top_entropy_quantile=0.5, preview_weight=1.0))
    assert top.tolist() == [[1.0] * 5, [0.0] * 5]

    logp = torch.randn(2, n, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, stats = policy_loss(logp, logp.detach(), adv, batch.completion_mask, plain(), token_weights=weights)
    (grad,) = torch.autograd.grad(loss, logp)
    # ratio 1: d loss / d logp_t = -A w_t / (number of tokens, 10: the preview still counts)
    expected = -adv[:, None] * weights.double() / 10
    torch.testing.assert_close(grad, expected)
    assert stats["num_tokens"] == 10


def test_entropy_bonus_is_the_mean_entropy_of_the_trained_tokens_by_hand():
    """Advantages 0 leave only the bonus: -c x the mean entropy over the tokens the policy term trains on,
    whatever the aggregation; a micro-batch counts by its share of the step's tokens."""
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    entropy = torch.tensor([[0.2, 0.4, 0.9], [0.6, 5.0, 5.0]])  # the masked 5.0s never count
    zero = torch.zeros(2)
    for aggregation in ("token_mean", "seq_mean", "dr_grpo"):
        loss, _ = policy_loss(logp, logp, zero, mask, plain(aggregation=aggregation, entropy_coef=0.5), entropy=entropy)
        assert loss.item() == pytest.approx(-0.5 * (0.2 + 0.4 + 0.9 + 0.6) / 4)
    selected = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # a top-entropy selection: 0.4, 0.9, 0.6
    loss, _ = policy_loss(logp, logp, zero, mask, plain(entropy_coef=0.5), token_weights=selected, entropy=entropy)
    assert loss.item() == pytest.approx(-0.5 * (0.4 + 0.9 + 0.6) / 3)
    loss, _ = policy_loss(
        logp, logp, zero, mask, plain(entropy_coef=0.5), token_weights=selected, entropy=entropy, entropy_share=0.25
    )
    assert loss.item() == pytest.approx(-0.5 * (0.4 + 0.9 + 0.6) / 3 * 0.25)


def _top_entropy_rank(rank: int, port: int, entropy: torch.Tensor, out_dir: str) -> None:
    """One of two gloo ranks: its half of the rows through update.policy_token_weights."""
    from types import SimpleNamespace

    from glm_grpo_ds.update import policy_token_weights

    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        half = slice(2 * rank, 2 * rank + 2)
        batch = SimpleNamespace(completion_mask=torch.ones(2, entropy.shape[1]))
        cfg = SimpleNamespace(top_entropy_quantile=0.25, preview_weight=1.0)
        torch.save(policy_token_weights(batch, entropy[half], cfg), f"{out_dir}/{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_top_entropy_threshold_is_taken_over_every_ranks_tokens(tmp_path):
    """As TRL gathers the entropies of all processes: two ranks select what one process selects from their
    union, not each the top quarter of its own tokens (rank 1's tokens are all lower here: it keeps none)."""

    import torch.multiprocessing as mp

    entropy = torch.tensor([[2.0, 1.9, 1.8, 1.7], [1.6, 1.5, 1.4, 1.3], [0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]])
    port = free_port()  # below the ephemeral range: no gloo connection takes it meanwhile
    mp.spawn(_top_entropy_rank, args=(port, entropy, str(tmp_path)), nprocs=2)
    ranks = torch.cat([torch.load(tmp_path / f"{r}.pt") for r in (0, 1)])
    alone = high_entropy_mask(entropy, torch.ones_like(entropy), 0.25).float()
    assert torch.equal(ranks, alone)
    assert ranks[2:].sum() == 0 and ranks[:2].sum() == 4  # the 4 highest of 16


def test_the_top_entropy_selection_reports_its_threshold_and_kept_tokens(preview_batch):
    """update.policy_token_weights fills ``selection`` (the metrics top_entropy/threshold and kept_fraction):
    the median 0.45 of the 10 entropies by hand, 5 of 10 tokens kept."""
    from types import SimpleNamespace

    from glm_grpo_ds.observability.update_stats import UpdateStats
    from glm_grpo_ds.update import policy_token_weights

    entropy = torch.tensor([[0.1, 0.9, 0.2, 0.8, 0.3], [0.4, 0.5, 0.6, 0.7, 0.05]])
    selection = {}
    policy_token_weights(
        preview_batch, entropy, SimpleNamespace(top_entropy_quantile=0.5, preview_weight=1.0), selection
    )
    assert selection["threshold"].item() == pytest.approx(0.45) and selection["kept"] == 5 and selection["tokens"] == 10
    stats = UpdateStats()
    stats.add_selection(selection)
    stats.add(torch.tensor(0.0), _loss_stats(), True)
    stats.end_iteration()
    out = stats.result()
    assert out["top_entropy/threshold"] == pytest.approx(0.45) and out["top_entropy/kept_fraction"] == 0.5
    assert "correction/weight_mean" not in out  # no sampler correction: no such metric


def test_the_sequence_weight_mean_is_over_every_sequence_of_every_optimizer_step():
    """objective vespo's sequence_weight_mean: the weights' sum over the sequences of every micro-batch and
    iteration, over their count (1.5 + 0.5 + 0.2 over 2 + 2 + 1 sequences = 0.44); absent for the other objectives."""
    from glm_grpo_ds.observability.update_stats import UpdateStats

    stats = UpdateStats()
    for weight_sum, sequences, end in ((1.5, 2.0, False), (0.5, 2.0, True), (0.2, 1.0, True)):
        loss_stats = {**_loss_stats(), "sequence_weight_sum": torch.tensor(weight_sum)}
        stats.add(torch.tensor(0.0), {**loss_stats, "sequences": torch.tensor(sequences)}, True)
        if end:
            stats.end_iteration()
    assert stats.result()["sequence_weight_mean"] == pytest.approx(2.2 / 5)
    plain_stats = UpdateStats()
    plain_stats.add(torch.tensor(0.0), _loss_stats(), True)
    plain_stats.end_iteration()
    assert "sequence_weight_mean" not in plain_stats.result()


def _loss_stats():
    one = torch.tensor(1.0)
    return {**dict.fromkeys(("clip_frac_low", "clip_frac_high", "kl", "entropy"), torch.tensor(0.0)),
            "ratio_mean": one, "ratio_min": one, "ratio_max": one, "num_tokens": torch.tensor(10.0)}  # fmt: skip


def test_correction_sums_by_hand_and_the_metrics_they_give():
    """corrections.correction_sums: the raw weights exp(old - sampler) of the masked tokens (e^1, 1, e^-2; the
    masked-out one ignored), their min / max / mean and the share outside [min, max] = [0.5, 2]: clipped by a
    truncate mode, zeroed by a mask mode."""
    import math

    from glm_grpo_ds.corrections import correction_sums
    from glm_grpo_ds.observability.update_stats import UpdateStats

    old = torch.tensor([[1.0, 0.0, -2.0, 5.0]])
    sampler = torch.zeros(1, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert correction_sums(old, sampler, mask, "none") is None
    sums = correction_sums(old, sampler, mask, "token_truncate", 2.0, 0.5)
    w = [math.e, 1.0, math.exp(-2)]
    assert sums["units"] == 3 and sums["outside"] == 2 and sums["sum"].item() == pytest.approx(sum(w))
    assert (sums["min"].item(), sums["max"].item()) == pytest.approx((math.exp(-2), math.e))
    seq = correction_sums(old, sampler, mask, "sequence_mask", 2.0, 0.5)  # one sequence: exp(1 + 0 - 2)
    assert seq["units"] == 1 and seq["sum"].item() == pytest.approx(math.exp(-1)) and seq["outside"] == 1
    stats = UpdateStats()
    stats.add_correction(sums)
    stats.add(torch.tensor(0.0), _loss_stats(), True)
    stats.end_iteration()
    out = stats.result()
    assert out["correction/weight_mean"] == pytest.approx(sum(w) / 3)
    assert out["correction/weight_min"] == pytest.approx(math.exp(-2)) and out[
        "correction/weight_max"
    ] == pytest.approx(math.e)
    assert out["correction/outside_fraction"] == pytest.approx(2 / 3)


def test_a_top_entropy_quantile_that_keeps_under_a_token_a_sequence_is_refused():
    from glm_grpo_ds.config import ConfigError, load_config

    config = "launch/configs/tiny_cpu.yaml"
    with pytest.raises(ConfigError, match=r"grpo.top_entropy_quantile=0.0 keeps 0 of the 4 target-grid tokens"):
        load_config(config, ["rollout.height=64", "rollout.width=64", "grpo.top_entropy_quantile=0"])
    load_config(config, ["rollout.height=64", "rollout.width=64", "grpo.top_entropy_quantile=0.25"])  # one token
    load_config(config, ["rollout.height=1024", "rollout.width=1024", "grpo.top_entropy_quantile=0.001"])


def test_the_startup_summary_echoes_the_grpo_options_that_are_not_the_defaults():
    from glm_grpo_ds.config import GRPOConfig
    from glm_grpo_ds.observability.summary import grpo_options_line

    assert grpo_options_line(GRPOConfig()) is None
    changed = GRPOConfig(aggregation="seq_mean", sampler_correction="token_truncate", group_size=4)
    assert grpo_options_line(changed) == (
        'grpo options (not the defaults): aggregation="seq_mean", sampler_correction="token_truncate"'
    )


def test_the_startup_summary_says_how_many_optimizer_steps_a_rollout_makes():
    """batch.mini_batches is not a grpo key: the summary's batch line says it, with the iterations."""
    from glm_grpo_ds.config import load_config
    from glm_grpo_ds.observability.summary import _updates_note

    base = ["model.path=/m", "data.train_file=/d.jsonl", "rewards=[{name: pixel_mse}]", "batch.prompts_per_rank=2"]
    assert _updates_note(load_config(None, base)) == ""
    cfg = load_config(None, [*base, "batch.mini_batches=2", "grpo.num_iterations=3"])
    assert _updates_note(cfg) == ", 6 optimizer steps per rollout (2 mini-batches x 3 iterations)"


@pytest.mark.parametrize("order", [(1.0, math.nan), (math.nan, 1.0)])
def test_a_nan_extreme_is_nan_whichever_micro_batch_it_comes_in(order):
    """Python's min/max keep whichever comes first of a NaN and a number: a NaN ratio in the second micro-batch
    read as ratio_min = ratio_max = 1.0 (check-run's "ratio 1" passed on it), in the first as NaN. Now NaN either
    way, for the ratio extremes, the sampler-vs-trainer maximum and the correction weights' extremes."""
    from glm_grpo_ds.observability.update_stats import UpdateStats

    stats = UpdateStats()
    for value in order:
        v = torch.tensor(value)
        stats.add_mismatch({"abs": torch.tensor(1.0), "max": v, "k3": torch.tensor(0.0), "beyond": torch.tensor(0.0),
                            "tokens": torch.tensor(10.0)})  # fmt: skip
        stats.add_correction({"sum": torch.tensor(1.0), "outside": torch.tensor(0.0), "units": torch.tensor(1.0),
                              "min": v, "max": v})  # fmt: skip
        stats.add(torch.tensor(0.0), {**_loss_stats(), "ratio_min": v, "ratio_max": v}, True)
    stats.end_iteration()
    out = stats.result()
    for key in ("ratio_min", "ratio_max", "mismatch/logp_abs_max", "correction/weight_min", "correction/weight_max"):
        assert math.isnan(out[key]), (key, out[key])
    assert math.isnan(out["iterations"][0]["ratio_min"])
