"""Sample galleries: one PNG grid per training / eval step (and ``glm-grpo evaluate``'s gallery.png), one row per
prompt, one column per sample (or per model), each tile captioned with its reward and each row headed by its
prompt, wrapped.

Pure image code (torch + PIL): the trainer gathers thumbnails to rank 0 (``dist.gather_to_main``)
and calls :func:`save_gallery` there::

    thumbs = thumbnails(images, max_side=128)                   # [N, 3, h, w] uint8, N = rows * cols
    save_gallery("out/samples/step_000010.png", thumbs, prompts, rewards, cols=G)
    save_gallery("out/gallery.png", thumbs, prompts, rewards, cols=2, headers=["base", "adapter_0"])

Layout (all sizes in pixels, see :func:`grid_size`): on a grey background (white and black tiles both show their
edges), ``GUTTER`` around and between the tiles; with ``headers``, a ``HEADER_H`` strip naming each column; every
row is the prompt wrapped to the row's width in up to ``PROMPT_LINES`` lines of ``LINE_H`` (as many as the
gallery's longest prompt needs, the same for every row), then ``cols`` tiles of ``h x w``, each with a
``CAPTION_H`` strip below it. Text uses PIL's default font.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

HEADER_H = 14  # column names above the first row (headers=...)
LINE_H = 12  # one line of a row's prompt
PROMPT_LINES = 4  # a longer prompt is cut after this many lines, with "..."
CAPTION_H = 14  # reward strip below each tile
GUTTER = 4  # around and between tiles
BACKGROUND = (200, 200, 200)
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


def grid_size(rows: int, cols: int, tile_h: int, tile_w: int, prompt_lines: int = 1, headers: bool = False):
    """``(width, height)`` of a gallery PNG whose prompts take ``prompt_lines`` lines (:func:`prompt_lines`)."""
    width = GUTTER + cols * (tile_w + GUTTER)
    height = GUTTER + (HEADER_H if headers else 0) + rows * (prompt_lines * LINE_H + tile_h + CAPTION_H + GUTTER)
    return width, height


def _fit(draw, text: str, width: int, font) -> str:
    """``text`` cut (with "...") to fit ``width`` pixels."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "...", font=font) > width:
        text = text[:-1]
    return text + "..." if text else ""


def _wrap(draw, text: str, width: int, font, max_lines: int = PROMPT_LINES) -> list[str]:
    """``text`` in lines of at most ``width`` pixels, word by word (a word wider than a line is cut), at most
    ``max_lines``; the last one ends in "..." when text is left over."""
    lines: list[str] = []
    words = text.split()
    while words and len(lines) < max_lines:
        line = words.pop(0)
        while words and draw.textlength(f"{line} {words[0]}", font=font) <= width:
            line = f"{line} {words.pop(0)}"
        lines.append(_fit(draw, line, width, font))
    if words:
        lines[-1] = _fit(draw, lines[-1] + " " + " ".join(words), width, font)
    return lines or [""]


def _text_width(cols: int, tile_w: int) -> int:
    return cols * tile_w + (cols - 1) * GUTTER


def _wrapped_prompts(prompts: list[str], cols: int, tile_w: int, draw, font) -> list[list[str]]:
    """Each row's ``"r: prompt"`` heading, wrapped over a row of ``cols`` tiles ``tile_w`` wide."""
    width = _text_width(cols, tile_w)
    return [_wrap(draw, f"{r}: {p}", width, font) for r, p in enumerate(prompts)]


def prompt_lines(prompts: list[str], cols: int, tile_w: int) -> int:
    """The lines the longest of ``prompts`` wraps to over a row of ``cols`` tiles ``tile_w`` wide (at most
    ``PROMPT_LINES``): what :func:`make_grid` gives every row."""
    from PIL import Image, ImageDraw, ImageFont

    draw, font = ImageDraw.Draw(Image.new("RGB", (1, 1))), ImageFont.load_default()
    return max([len(lines) for lines in _wrapped_prompts(prompts, cols, tile_w, draw, font)] or [1])


def make_grid(thumbs: torch.Tensor, prompts: list[str], captions: list[str], cols: int, headers=None):
    """``thumbs`` ``[rows * cols, 3, h, w]`` uint8 (row-major) -> PIL image; ``prompts`` one per row,
    ``captions`` one per tile, ``headers`` one per column (or None: no header strip)."""
    from PIL import Image, ImageDraw, ImageFont

    n, _, h, w = thumbs.shape
    if cols < 1 or n % cols:
        raise ValueError(f"{n} thumbnails do not fill rows of {cols}")
    rows = n // cols
    if len(prompts) != rows or len(captions) != n:
        raise ValueError(
            f"{rows} rows and {n} tiles need as many prompts and captions, got {len(prompts)} and {len(captions)}"
        )
    if headers is not None and len(headers) != cols:
        raise ValueError(f"{cols} columns need as many headers, got {len(headers)}")
    font = ImageFont.load_default()
    headings = _wrapped_prompts(prompts, cols, w, ImageDraw.Draw(Image.new("RGB", (1, 1))), font)
    lines = max(len(heading) for heading in headings)
    canvas = Image.new("RGB", grid_size(rows, cols, h, w, lines, headers is not None), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    arr = thumbs.permute(0, 2, 3, 1).cpu().numpy()
    top = GUTTER
    if headers is not None:
        for c, name in enumerate(headers):
            draw.text((GUTTER + c * (w + GUTTER), top), _fit(draw, name, w, font), fill=TEXT, font=font)
        top += HEADER_H
    for r in range(rows):
        for k, line in enumerate(headings[r]):
            draw.text((GUTTER, top + k * LINE_H), line, fill=TEXT, font=font)
        tile_top = top + lines * LINE_H
        for c in range(cols):
            i, left = r * cols + c, GUTTER + c * (w + GUTTER)
            canvas.paste(Image.fromarray(arr[i]), (left, tile_top))
            draw.text((left, tile_top + h + 1), _fit(draw, captions[i], w, font), fill=TEXT, font=font)
        top = tile_top + h + CAPTION_H + GUTTER
    return canvas


def reward_caption(value: float) -> str:
    return "r=n/a" if value != value else f"r={value:.4g}"  # NaN: undefined for every reward


def save_gallery(
    path: str | Path, thumbs: torch.Tensor, prompts: list[str], rewards: list[float], cols: int, headers=None
) -> Path:
    """Write the grid PNG (parent directories created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    make_grid(thumbs, prompts, [reward_caption(float(v)) for v in rewards], cols, headers).save(out)
    return out
