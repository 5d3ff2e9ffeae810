"""``ssim``: structural similarity to the sample's target image (torchmetrics), in [-1, 1];
NaN without a ``target_image``. Args: ``kernel_size`` (default 11), ``sigma`` (default 1.5)."""

from __future__ import annotations

import torch

from .base import TARGET_IMAGE, RewardError, stack_targets


class SSIMReward:
    needs = TARGET_IMAGE  # undefined (NaN) for samples without it

    @staticmethod
    def check_args(args: dict) -> None:
        """Values torchmetrics refuses at the first score, where every sample's reward was undefined (NaN) and the
        run skipped its updates until it stopped: refused before the job queues."""
        kernel, sigma = args.get("kernel_size", 11), args.get("sigma", 1.5)
        if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 1 or kernel % 2 == 0:
            raise RewardError(f"reward ssim: kernel_size {kernel!r} must be an odd whole number >= 1 (default 11)")
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not sigma > 0:
            raise RewardError(f"reward ssim: sigma {sigma!r} must be a number > 0 (default 1.5)")

    def __init__(self, kernel_size: int = 11, sigma: float = 1.5):
        self.kernel_size, self.sigma = kernel_size, sigma

    def __call__(self, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> torch.Tensor:
        from torchmetrics.functional.image import structural_similarity_index_measure

        targets, has = stack_targets(samples, images.shape[2], images.shape[3], images.device)
        out = torch.full((images.shape[0],), float("nan"), device=images.device)
        if has.any():
            out[has] = structural_similarity_index_measure(
                images[has].float(),
                targets[has],
                data_range=1.0,
                kernel_size=self.kernel_size,
                sigma=self.sigma,
                reduction="none",
            ).reshape(-1)
        return out
