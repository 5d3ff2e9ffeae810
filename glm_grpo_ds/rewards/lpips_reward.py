"""``lpips``: perceptual likeness to the sample's target image (the ``lpips`` package);
reward = -LPIPS distance, NaN without a ``target_image``.

Args: ``net`` (``alex`` | ``vgg`` | ``squeeze``, default alex), ``pretrained_backbone`` (default
true: torchvision's ImageNet weights, which torchvision downloads once into ``$TORCH_HOME``; put
them there beforehand on offline clusters; false = random backbone, for offline tests only),
``offload`` (keep on CPU between calls).
"""

from __future__ import annotations

import torch

from .base import TARGET_IMAGE, FrozenModel, stack_targets


class LPIPSReward:
    needs = TARGET_IMAGE  # undefined (NaN) for samples without it

    def __init__(self, net: str = "alex", pretrained_backbone: bool = True, offload: bool = False):
        import lpips

        # pretrained=True loads the linear heads shipped inside the lpips wheel (no download);
        # pnet_rand decides whether torchvision's backbone weights are used.
        model = lpips.LPIPS(net=net, pretrained=True, pnet_rand=not pretrained_backbone, verbose=False)
        self.model = FrozenModel(model, offload)

    def distance(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """``[N]`` LPIPS distances between images in [0, 1]."""
        with self.model.on(images.device) as m:
            return m(images.float() * 2 - 1, targets.float() * 2 - 1).reshape(-1)

    def __call__(self, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> torch.Tensor:
        targets, has = stack_targets(samples, images.shape[2], images.shape[3], images.device)
        out = torch.full((images.shape[0],), float("nan"), device=images.device)
        if has.any():
            out[has] = -self.distance(images[has], targets[has])
        return out
