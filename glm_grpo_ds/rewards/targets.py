"""Target images for likeness rewards, loaded once and fitted to the generated size.

A sample's ``target_image`` is an absolute path (str) or, for an image column of a dataset, a
:class:`glm_grpo_ds.data.DatasetImage` (the encoded bytes, decoded here); :func:`open_target` opens
either as a PIL image - plugin rewards can use it too.

Rule: turn upright as its EXIF orientation says (a phone's photo is stored sideways with a tag), lay a
transparent image over white (its pixels under alpha 0 are arbitrary, often black), bring 16-bit and float
greyscale to 8 bits by their range (PIL's own conversion clips them: mid-grey came out white or black), convert to
RGB, resize (bicubic) so the image covers the target size with its aspect ratio kept, then center-crop to exactly
(height, width). Returned as float ``[3, H, W]`` in [0, 1]; cached as 8-bit (256 targets at 1024 x 1024 are 0.8
GB a rank, 3 GB as floats).
"""

from __future__ import annotations

from functools import lru_cache

import torch


def open_target(target):
    """A sample's ``target_image`` (a path or a DatasetImage) as a PIL image (decoded lazily by PIL)."""
    from ..data.image_files import open_image

    return target.open() if hasattr(target, "open") else open_image(target)


def rgb_tensor(img) -> torch.Tensor:
    """An RGB PIL image as uint8 ``[3, H, W]`` (a view of its bytes, channels first)."""
    return torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(img.height, img.width, 3).permute(2, 0, 1)


def as_rgb(img):
    """A PIL image as the picture it shows, in RGB: upright by its EXIF orientation, transparency over white."""
    from PIL import Image, ImageOps

    img = ImageOps.exif_transpose(img)
    if img.mode.startswith("I") or img.mode == "F":
        img = _eight_bit(img)
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return img.convert("RGB")


def _eight_bit(img):
    """A 16/32-bit integer (``I;16*``, ``I``: a 16-bit PNG's 0..65535) or float (``F``: 0..1) greyscale image as
    8-bit ``L``; ValueError for float values outside [0, 1] (no range to read them by)."""
    import numpy as np
    from PIL import Image

    values = np.asarray(img, dtype=np.float64)
    if img.mode == "F":
        if values.size and (values.min() < 0 or values.max() > 1):
            raise ValueError(
                f"a float image with values in [{values.min():g}, {values.max():g}], not [0, 1]; save it as 8-bit"
            )
        scaled = values * 255
    else:
        scaled = values / 257  # 65535 -> 255
    return Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8), mode="L")


def load_target(target, height: int, width: int) -> torch.Tensor:
    """``target``: a path (str) or a DatasetImage (hashable by content, so both are cached); ValueError naming it
    when it cannot be read."""
    return _fitted(target, height, width).float() / 255.0


@lru_cache(maxsize=256)
def _fitted(target, height: int, width: int) -> torch.Tensor:
    """The uint8 ``[3, H, W]`` target, fitted to the size (cached)."""
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
    return rgb_tensor(img).contiguous()
