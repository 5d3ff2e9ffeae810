"""Target images for likeness rewards, loaded once and fitted to the generated size.

Rule: convert to RGB, resize (bicubic) so the image covers the target size with its aspect ratio
kept, then center-crop to exactly (height, width). Returned as float ``[3, H, W]`` in [0, 1].
"""

from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=256)
def load_target(path: str, height: int, width: int) -> torch.Tensor:
    from PIL import Image

    try:
        img = Image.open(path).convert("RGB")
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read target image {path}: {err}") from None
    scale = max(height / img.height, width / img.width)
    size = (max(width, round(img.width * scale)), max(height, round(img.height * scale)))
    img = img.resize(size, Image.BICUBIC)
    left, top = (img.width - width) // 2, (img.height - height) // 2
    img = img.crop((left, top, left + width, top + height))
    data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(height, width, 3)
    return data.permute(2, 0, 1).float() / 255.0
