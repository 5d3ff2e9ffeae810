"""The exact sampler at fewer kernels (issue #51): LoRA unmerged through the fused low-rank path
(glm_grpo_ds/rollout/fused_lora.py, rollout.fuse_lora), proven on the CPU with the tiny GLM-Image and real peft:

* fp32: the fused rollout's tokens are peft's eager loop's, its log-probs within fp32 rounding (0 to 4.8e-7
  measured), eager and through the whole-step compile (the CPU's fast path); no weight written, peft's wrappers
  back after the block; in training (ZeRO-3, 2 ranks, the adapters read inside the rollout's gather):
  tests/integration/test_trainer_deepspeed.py;
* bf16: its drift from peft's loop within a bound 5x under the merge's (documented in docs/memory-and-speed.md);
* what a decode step launches: exactly 8 GEMMs and 6 adds per layer over the merged step (peft's loop: 24);
* refusals: LoRA variants (DoRA) and a partitioned adapter, in one line.
"""

import pytest
import torch
from peft.tuners.lora import Linear as LoraLinear

from glm_grpo_ds.config import SamplingConfig
from glm_grpo_ds.model.policy import load_policy
from glm_grpo_ds.profiling import decode_counts as dc
from glm_grpo_ds.rollout import rollout
from glm_grpo_ds.rollout.decode_loop import LoopOptions
from glm_grpo_ds.rollout.fused_lora import FusedLoraLinear, lora_fused
from glm_grpo_ds.rollout.merged_lora import BaseCopy, lora_merged
from glm_grpo_ds.testing.tiny import lora_policy

PROMPTS = ["a red cube", "a lighthouse on a cliff at sunset with a sign that says 'KEEP OUT'"]
SAMPLING = SamplingConfig(temperature=0.9, top_k=12, top_p=0.9)
G = 2
FP32_TOLERANCE = 1e-5  # |dlogp| fused vs peft in fp32: GEMM blocking only (4.8e-7 measured)
BF16_FUSED_BOUND = 0.01  # fused vs peft in bf16, before a row's first differing token (3.7e-3 measured)


BLOCKS = ("peft", "fused", "merged")


def sample(policy, processor, how="peft", options=LoopOptions(), prompts=PROMPTS, group_size=G):
    blocks = {
        "peft": torch.no_grad,
        "fused": lambda: lora_fused(policy),
        "merged": lambda: lora_merged(policy, BaseCopy()),
    }
    with torch.no_grad(), blocks[how]():
        gen = torch.Generator().manual_seed(0)
        return rollout(policy, processor, prompts, group_size, 64, 64, SAMPLING, gen, loop=options)


def same_prefix_gap(a, b) -> tuple[torch.Tensor, float]:
    """Rows' agreement up to their first differing token and the largest |dlogp| there."""
    same = (a.completion_ids == b.completion_ids).long().cumprod(1).bool()
    return same, float((a.sampler_logps - b.sampler_logps).abs()[same].max())


def test_fused_sampling_is_peft_in_fp32_eager_and_compiled_and_writes_nothing(policy, processor):
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    peft = sample(policy, processor)
    fused = sample(policy, processor, "fused")
    # the CPU's fast exact sampler (whole-step compile: its cost is the compile, so one prompt, 2 rows)
    peft_one = sample(policy, processor, prompts=PROMPTS[1:], group_size=2)
    compiled = sample(policy, processor, "fused", LoopOptions(compile=True), PROMPTS[1:], 2)
    for got, want in ((fused, peft), (compiled, peft_one)):
        assert torch.equal(got.completion_ids, want.completion_ids)
        assert (got.sampler_logps - want.sampler_logps).abs().max() <= FP32_TOLERANCE
    assert all(torch.equal(before[n], p) for n, p in policy.named_parameters())  # base and adapters untouched
    wrappers = [m for m in policy.modules() if isinstance(m, LoraLinear)]
    assert len(wrappers) == 12 and not any(isinstance(m, FusedLoraLinear) for m in policy.modules())
    # (the control, that these adapters move the log-probs by > 1e-3 on these prompts, so a path that dropped
    # their delta would fail here: tests/integration/test_fast_rollout.py, the same policy and prompts)


def test_fused_sampling_in_bf16_drifts_less_than_merging(tiny_model_dir, processor):
    bf16 = lora_policy(tiny_model_dir, torch.bfloat16).eval()
    # one prompt, 2 rows: bf16 matmuls are slow on CPUs without bf16 instructions
    peft, fused, merged = (sample(bf16, processor, how, prompts=PROMPTS[1:], group_size=2) for how in BLOCKS)
    same, fused_gap = same_prefix_gap(fused, peft)
    _, merged_gap = same_prefix_gap(merged, peft)
    assert same[:, 0].all() and fused_gap <= BF16_FUSED_BOUND
    assert fused_gap < merged_gap  # the reason to fuse rather than merge: the adapter's delta is not rounded away


def test_a_fused_decode_step_launches_8_gemms_and_6_adds_per_layer_over_the_merged_step():
    """Counted as `glm-grpo profile bench` counts them (deterministic): per decoder layer, peft's loop adds 24 kernels
    to the merged step (fp32: 12 GEMMs, 6 scales, 6 adds); the fused path 14: q/k/v share one shrink and one
    block-diagonal expand, o / gate_up / down shrink and expand alone, and each adapted projection adds its delta
    in place."""
    r = dc.decode_counts((2, 4), ("eager", "merged", "fused"), group_size=2, size=64, steps=0, threads=1, rounds=1)
    fused, merged, eager = (r["variants"][n] for n in ("fused", "merged", "eager"))
    layers = 4 - 2
    extra = {op: (fused["ops"].get(op, 0) - merged["ops"].get(op, 0)) for op in set(fused["ops"]) | set(merged["ops"])}
    assert {op: n for op, n in extra.items() if n} == {"aten.mm.default": 8 * 2, "aten.add_.Tensor": 6 * 2}  # 2 layers
    per_layer = {n: (v["kernels"]["4"] - v["kernels"]["2"]) / layers for n, v in r["variants"].items()}
    assert per_layer["fused"] - per_layer["merged"] == 14 and per_layer["eager"] - per_layer["merged"] == 24
    assert fused["host_syncs"]["4"] == 0


def test_fused_sampling_refuses_lora_variants_and_partitioned_adapters(tiny_model_dir):
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    plain = load_policy(tiny_model_dir, torch.float32, "sdpa", None, False)
    dora = get_peft_model(plain, PeftLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], use_dora=True))
    with pytest.raises(ValueError, match=r"is a LoRA variant \(DoraLinearVariant\).*set rollout.fuse_lora: false"):
        with lora_fused(dora):
            pass
    assert not any(isinstance(m, FusedLoraLinear) for m in dora.modules())  # nothing swapped out stays swapped
    model = lora_policy(tiny_model_dir)
    module = next(m for m in model.modules() if isinstance(m, LoraLinear))
    module.lora_A["default"].weight.data = torch.empty(0)  # what ZeRO-3 leaves outside a gather
    with pytest.raises(RuntimeError, match="partitioned .*gather_parameters: true"):
        with lora_fused(model):
            pass
    assert not any(isinstance(m, FusedLoraLinear) for m in model.modules())
