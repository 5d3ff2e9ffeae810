"""grpo_update feeds the loss options into the loss: the gradients of one real update (DeepSpeed ZeRO-2, 1 rank, the
tiny LoRA policy) equal those of the loss written out by hand in the test's own terms (tests/integration/
loss_by_hand.py) with the options on. The unit tests (tests/unit/test_grpo_*) prove each helper's maths; only this
checks by its effect that grpo_update passes the token weights, the sampler correction's weights, the entropy
bonus with its per-micro-batch share, the preview mask, the sampler's log-probs (the off-policy sequence mask) and
the run's loss settings to policy_loss."""

import pytest
import torch
from launching import common, worker  # noqa: E402  (tests/integration/launching.py)

pytestmark = [pytest.mark.slow]  # one DeepSpeed rank: two engines, two rollouts and updates

# One update (ratio 1, no KL), token_mean, one row per micro-batch: the entropy bonus's share (the micro-batch's
# tokens / the rollout's) and the top-entropy threshold (over each micro-batch's tokens) both depend on the split.
BASE = [
    "rollout.height=64",
    "rollout.width=64",
    "grpo.group_size=4",
    "batch.prompts_per_rank=1",
    "batch.micro_batch_size=1",
    "grpo.beta=0",
    "grpo.num_iterations=1",
    "grpo.aggregation=token_mean",
    "optimizer.name=adamw",
]
OPTION_SETS = {
    # the top-entropy selection and the preview's weight (token weights), the truncated correction, the bonus
    "weighted": "grpo.top_entropy_quantile=0.5 grpo.preview_weight=0.5 grpo.sampler_correction=token_truncate "
    "grpo.sampler_correction_max=3 grpo.entropy_coef=0.1",
    # the preview grid out of the loss: out of the policy term, the bonus, the threshold's pool and the token count
    "no_preview": "grpo.preview_in_loss=false grpo.top_entropy_quantile=0.8 grpo.sampler_correction=token_truncate "
    "grpo.sampler_correction_max=3 grpo.entropy_coef=0.1",
    # off-policy sequence masking on the sampler's log-probs (shifted: a mean of ~+0.006 a row, above the bound 0):
    # the rows with a negative advantage leave the policy term
    "off_policy": "grpo.off_policy_mask_threshold=0 grpo.sampler_correction=token_truncate "
    "grpo.sampler_correction_max=3",
}
TOLERANCE = 1e-5


def _flat(grads: dict, names: list[str]) -> torch.Tensor:
    return torch.cat([grads[n].flatten().double() for n in names])


def _rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).norm().item() / max(a.norm().item(), b.norm().item(), 1e-30)


def test_update_gradients_equal_the_loss_written_out_by_hand_with_the_options_on(tiny_model_dir, tiny_data, tmp_path):
    """For each option set, the gradients grpo_update produces (read at the accumulation boundary) equal, to 1e-5
    relative for every trained parameter, those of the hand-written loss at the same weights; the sampler log-probs
    are shifted by 1.5 sin(position) so that pi_old / pi_sampler exceeds the cap of 3 on some tokens (the truncation
    acts). Control: the same hand-written loss with every option off differs from the update's gradients by far more
    than the tolerance, so the comparison sees the options. A grpo_update that dropped the token or correction
    weights, the preview mask, the bonus's share or the run's loss settings fails the first assert."""
    overrides = common(tiny_model_dir, tiny_data, tmp_path / "run", *BASE)
    sets = ";".join(OPTION_SETS.values())
    r = worker(1, "options", tmp_path / "w", "zero2.json", overrides, extra=["--option-sets", sets])
    for i, name in enumerate(OPTION_SETS):
        got = r[i]
        assert got["truncated"] > 0, f"{name}: no pi_old / pi_sampler above the cap, the truncation is not tested"
        if name == "off_policy":  # some rows dropped, not all: the mask acts and the comparison sees which
            assert 0 < got["masked"] < 1, got["masked"]
        trained = [n for n, g in got["update"].items() if g is not None and g.abs().sum() > 0]
        assert trained and all(got["hand"][n] is not None for n in trained), name
        off = [n for n, g in got["update"].items() if n not in trained]
        assert all(got["hand"][n] is None or got["hand"][n].abs().sum() == 0 for n in off), name
        for n in trained:
            diff = _rel_diff(got["update"][n], got["hand"][n])
            assert diff <= TOLERANCE, f"{name}: {n} differs from the hand-written loss's gradient by {diff:.2e}"
        control = _rel_diff(_flat(got["update"], trained), _flat(got["hand_off"], trained))
        assert control > 1000 * TOLERANCE, f"{name}: the options change the gradient by {control:.2e} only"
