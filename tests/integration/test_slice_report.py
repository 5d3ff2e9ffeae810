"""benchmarks/slice_report.py on the tiny GLM-Image: the FLOP counts equal hand-computed values for its decoder
layer's shapes, the checkpoint recompute equals the forward, the extrapolation arithmetic, the bf16 log-prob
mismatch is finite and small, and the rollout-vs-pipeline comparison runs.

The hand values: a linear layer on T tokens costs 2·T·(its weight's elements) (bias adds are not counted);
attention 4·heads·head_dim·(queries)·(keys) (torch counts the full square, causal or not); a LoRA adapter
of rank r on a linear in -> out adds 2·T·r·(in + out).
"""

import math

import pytest
import torch
from benchmark_scripts import load_benchmark  # noqa: E402  (tests/benchmark_scripts.py)

from glm_grpo_ds.rollout.decode_loop import cache_slots

sr = load_benchmark("slice_report")
SIZE = 64  # 2x2 target grid + the 16x16 preview grid


@pytest.fixture(scope="module")
def measured(tiny_model_dir):
    """ar, update and decoder FLOPs plus the log-prob and speed parts on the tiny model, once."""
    rcfg = sr.ReportConfig(size=SIZE, group_size=2, repeats=1)
    return sr.measure_slice(str(tiny_model_dir), rcfg, sr.PARTS)


def _layer_shapes(m):
    return m["ar_layer_linear_params"], m["ar_attention_width"]


@pytest.mark.slow
def test_ar_flops_equal_the_hand_computed_layer(measured):
    w, d = _layer_shapes(measured)
    a = measured["ar"]
    plen, n = a["prompt_tokens"], a["generated_tokens"]
    # tiny layer: q 64x64, k/v 64x32, o 64x64, gate_up 64x256, down 128x64
    assert w == 64 * 64 + 2 * 64 * 32 + 64 * 64 + 64 * 256 + 128 * 64 == 36864
    # the rollout's static KV cache (glm_grpo_ds/rollout/decode_loop.py): every query attends over all its
    # slots, the sequence rounded up to the 128-slot bucket, the slots not yet written masked
    slots = cache_slots(plen, n)
    assert a["prefill_per_token_layer0"] == 2 * w + 4 * d * slots  # plen queries x all slots, per token
    assert a["decode_step_first_layer0"] == 2 * w + 4 * d * slots  # one query, all slots
    assert a["decode_step_mean_layer0"] == 2 * w + 4 * d * slots
    assert a["lm_head_per_token"] == 2 * measured["ar_hidden"] * 24  # the tiny lm_head: 24 vision ids
    assert n == 16 * 16 + 2 * 2  # the 16x16 preview + the 2x2 target grid (64 / 32)


@pytest.mark.slow
def test_update_flops_equal_the_hand_computed_layer_with_lora(measured, tiny_model_dir):
    from glm_grpo_ds.config import load_config

    w, d = _layer_shapes(measured)
    u = measured["update"]
    t = u["sequence_tokens"]
    base = 2 * t * w + 4 * d * t * t
    assert u["reference_forward_layer0"] == base  # adapters off
    lora = load_config(sr.ReportConfig().config, [f"model.path={tiny_model_dir}"]).lora
    in_plus_out = (64 + 64) + 2 * (64 + 32) + (64 + 64) + (64 + 256) + (128 + 64)  # the 6 targets of the layer
    assert sorted(lora.target_modules) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"])
    assert u["policy_forward_layer0"] == base + 2 * t * lora.r * in_plus_out
    assert u["gradient_checkpointing"] and u["recompute_layer0"] == u["policy_forward_layer0"]
    assert u["total"] == u["reference_forward"] + u["policy_forward"] + u["backward_with_recompute"]
    assert u["backward_with_recompute"] > 2 * u["policy_forward"]  # recompute + input and LoRA gradients


@pytest.mark.slow
def test_decoder_flops_split(measured):
    dec = measured["decoder"]
    assert dec["dit_forwards_per_step"] == 2  # guidance 1.5 of the config: conditional + unconditional
    assert dec["dit_step"] == 2 * dec["dit_forward"]
    assert dec["latent_patches"] == (SIZE // 8 // 2) ** 2
    assert dec["total"] == dec["dit_step"] + dec["glyph_encoder"] + dec["vae_decode"]  # nothing else counted
    assert dec["vae_decode"] > 0 and dec["dit_forward_block0"] > 0


@pytest.mark.slow
def test_bf16_logprob_mismatch_is_finite_and_small(measured):
    lp = measured["logprobs"]
    assert lp["nonfinite"] == 0 and lp["rows"] == 2 and lp["positions_per_row"] == 260
    assert math.isfinite(lp["max_abs_dlogp"]) and lp["max_abs_dlogp"] < 5e-2  # verify-logprobs' bf16 tolerance
    assert 0 <= lp["k3_kl"] < 1e-3 and lp["mean_abs_dlogp"] <= lp["max_abs_dlogp"]


@pytest.mark.slow
def test_rollout_speed_runs(measured):
    sp = measured["speed"]
    assert sp["rollout_ours_tokens_per_s"] > 0 and sp["rollout_pipeline_tokens_per_s"] > 0
    assert sp["ours_over_pipeline"] == sp["rollout_ours_tokens_per_s"] / sp["rollout_pipeline_tokens_per_s"]


def test_logprob_stats_hand_values():
    s = sr.logprob_stats(torch.tensor([[0.0, -1.0]]), torch.tensor([[0.1, -1.0]]))
    assert s["max_abs_dlogp"] == pytest.approx(0.1) and s["mean_abs_dlogp"] == pytest.approx(0.05)
    assert s["k3_kl"] == pytest.approx((math.exp(0.1) - 1.1) / 2)
    assert s["nonfinite"] == 0


def test_extrapolation_by_slope_and_by_module():
    def slice_(layers, decode, layer0):
        return {
            "ar_layers": layers,
            "ar_language_model_params": 100 + 10 * layers,
            "ar_layer_params": 10,
            "ar_attention_width": 8,
            "ar": {
                "prompt_tokens": 4,
                "generated_tokens": 2,
                "prefill_per_token": decode,
                "prefill_per_token_layer0": layer0,
                "decode_step_first": decode,
                "decode_step_first_layer0": layer0,
                "decode_step_mean": decode,
                "decode_step_mean_layer0": layer0,
            },
        }

    rows = {r["key"]: r for r in sr.analyse(slice_(1, 10, 2), slice_(2, 13, 3))}
    mean = rows["ar.decode_step_mean"]
    assert mean["per_layer_slope"] == 3 and mean["per_layer_module"] == 2
    assert mean["full"] == 10 + 39 * 3  # the slope wins when there is one
    # doc: 2 x (language model + lm_head of 40 layers) + 4 x 40 layers x mean context (4 + 2/2) x width 8
    assert mean["doc"] == 2 * (110 + 39 * 10) + 4 * 40 * 5 * 8
    assert mean["full_over_doc"] == mean["full"] / mean["doc"]
    only = {r["key"]: r for r in sr.analyse(slice_(1, 10, 2), None)}
    assert only["ar.decode_step_mean"]["full"] == 10 + 39 * 2  # layer 0's own count without a slope slice
