"""A piece of work's seconds and peak memory by phase (:class:`Meter`), handed around as one object where a
function measures several phases for its caller (experience/: the rollout, decode, rewards)."""

from __future__ import annotations

import torch

from .metrics import measure


class Meter:
    """The seconds and peak memory of a piece of work's named phases on ``device``: ``timings[name]`` and
    ``peaks["memory/<name>_peak_mb"]`` (:func:`measure`), filled as each ``with meter.measure(name):`` ends."""

    def __init__(self, device: torch.device | None = None):
        self.device = device or torch.device("cpu")
        self.timings: dict[str, float] = {}
        self.peaks: dict[str, float] = {}

    def measure(self, name: str):
        return measure(self.timings, self.peaks, name, self.device)
