"""Sample galleries: one PNG grid per training / eval step, one row per prompt, one column per
group sample, each tile captioned with its reward and each row headed by its (truncated) prompt.

Pure image code (torch + PIL): the trainer gathers thumbnails to rank 0 (``dist.gather_to_main``)
and calls :func:`save_gallery` there::

    thumbs = thumbnails(images, max_side=128)                   # [N, 3, h, w] uint8, N = rows * cols
    save_gallery("out/samples/step_000010.png", thumbs, prompts, rewards, cols=G)

Layout (all sizes in pixels, see :func:`grid_size`): every row is a ``HEADER_H`` strip with the
prompt, then ``cols`` tiles of ``h x w`` side by side, each with a ``CAPTION_H`` strip below it.
Text uses PIL's default font.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

HEADER_H = 14  # prompt strip above each row
CAPTION_H = 14  # reward strip below each tile
BACKGROUND = (255, 255, 255)
TEXT = (0, 0, 0)


def thumbnail_size(height: int, width: int, max_side: int) -> tuple[int, int]:
    """``(h, w)`` with the longer side ``min(max_side, longer side)`` and the aspect ratio kept
    (never upscaled: small images stay pixel-exact)."""
    scale = min(1.0, max_side / max(height, width))
    return max(1, round(height * scale)), max(1, round(width * scale))


def thumbnails(images: torch.Tensor, max_side: int) -> torch.Tensor:
    """``[N, 3, H, W]`` float in [0, 1] -> ``[N, 3, h, w]`` uint8 (antialiased downscale), on the
    images' device - small enough to gather across ranks."""
    h, w = thumbnail_size(images.shape[2], images.shape[3], max_side)
    small = images.float()
    if (h, w) != tuple(images.shape[2:]):
        small = F.interpolate(small, size=(h, w), mode="bilinear", antialias=True, align_corners=False)
    return (small.clamp(0, 1) * 255).round().to(torch.uint8)


def grid_size(rows: int, cols: int, tile_h: int, tile_w: int) -> tuple[int, int]:
    """``(width, height)`` of a gallery PNG."""
    return cols * tile_w, rows * (HEADER_H + tile_h + CAPTION_H)


def _fit(draw, text: str, width: int, font) -> str:
    """``text`` cut (with "...") to fit ``width`` pixels."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "...", font=font) > width:
        text = text[:-1]
    return text + "..." if text else ""


def make_grid(thumbs: torch.Tensor, prompts: list[str], captions: list[str], cols: int):
    """``thumbs`` ``[rows * cols, 3, h, w]`` uint8 (row-major) -> PIL image; ``prompts`` one per
    row, ``captions`` one per tile."""
    from PIL import Image, ImageDraw, ImageFont

    n, _, h, w = thumbs.shape
    if cols < 1 or n % cols:
        raise ValueError(f"{n} thumbnails do not fill rows of {cols}")
    rows = n // cols
    if len(prompts) != rows or len(captions) != n:
        raise ValueError(
            f"{rows} rows and {n} tiles need as many prompts and captions, got {len(prompts)} and {len(captions)}"
        )
    canvas = Image.new("RGB", grid_size(rows, cols, h, w), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default()
    arr = thumbs.permute(0, 2, 3, 1).cpu().numpy()
    row_h = HEADER_H + h + CAPTION_H
    for r in range(rows):
        top = r * row_h
        draw.text((2, top + 1), _fit(draw, f"{r}: {prompts[r]}", cols * w - 4, font), fill=TEXT, font=font)
        for c in range(cols):
            i = r * cols + c
            canvas.paste(Image.fromarray(arr[i]), (c * w, top + HEADER_H))
            draw.text((c * w + 2, top + HEADER_H + h + 1), _fit(draw, captions[i], w - 4, font), fill=TEXT, font=font)
    return canvas


def reward_caption(value: float) -> str:
    return "r=n/a" if value != value else f"r={value:.4g}"  # NaN: undefined for every reward


def save_gallery(path: str | Path, thumbs: torch.Tensor, prompts: list[str], rewards: list[float], cols: int) -> Path:
    """Write the grid PNG (parent directories created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    make_grid(thumbs, prompts, [reward_caption(float(v)) for v in rewards], cols).save(out)
    return out
