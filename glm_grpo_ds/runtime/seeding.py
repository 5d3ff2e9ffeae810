"""Seeds: every random stream of a run derives from ``cfg.seed`` and named parts (step, rank, row),
so a run is reproducible and independent of the order in which things happen."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch

from . import log


def derive_seed(*parts) -> int:
    """A 63-bit seed from any parts: ``derive_seed(cfg.seed, "rollout", step, slot)``."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def rollout_seeds(seed: int, step: int, places: list[int]) -> list[int]:
    """The sampling streams of step ``step``'s prompts at ``places`` in the step's draw (a rank's, as
    data/prompt_order.py gives them), one per prompt: a prompt samples the same tokens whichever rank draws it, so a
    resume on another world size keeping the prompts per step samples what the uninterrupted run would. With one
    prompt per rank the place is the rank (the streams runs have always had)."""
    return [derive_seed(seed, "rollout", step, slot) for slot in places]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def decoder_seed(decoder_cfg, step: int, row_index: int) -> int:
    """Noise seed of a prompt's group: fixed per dataset row, or fresh for each (step, row)."""
    if decoder_cfg.fixed_seeds:
        return decoder_cfg.seed + row_index
    return derive_seed(decoder_cfg.seed, "decode", step, row_index) % 2**31


def rng_state() -> dict:
    """This process's random state (Python, numpy, torch, its CUDA device's), as a checkpoint keeps it per rank."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        # numpy's state as tensors and numbers, so it loads with torch.load(weights_only=True)
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "cached": cached,
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        # this rank's device only: a resume on the same ranks may see another number of devices per process (8 ranks
        # on one node of 8 GPUs, requeued on 2 nodes of 4), where a list of every visible device's would not fit
        state["cuda_device"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Put back what :func:`rng_state` returned."""
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    if not torch.cuda.is_available():
        return
    if "cuda_device" in state:
        torch.cuda.set_rng_state(state["cuda_device"])
    elif "cuda" in state:  # an earlier version's checkpoint: the state of every device the rank saw
        if len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
        else:  # which one was this rank's is not recorded: the seeded state stays (a resume is then not bitwise)
            log.warning_once(
                "rng:cuda",
                f"glm-grpo: warning: the checkpoint holds the CUDA random state of {len(state['cuda'])} devices per "
                f"process, this rank sees {torch.cuda.device_count()}: the CUDA random state starts from the seed",
            )
