"""Seeds: every random stream of a run derives from ``cfg.seed`` and named parts (step, rank, row),
so a run is reproducible and independent of the order in which things happen."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch


def derive_seed(*parts) -> int:
    """A 63-bit seed from any parts: ``derive_seed(cfg.seed, "rollout", step, slot)``."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def rollout_seeds(seed: int, step: int, rank: int, prompts_per_rank: int) -> list[int]:
    """The sampling streams of step ``step``'s prompts on ``rank``, one per prompt, named by its place in the global
    batch (rank-major, as data/prompt_order.py splits it): a prompt samples the same tokens whichever rank draws it,
    so a resume on another world size keeping the prompts per step samples what the uninterrupted run would. With
    one prompt per rank the place is the rank (the streams runs have always had)."""
    first = rank * prompts_per_rank
    return [derive_seed(seed, "rollout", step, slot) for slot in range(first, first + prompts_per_rank)]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def decoder_seed(decoder_cfg, step: int, row_index: int) -> int:
    """Noise seed of a prompt's group: fixed per dataset row, or fresh for each (step, row)."""
    if decoder_cfg.fixed_seeds:
        return decoder_cfg.seed + row_index
    return derive_seed(decoder_cfg.seed, "decode", step, row_index) % 2**31
