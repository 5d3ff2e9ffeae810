"""``pixel_mse``: likeness to the sample's target image, reward = -mean squared pixel error.

Cheap and exact; NaN for samples without a ``target_image``. Args: none.
"""

from __future__ import annotations

import torch

from .base import TARGET_IMAGE, stack_targets


class PixelMSEReward:
    needs = TARGET_IMAGE  # undefined (NaN) for samples without it

    def __call__(self, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> torch.Tensor:
        targets, has = stack_targets(samples, images.shape[2], images.shape[3], images.device)
        mse = ((images.float() - targets) ** 2).mean(dim=(1, 2, 3))
        return torch.where(has, -mse, torch.full_like(mse, float("nan")))
