"""Seeds: every random stream of a run derives from ``cfg.seed`` and named parts (step, rank, row),
so a run is reproducible and independent of the order in which things happen."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch


def derive_seed(*parts) -> int:
    """A 63-bit seed from any parts: ``derive_seed(cfg.seed, "rollout", step, rank)``."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def decoder_seed(decoder_cfg, step: int, row_index: int) -> int:
    """Noise seed of a prompt's group: fixed per dataset row, or fresh for each (step, row)."""
    if decoder_cfg.fixed_seeds:
        return decoder_cfg.seed + row_index
    return derive_seed(decoder_cfg.seed, "decode", step, row_index) % 2**31
