"""``save_best``: the checkpoint with the highest ``eval/reward_mean`` among those saved at an evaluated step, named
by ``checkpoints/best`` (as ``latest`` names the newest) and never pruned while it is the best; ``checkpoints/
best.json`` holds its step and reward. Image RL often peaks and then hacks its reward: the limit of
``save_total_limit`` would delete the peak (TRL's ``metric_for_best_model``, with the eval reward).

    best = BestCheckpoint(out, enabled, is_main, resume_step)
    best.consider(step, eval_reward, checkpoint_path)   # rank 0, after a save at an evaluated step

A resume keeps the best of the steps it goes on from; one from a branch it went back from (a step past the resumed
checkpoint) is forgotten, its pointer removed, and pruned as any other checkpoint of that branch is.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..runtime import log
from ..runtime.atomic_files import write_text_atomic
from .checkpoint import BEST, CHECKPOINTS

BEST_RECORD = "best.json"


class BestCheckpoint:
    def __init__(self, out: Path, enabled: bool, is_main: bool, resume_step: int | None = None):
        self.root = Path(out) / CHECKPOINTS
        self.enabled, self.is_main = enabled, is_main
        self.value: float | None = None
        self.step: int | None = None  # the best's step
        record = self.root / BEST_RECORD
        if not (enabled and is_main and record.is_file()):
            return
        try:
            saved = json.loads(record.read_text(encoding="utf-8"))
            step, value = int(saved["step"]), float(saved["eval/reward_mean"])
        except (OSError, ValueError, KeyError, TypeError):  # unreadable: the run finds its best again
            return
        if resume_step is not None and step > resume_step:  # a branch this launch went back from
            (self.root / BEST).unlink(missing_ok=True)
            record.unlink(missing_ok=True)
            return
        self.value, self.step = value, step

    def consider(self, step: int, value: float | None, path: Path) -> bool:
        """Rank 0: ``path`` (the checkpoint saved at ``step``, evaluated at ``value``) becomes the best when its
        reward is finite and above every earlier one; whether it did."""
        if not (self.enabled and self.is_main) or value is None or not math.isfinite(value):
            return False
        if self.value is not None and value <= self.value:
            return False
        self.value, self.step = value, step
        record = {"step": step, "checkpoint": path.name, "eval/reward_mean": value}
        write_text_atomic(self.root / BEST_RECORD, json.dumps(record) + "\n")
        write_text_atomic(self.root / BEST, path.name)  # the pointer last: it protects the checkpoint from pruning
        log.info(f"glm-grpo: checkpoints/best names {path.name} (eval reward {value:.4f}, the highest so far)")
        return True
