"""The vqa judge's scoring forward on the CPU at Qwen2.5-VL-7B-Instruct's real widths (random weights, fp32, one
language layer and one vision block: no_grad frees each layer before the next, so depth adds nothing without a KV
cache): its peak memory against the memory plan's figure (glm_grpo_ds/memory/reward_models.py ``vlm_scoring``),
per image side and batch. The forward is the reward's own (rewards/vqa.py): the processor's batch, one image per
prompt, ``logits_to_keep=1``, ``use_cache=False``; ``--cache`` runs it with the KV cache as well, to show what
leaving it out saves (per layer: 28 of them in the real model).

    python benchmarks/vqa_memory.py [--sides 448,1024] [--batches 1,2] [--layers 1] [--cache]

Peak memory is the process's peak resident set (VmHWM, reset before each forward through /proc/self/clear_refs),
with glibc's mmap threshold fixed (the script re-executes itself with ``MALLOC_MMAP_THRESHOLD_``) so that freed
tensors leave the resident set and the peak is what was alive at once. The inputs are made before the reset: the
figure is the forward's, the pixels in the model's dtype being the plan's only other term.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

THRESHOLD = "65536"  # bytes: every larger allocation is its own mapping, returned to the OS when freed


def peak_reset() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set


def status(key: str) -> int:
    """``VmRSS`` / ``VmHWM`` of this process, bytes."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1)) * 1024


def build(layers: int):
    """A Qwen2.5-VL of the 7B's widths with ``layers`` language layers and vision blocks, fp32, and a processor with
    the real patch (14), merge (2) and no pixel cap below 1024²; the tokenizer is the tests' character-level one."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor

    from glm_grpo_ds.memory.reward_models import QWEN25_VL_7B
    from glm_grpo_ds.testing.tiny_vlm import qwen_processor

    processor = qwen_processor(Qwen2_5_VLProcessor, 2048)
    vocab = processor.tokenizer.get_vocab()
    text = dict(QWEN25_VL_7B["text_config"], num_hidden_layers=layers, vocab_size=len(vocab))
    text |= dict(rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}, bos_token_id=None, eos_token_id=None)
    vision = dict(QWEN25_VL_7B["vision_config"], depth=layers, fullatt_block_indexes=list(range(layers)))
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=vocab["<|image_pad|>"],
        video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"],
        vision_end_token_id=vocab["<|vision_end|>"],
    )
    config.dtype = torch.float32
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(config).eval(), processor, config


def measure(model, processor, side: int, batch: int, cache: bool) -> tuple[int, int, int]:
    """``(peak bytes of the forward, image tokens per image, tokens per row)``."""
    import torch

    from glm_grpo_ds.rewards.vqa import QUESTION

    question = QUESTION.format(prompt="a red cube on a blue table")
    message = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    text = processor.apply_chat_template(message, add_generation_prompt=True)
    images = [[torch.rand(3, side, side)] for _ in range(batch)]
    inputs = processor(text=[text] * batch, images=images, padding=True, return_tensors="pt", do_rescale=False)
    tokens = int((inputs["input_ids"][0] == model.config.image_token_id).sum())
    with torch.no_grad():
        peak_reset()
        base = status("VmRSS")
        model(**inputs, logits_to_keep=1, use_cache=cache)
        peak = status("VmHWM") - base
    return peak, tokens, int(inputs["input_ids"].shape[1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", default="448,1024")
    parser.add_argument("--batches", default="1,2")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--cache", action="store_true", help="also measure the forward with the KV cache")
    args = parser.parse_args(argv)
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != THRESHOLD:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": THRESHOLD})

    from glm_grpo_ds.memory.reward_models import vlm_scoring

    model, processor, config = build(args.layers)
    print(f"Qwen2.5-VL-7B widths, {args.layers} layer(s), fp32, CPU; MiB; planned = vlm_scoring less the pixels")
    print("| side | batch | image tokens (planned) | row tokens | measured | planned | planned / measured |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for side in (int(x) for x in args.sides.split(",")):
        for batch in (int(x) for x in args.batches.split(",")):
            for cache in (False, True) if args.cache else (False,):
                peak, tokens, row = measure(model, processor, side, batch, cache)
                planned, planned_tokens = vlm_scoring(config, batch, side)
                pixels = batch * planned_tokens * 4 * 3 * 14**2 * 2 * 4  # the fp32 pixels, made before the reset
                label = f"{batch} (cache)" if cache else str(batch)
                mib = 2**20
                print(
                    f"| {side} | {label} | {tokens} ({planned_tokens}) | {row} | {peak / mib:.0f} | "
                    f"{(planned - pixels) / mib:.0f} | {(planned - pixels) / peak:.2f} |"
                )


if __name__ == "__main__":
    main()
