"""Rollout on the tiny GLM-Image: exact grids, and sampler log-probs == teacher-forced log-probs.

The negative controls re-introduce the bugs public trainers have (text positions for image
tokens, temperature applied in one path only) and check that the parity test would catch them.
"""

import dataclasses

import pytest
import torch
from in_process import glm_grpo  # noqa: E402  (tests/in_process.py)

from glm_grpo_ds.config import SamplingConfig
from glm_grpo_ds.logprobs import completion_logprobs
from glm_grpo_ds.model.policy import load_ar
from glm_grpo_ds.model.prompt_layout import build_prompt_inputs
from glm_grpo_ds.rollout import decode_position_ids, grid_spec_from_inputs, rollout
from glm_grpo_ds.testing.tiny import CODEBOOK_SIZE

PROMPTS = ["a red cube", "a lighthouse on a cliff at sunset with a sign that says 'KEEP OUT'"]


@pytest.fixture(scope="module")
def ar(tiny_model_dir):
    return load_ar(tiny_model_dir, dtype="fp32")


@pytest.fixture(scope="module")
def batch(ar, processor):
    return rollout(ar, processor, PROMPTS, 3, 64, 96, SamplingConfig(), torch.Generator().manual_seed(0))


def test_fp32_parity_left_padding_g3_64x96(ar, batch):
    assert batch.prompt_mask[0, 0] == 0, "prompts of different lengths must be left padded"
    with torch.no_grad():
        recomputed = completion_logprobs(ar, batch, SamplingConfig())
    diff = (recomputed - batch.sampler_logps).abs()
    print(f"fp32 parity: max_abs_diff={diff.max().item():.3e} mean_abs_diff={diff.mean().item():.3e}")
    assert diff.max().item() <= 1e-5


def test_bf16_parity_is_reported_and_bounded(tiny_model_dir, processor):
    ar16 = load_ar(tiny_model_dir, dtype="bf16")
    b = rollout(ar16, processor, PROMPTS, 3, 64, 96, SamplingConfig(), torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (completion_logprobs(ar16, b, SamplingConfig()) - b.sampler_logps).abs()
    print(f"bf16 parity: max_abs_diff={diff.max().item():.3e} mean_abs_diff={diff.mean().item():.3e}")
    assert diff.max().item() <= 5e-2


def test_negative_control_text_positions_break_parity(ar, batch):
    # What a plain forward over prompt + generated ids would use: text positions everywhere.
    seq = batch.position_ids.shape[-1]
    valid = batch.attention_mask
    text_pos = (valid.cumsum(1) - 1).clamp(min=0)
    text_pos = text_pos.unsqueeze(0).expand(3, -1, -1).contiguous()
    assert text_pos.shape[-1] == seq
    wrong = dataclasses.replace(batch, position_ids=text_pos)
    with torch.no_grad():
        diff = (completion_logprobs(ar, wrong, SamplingConfig()) - batch.sampler_logps).abs()
    assert diff.max().item() > 1e-3


def test_negative_control_temperature_in_one_path_breaks_parity(ar, processor):
    hot = SamplingConfig(temperature=0.7)
    b = rollout(ar, processor, PROMPTS, 2, 64, 64, hot, torch.Generator().manual_seed(1))
    with torch.no_grad():
        same = (completion_logprobs(ar, b, hot) - b.sampler_logps).abs().max().item()
        dropped = (completion_logprobs(ar, b, SamplingConfig()) - b.sampler_logps).abs().max().item()
    assert same <= 1e-5 and dropped > 1e-3


def test_top_k_top_p_parity(ar, processor):
    s = SamplingConfig(temperature=0.9, top_k=40, top_p=0.8)
    b = rollout(ar, processor, PROMPTS, 2, 64, 64, s, torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (completion_logprobs(ar, b, s) - b.sampler_logps).abs().max().item() <= 1e-5


def test_top_k_1_is_greedy_and_records_the_policy_logprob(ar, processor):
    b = rollout(ar, processor, PROMPTS[:1], 2, 64, 64, SamplingConfig(top_k=1), torch.Generator().manual_seed(3))
    assert torch.equal(b.completion_ids[0], b.completion_ids[1])
    with torch.no_grad():  # the draw is the argmax; the record is its log-prob under the (uncut) policy
        full = completion_logprobs(ar, b, SamplingConfig(top_k=0))
    assert torch.allclose(b.sampler_logps, full, atol=1e-5) and b.sampler_logps.max().item() < 0


@pytest.fixture(scope="module")
def ar_bf16(tiny_model_dir):
    return load_ar(tiny_model_dir, dtype="bf16")


# Cuts that bite on the 16-id tiny codebook. Measured before the fix (ratio under the re-truncated
# distribution): 3, 11 and 4 of 6 072 sampled tokens fell outside the support recomputed in
# training (log-prob -inf, NaN step).
BF16_SETTINGS = [SamplingConfig(1.0, 3, 1.0), SamplingConfig(1.0, 0, 0.5), SamplingConfig(0.7, 8, 0.9)]


@pytest.mark.parametrize("sampling", BF16_SETTINGS, ids=["top_k3", "top_p0.5", "t0.7_k8_p0.9"])
def test_bf16_top_k_top_p_every_sampled_token_has_a_finite_training_logprob(ar_bf16, processor, sampling):
    prompts = PROMPTS * 4  # 8 prompts x G=3 x 253 tokens = 6 072 sampled tokens
    b = rollout(ar_bf16, processor, prompts, 3, 64, 96, sampling, torch.Generator().manual_seed(11))
    with torch.no_grad():
        trained = completion_logprobs(ar_bf16, b, sampling)
    assert b.completion_ids.numel() == 6072
    assert torch.isfinite(trained).all() and torch.isfinite(b.sampler_logps).all()
    # same distribution, bf16 numerics only (KV-cached vs full-sequence logits): 5e-2 is verify-logprobs' bf16 tolerance
    assert (trained - b.sampler_logps).abs().max().item() <= 5e-2
    ratio = torch.exp(trained - trained.detach())  # first iteration: old log-probs are these log-probs
    assert torch.equal(ratio, torch.ones_like(ratio))


def test_draws_stay_inside_the_top_k_top_p_support():
    from glm_grpo_ds.sampling import policy_logits, sample, truncate

    logits = torch.randn(4000, 24, generator=torch.Generator().manual_seed(0))
    policy = policy_logits(logits, 16, temperature=0.8)
    cut = truncate(policy, top_k=5, top_p=0.6)
    ids, logp = sample(policy, 5, 0.6, torch.Generator().manual_seed(1))
    assert torch.isfinite(cut.gather(1, ids[:, None])).all()  # every draw is inside the cut
    assert torch.equal(
        logp, torch.log_softmax(policy, -1).gather(1, ids[:, None]).squeeze(1)
    )  # recorded: policy log-prob
    kept = torch.isfinite(cut).sum(1)
    assert kept.max() <= 5 and kept.min() >= 1 and (ids < 16).all()


def test_exact_grid_lengths_codebook_range_and_prior_layout(batch):
    from diffusers import GlmImagePipeline

    # 64x96: preview 13x19 = 247, target 2x3 = 6; no end token is sampled
    assert batch.grid.large == (2, 3) and batch.grid.preview == (13, 19)
    assert batch.completion_ids.shape == (6, 247 + 6) and batch.sampler_logps.shape == (6, 253)
    assert batch.completion_ids.min() >= 0 and batch.completion_ids.max() < CODEBOOK_SIZE
    assert torch.isfinite(batch.sampler_logps).all() and (batch.sampler_logps <= 0).all()
    assert batch.prior_token_ids.shape == (6, 4 * 6)
    for row in range(len(batch)):
        expected = GlmImagePipeline._upsample_token_ids(batch.image_tokens[row], 2, 3)
        assert torch.equal(batch.prior_token_ids[row : row + 1], expected)
    assert batch.prompt_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert batch.prompts == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3
    assert batch.sequence_completion_mask.sum().item() == 6 * 253


def test_decode_positions_mirror_transformers_cache(ar, processor):
    inputs = build_prompt_inputs(processor, PROMPTS, 64, 96)
    positions, _ = ar.model.get_rope_index(
        inputs["input_ids"],
        image_grid_thw=inputs["image_grid_thw"],
        images_per_sample=inputs["images_per_sample"],
        attention_mask=inputs["attention_mask"],
    )
    ours = decode_position_ids(positions, inputs["attention_mask"], grid_spec_from_inputs(inputs))
    theirs = ar.model._cached_decode_position_ids.permute(1, 0, 2)  # [3, B, n + 1 end marker]
    assert torch.equal(ours, theirs[:, :, : ours.shape[-1]])


def test_select_keeps_rows_consistent(batch):
    part = batch.select(torch.tensor([1, 4]))
    assert torch.equal(part.completion_ids, batch.completion_ids[[1, 4]])
    assert torch.equal(part.position_ids, batch.position_ids[:, [1, 4]])
    assert part.prompts == [batch.prompts[1], batch.prompts[4]] and part.grid == batch.grid


def test_chunked_logprobs_and_gradients_match_unchunked(ar, batch):
    small = batch.select(slice(0, 4))
    params = [p for p in ar.parameters() if p.requires_grad]

    def grads(chunk):
        ar.zero_grad(set_to_none=True)
        lp = completion_logprobs(ar, small, SamplingConfig(), chunk_size=chunk)
        (lp * torch.linspace(-1, 1, lp.shape[1])).sum().backward()
        return lp.detach(), [p.grad.clone() for p in params if p.grad is not None]

    lp_a, g_a = grads(50)  # 253 tokens -> 6 checkpointed chunks
    lp_b, g_b = grads(10_000)
    torch.testing.assert_close(lp_a, lp_b, rtol=0, atol=1e-6)
    assert len(g_a) == len(g_b) > 0
    for a, b in zip(g_a, g_b):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    ar.zero_grad(set_to_none=True)


@pytest.mark.slow
def test_cli_verify_logprobs(tiny_model_dir, capfd):
    cmd = ["verify-logprobs", "--model", tiny_model_dir]
    code, out, err = glm_grpo(cmd, capfd)
    assert code == 0, err
    line = next(text for text in out.splitlines() if text.startswith("max_abs_diff="))
    fields = dict(kv.split("=") for kv in line.split()[:3])
    assert line.endswith(" (fp32, attn=sdpa)")  # the dtype its tolerance is for, on stdout (glm-grpo check-run)
    assert float(fields["max_abs_diff"]) <= 1e-5 and float(fields["mean_abs_diff"]) <= float(fields["max_abs_diff"])
    code, _, err = glm_grpo(cmd + ["--dtype", "bf16", "--tolerance", "1e-9"], capfd)
    assert code == 1 and "FAIL" in err
    code, _, err = glm_grpo(cmd + ["--height", "50"], capfd)
    assert code == 2 and "multiples of 32" in err
