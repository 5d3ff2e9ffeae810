"""A learnable prompt set for the tiny GLM-Image: prompts + target images rendered by the tiny DiT.

Every target is the tiny pipeline's rendering of a *uniform* target grid (all tokens = one
codebook id) with that prompt's fixed decoder seed (``decoder.seed + row index``), so a policy
that learns to write that token everywhere reproduces the target exactly (``pixel_mse`` -> 0).
Used by the demo and the learning test with ``decoder.fixed_seeds: true``. The command reads the
training config, so targets are rendered with exactly the run's model, size and decoder settings,
and written to its ``data.train_file``:

    glm-grpo tiny-data --config launch/configs/tiny_cpu.yaml [key=value ...]
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..config import DecoderConfig
from .tiny import CODEBOOK_SIZE

PROMPTS = [
    "a red cube on a wooden table",
    "a blue ball in the grass",
    "a lighthouse at sunset",
    "a shop sign that says 'OPEN'",
    "two cats on a sofa",
    "a bowl of green apples",
    "a mountain lake at dawn",
    "a poster with the word 'GRPO'",
]
TARGET_TOKEN = 7


def mean_brightness(images, prompts, samples):
    """A target-free reward for quick runs and tests: the mean pixel value of each image."""
    return images.mean(dim=(1, 2, 3))


def darkness(images, prompts, samples):
    """A reward that is hacked by design: it pays for dark pixels whatever the prompt asks (1 - mean pixel value),
    so a run on it drives the images dark; what the image-statistics alarms must catch (docs/monitoring.md)."""
    return 1.0 - images.mean(dim=(1, 2, 3))


def write_tiny_dataset(
    model_dir, out_dir, height: int, width: int, decoder_cfg: DecoderConfig, num_prompts: int = len(PROMPTS)
) -> Path:
    from ..decoder import ImageDecoder
    from ..rollout import upsample_grid
    from ..runtime.seeding import decoder_seed

    if not 0 <= TARGET_TOKEN < CODEBOOK_SIZE:
        raise ValueError("TARGET_TOKEN must be a codebook id")
    out = Path(out_dir)
    (out / "targets").mkdir(parents=True, exist_ok=True)
    fixed = DecoderConfig(**{**decoder_cfg.__dict__, "fixed_seeds": True})
    decoder = ImageDecoder(model_dir, fixed, "cpu")
    prompts = [PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" #{i}") for i in range(num_prompts)]
    grid = torch.full((num_prompts, (height // 32) * (width // 32)), TARGET_TOKEN)
    seeds = [decoder_seed(fixed, 0, i) for i in range(num_prompts)]
    images = decoder.decode(upsample_grid(grid, height // 32, width // 32), prompts, height, width, seeds)
    lines = []
    for i, (prompt, img) in enumerate(zip(prompts, ImageDecoder.to_pil(images))):
        name = f"targets/{i:03d}.png"
        img.save(out / name)
        lines.append(json.dumps({"prompt": prompt, "target_image": name}))
    (out / "prompts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out / "prompts.jsonl"
