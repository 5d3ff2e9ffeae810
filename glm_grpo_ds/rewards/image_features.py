"""The image features GARDO's diversity shaping compares (``grpo.diversity_features``; the distances and the shaping:
glm_grpo_ds/advantages.py ``nearest_distances``, ``diversity_multipliers``), one vector per image:

* ``pixels``: the image box-averaged to 32 x 32, flattened, its own mean taken out (so the cosine distance is one
  minus the two images' correlation): no model, what the tiny world's images differ by, blind to what a picture
  shows;
* a transformers vision backbone, a local directory or a Hub id that ``AutoModel`` and ``AutoImageProcessor`` load
  (DINOv2, e.g. ``facebook/dinov2-large``, or DINOv3, GARDO's choice): its pooled output (DINOv2's: the normed CLS
  token), else its first token's last hidden state. Loaded once per rank like a reward model (rewards/base.py
  FrozenModel: on the images' device from the first call, and kept there).

    features = ImageFeatures("pixels")
    vectors = features(images)      # [N, D] float32, images [N, 3, H, W] in [0, 1]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import RewardError, frozen_pretrained
from .model_files import check_transformers_model

PIXELS = "pixels"
PIXEL_SIDE = 32  # the pixel features' side: 3 x 32 x 32 numbers an image
DINOV2_L = "facebook/dinov2-large"  # the backbone the docs name


def check_features_source(source: str | None) -> None:
    """Fail fast (before any model loads) on a ``grpo.diversity_features`` backbone that is not a checkpoint
    directory here, or a Hub id not in the cache offline: one line naming the key."""
    if source is None or source == PIXELS:
        return
    try:
        check_transformers_model("", source, "", DINOV2_L, key="grpo.diversity_features")
    except RewardError as err:
        raise RewardError(f"{err} (or pixels, for the pixel features)") from None


class ImageFeatures:
    def __init__(self, source: str):
        self.model, self.processor = None, None
        if source != PIXELS:
            from transformers import AutoImageProcessor, AutoModel

            self.model, path = frozen_pretrained(AutoModel, source, "grpo.diversity_features")
            self.processor = AutoImageProcessor.from_pretrained(path)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """``[N, D]`` float32 features of ``images`` ``[N, 3, H, W]`` in [0, 1], on their device."""
        images = images.detach().float().clamp(0, 1)
        if self.model is None:
            flat = F.adaptive_avg_pool2d(images, PIXEL_SIDE).flatten(1)
            return flat - flat.mean(dim=1, keepdim=True)
        inputs = self.processor(images=list(images), return_tensors="pt", do_rescale=False)  # already in [0, 1]
        with self.model.on(images.device) as model:
            out = model(pixel_values=inputs["pixel_values"].to(images.device, model.dtype))
        pooled = getattr(out, "pooler_output", None)
        return (out.last_hidden_state[:, 0] if pooled is None else pooled).float()
