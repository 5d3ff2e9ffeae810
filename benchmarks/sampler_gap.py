"""Each rollout sampler's log-probs against the trainer's, in bf16, on the tiny GLM-Image (issue #51).

    python benchmarks/sampler_gap.py                     # builds the tiny model in outputs/tiny_gap if missing
    python benchmarks/sampler_gap.py --model DIR --dtype fp32 --seed 1

For each sampler (peft's wrappers, rollout.fuse_lora, rollout.merge_lora, each eager or with the whole decode
step compiled) it samples 2 prompts x 4 rows at 64² from the same noise, recomputes the drawn tokens' log-probs
the way the trainer does (teacher-forced, peft, eager: glm_grpo_ds/logprobs.py) and prints the mean and max
|dlogp| and the k3 estimate of KL(sampler, trainer): what the ``mismatch/*`` metrics of a run report. The policy
is the rollout tests' (glm_grpo_ds.testing.tiny.lora_policy: r=4, lora_B from N(0, 0.05), so the adapter moves
the logits).
The table in docs/memory-and-speed.md#the-exact-fast-sampler-rolloutfuse_lora comes from this script.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

import torch

PROMPTS = ["a red cube", "a lighthouse on a cliff at sunset with a sign that says 'KEEP OUT'"]
SAMPLERS = ("peft", "fused", "merged", "peft+compile", "fused+compile")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="outputs/tiny_gap", help="a tiny pipeline directory (built here if missing)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--seed", type=int, default=0, help="the sampling noise's seed")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from glm_grpo_ds.config import SamplingConfig
    from glm_grpo_ds.logprobs import completion_logprobs
    from glm_grpo_ds.model.glm_image import load_processor
    from glm_grpo_ds.rollout import rollout
    from glm_grpo_ds.rollout.decode_loop import LoopOptions
    from glm_grpo_ds.rollout.fused_lora import lora_fused
    from glm_grpo_ds.rollout.merged_lora import BaseCopy, lora_merged
    from glm_grpo_ds.testing.tiny import build_tiny_pipeline, lora_policy

    model = Path(a.model)
    if not (model / "model_index.json").is_file():
        build_tiny_pipeline(model, seed=0)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    policy = lora_policy(model, dtype).eval()  # the rollout tests' policy
    processor = load_processor(model)
    sampling = SamplingConfig(temperature=1.0)
    blocks = {"peft": contextlib.nullcontext, "fused": lambda: lora_fused(policy)}
    blocks["merged"] = lambda: lora_merged(policy, BaseCopy())
    print(f"tiny GLM-Image, {a.dtype}, 2 prompts x 4 rows at 64², seed {a.seed}: sampler vs trainer log-probs")
    print(f"{'sampler':<16}{'mean |dlogp|':>14}{'max |dlogp|':>13}{'k3 KL':>10}")
    for sampler in SAMPLERS:
        how, _, compiled = sampler.partition("+")
        with torch.no_grad():
            with blocks[how]():
                batch = rollout(
                    policy,
                    processor,
                    PROMPTS,
                    4,
                    64,
                    64,
                    sampling,
                    torch.Generator().manual_seed(a.seed),
                    loop=LoopOptions(compile=bool(compiled)),
                )
            trainer = completion_logprobs(policy, batch, sampling)
        d = batch.sampler_logps - trainer
        k3 = (d.exp() - d - 1).mean()
        print(f"{sampler:<16}{d.abs().mean():>14.2e}{d.abs().max():>13.2e}{k3:>10.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
