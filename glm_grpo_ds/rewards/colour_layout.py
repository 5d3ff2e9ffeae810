"""``colour_layout``: does the image show the colour layout its prompt asks for?

The reward of the learnable tiny world (glm_grpo_ds/testing/world.py), usable with any pipeline whose
prompts follow its small grammar (case-insensitive, one colour name from :data:`COLOURS` per slot):

* ``red image`` / ``a red image``                      - every cell red
* ``red on the left, blue on the right``               - left half / right half
* ``red on top, blue at the bottom``                   - top half / bottom half
* ``a red square on a blue background``                - the middle half of the grid / the rest

The image is cut into 32x32-pixel cells (one AR token each); the prompt gives every cell a target
colour; reward = ``1 - mean |image - target|`` over pixels and RGB channels, in [0, 1]: 1 is the asked
layout exactly, a uniformly random choice among the 8 colours scores 0.5 in expectation. A prompt
outside the grammar makes the reward raise (the trainer then counts that batch as failed).
:func:`best_reward` gives the best value reachable when the decoder can paint only certain colours.
Args: none.
"""

from __future__ import annotations

import re

import torch

COLOURS = {  # name -> RGB in {0, 1}
    "black": (0, 0, 0),
    "red": (1, 0, 0),
    "green": (0, 1, 0),
    "yellow": (1, 1, 0),
    "blue": (0, 0, 1),
    "magenta": (1, 0, 1),
    "cyan": (0, 1, 1),
    "white": (1, 1, 1),
}
CELL = 32  # pixels per AR token (GLM-Image's AR grid is H/32 x W/32)

_NAME = "|".join(COLOURS)
# (pattern, (row, col, rows, cols) -> index of the colour group that cell takes)
_LAYOUTS = [
    (re.compile(rf"^(?:an? )?({_NAME}) image$"), lambda r, c, h, w: 0),
    (re.compile(rf"^({_NAME}) on the left, ({_NAME}) on the right$"), lambda r, c, h, w: 0 if c < w // 2 else 1),
    (re.compile(rf"^({_NAME}) on top, ({_NAME}) at the bottom$"), lambda r, c, h, w: 0 if r < h // 2 else 1),
    (
        re.compile(rf"^an? ({_NAME}) square on an? ({_NAME}) background$"),
        lambda r, c, h, w: 0 if h // 4 <= r < h - h // 4 and w // 4 <= c < w - w // 4 else 1,
    ),
]


def prompt_cells(prompt: str, rows: int, cols: int) -> list[list[str]]:
    """The colour name each cell of a ``rows x cols`` grid should have (ValueError outside the grammar)."""
    text = prompt.strip().lower()
    for pattern, pick in _LAYOUTS:
        m = pattern.match(text)
        if m:
            names = m.groups()
            return [[names[pick(r, c, rows, cols)] for c in range(cols)] for r in range(rows)]
    raise ValueError(f"prompt {prompt!r} is not a colour layout (see glm_grpo_ds/rewards/colour_layout.py)")


def _cell_targets(prompt: str, height: int, width: int) -> torch.Tensor:
    """``[H/32, W/32, 3]`` target colour of each cell."""
    if height % CELL or width % CELL:
        raise ValueError(f"colour_layout needs images whose sides are multiples of {CELL} pixels, got {height}x{width}")
    cells = prompt_cells(prompt, height // CELL, width // CELL)
    return torch.tensor([[COLOURS[n] for n in row] for row in cells], dtype=torch.float32)


def prompt_target(prompt: str, height: int, width: int) -> torch.Tensor:
    """``[3, H, W]`` target image in {0, 1}."""
    return _cell_targets(prompt, height, width).permute(2, 0, 1).repeat_interleave(CELL, 1).repeat_interleave(CELL, 2)


def best_reward(prompt: str, palette_rgb: torch.Tensor, height: int, width: int) -> float:
    """The highest reward reachable for ``prompt`` when each cell can be painted in one of the
    uniform colours ``palette_rgb`` ``[K, 3]`` (measured from the decoder): every cell takes its best."""
    target = _cell_targets(prompt, height, width)
    err = (palette_rgb.float().view(-1, 1, 1, 3) - target.unsqueeze(0)).abs().mean(-1)  # [K, h, w]
    return float(1.0 - err.min(dim=0).values.mean())


class ColourLayoutReward:
    def __call__(self, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> torch.Tensor:
        _, _, h, w = images.shape
        # one target per prompt, built and copied to the device once: a group's G rows share theirs
        distinct = list(dict.fromkeys(prompts))
        built = torch.stack([prompt_target(p, h, w) for p in distinct]).to(images.device)
        targets = built[torch.tensor([distinct.index(p) for p in prompts], device=images.device)]
        return 1.0 - (images.float() - targets).abs().mean(dim=(1, 2, 3))
