"""The diversity features backbone's forward (``grpo.diversity_features``) on the CPU at DINOv2-L's real widths
(random weights, fp32, one layer: no_grad frees each layer before the next, so depth adds nothing): its peak memory
against the memory plan's figure (glm_grpo_ds/memory/reward_models.py ``features_scoring``), per batch. The forward
is the shaping's own (rewards/image_features.py ``ImageFeatures``): DINOv2's processor (224 x 224), the pooled
output. Peak memory is measured as benchmarks/vqa_memory.py measures it (VmHWM with glibc's mmap threshold fixed);
the processed pixels are made before the reset, so the planned figure is shown without them.

    python benchmarks/features_memory.py [--batches 1,4,16] [--layers 1]
"""

from __future__ import annotations

import argparse
import os
import sys

from vqa_memory import THRESHOLD, peak_reset, status


def build(layers: int):
    """An ``ImageFeatures`` over a DINOv2 of DINOv2-L's widths with ``layers`` layers, fp32, saved and loaded the way
    the trainer loads one, and its config."""
    import tempfile

    import torch
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    from glm_grpo_ds.memory.reward_models import DINOV2_LARGE
    from glm_grpo_ds.rewards.image_features import ImageFeatures

    config = Dinov2Config(**dict(DINOV2_LARGE, num_hidden_layers=layers))
    config.dtype = torch.float32
    torch.manual_seed(0)
    folder = tempfile.mkdtemp(prefix="glm_grpo_bench_dino_")
    Dinov2Model(config).save_pretrained(folder)
    size = dict(shortest_edge=256)  # facebook/dinov2-large's preprocessor_config.json: resize 256, crop 224
    BitImageProcessor(size=size, crop_size=dict(height=224, width=224), do_convert_rgb=False).save_pretrained(folder)
    return ImageFeatures(folder), config


def measure(features, batch: int, side: int) -> int:
    """Peak bytes of the backbone's forward over ``batch`` images of ``side`` px (their processing outside it)."""
    import torch

    images = torch.rand(batch, 3, side, side)
    inputs = features.processor(images=list(images), return_tensors="pt", do_rescale=False)
    model = features.model.module
    with torch.no_grad():
        peak_reset()
        base = status("VmRSS")
        out = model(pixel_values=inputs["pixel_values"])
        peak = status("VmHWM") - base
    assert out.pooler_output.shape == (batch, model.config.hidden_size)
    return peak


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--side", type=int, default=512, help="the rendered images' side (the processor makes 224)")
    args = parser.parse_args(argv)
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != THRESHOLD:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": THRESHOLD})

    from glm_grpo_ds.memory.reward_models import FEATURES_SIDE, features_scoring

    features, config = build(args.layers)
    measure(features, 1, args.side)  # the first forward's one-time allocations (thread pools, kernels) left out
    print(f"DINOv2-L widths, {args.layers} layer(s), fp32, CPU; MiB; planned = features_scoring less the pixels")
    print("| batch | measured | planned | planned / measured |")
    print("|---:|---:|---:|---:|")
    mib = 2**20
    for batch in (int(x) for x in args.batches.split(",")):
        peak = measure(features, batch, args.side)
        planned = features_scoring(config, batch) - batch * 3 * FEATURES_SIDE**2 * 4
        print(f"| {batch} | {peak / mib:.0f} | {planned / mib:.0f} | {planned / peak:.2f} |")


if __name__ == "__main__":
    main()
