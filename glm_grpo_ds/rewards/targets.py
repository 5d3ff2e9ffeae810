"""Target images for likeness rewards, loaded once and fitted to the generated size.

A sample's ``target_image`` is an absolute path (str) or, for an image column of a dataset, a
:class:`glm_grpo_ds.data.DatasetImage` (the encoded bytes, decoded here); :func:`open_target` opens
either as a PIL image - plugin rewards can use it too.

Rule: turn upright as its EXIF orientation says (a phone's photo is stored sideways with a tag), lay a
transparent image over white (its pixels under alpha 0 are arbitrary, often black), convert to RGB, resize
(bicubic) so the image covers the target size with its aspect ratio kept, then center-crop to exactly
(height, width). Returned as float ``[3, H, W]`` in [0, 1].
"""

from __future__ import annotations

from functools import lru_cache

import torch


def open_target(target):
    """A sample's ``target_image`` (a path or a DatasetImage) as a PIL image (decoded lazily by PIL)."""
    from PIL import Image

    return target.open() if hasattr(target, "open") else Image.open(target)


def as_rgb(img):
    """A PIL image as the picture it shows, in RGB: upright by its EXIF orientation, transparency over white."""
    from PIL import Image, ImageOps

    img = ImageOps.exif_transpose(img)
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return img.convert("RGB")


@lru_cache(maxsize=256)
def load_target(target, height: int, width: int) -> torch.Tensor:
    """``target``: a path (str) or a DatasetImage (hashable by content, so both are cached)."""
    from PIL import Image

    try:
        img = as_rgb(open_target(target))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read target image {target}: {err}") from None
    scale = max(height / img.height, width / img.width)
    size = (max(width, round(img.width * scale)), max(height, round(img.height * scale)))
    img = img.resize(size, Image.BICUBIC)
    left, top = (img.width - width) // 2, (img.height - height) // 2
    img = img.crop((left, top, left + width, top + height))
    data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(height, width, 3)
    return data.permute(2, 0, 1).float() / 255.0
