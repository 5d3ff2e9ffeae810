"""``pixel_mse``: likeness to the sample's target image, reward = -mean squared pixel error.

Cheap and exact; NaN for samples without a ``target_image``. Args: none.
"""

from __future__ import annotations

import torch

from .targets import load_target


class PixelMSEReward:
    name = "pixel_mse"

    def __call__(self, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> torch.Tensor:
        n, _, h, w = images.shape
        out = torch.full((n,), float("nan"), device=images.device)
        for i, sample in enumerate(samples):
            path = sample.get("target_image")
            if path:
                target = load_target(path, h, w).to(images.device)
                out[i] = -((images[i].float() - target) ** 2).mean()
        return out
