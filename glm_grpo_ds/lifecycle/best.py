"""``save_best``: the checkpoint with the highest ``eval/reward_mean`` among those saved at an evaluated step, named
by ``checkpoints/best`` (as ``latest`` names the newest) and never pruned while it is the best; ``checkpoints/
best.json`` holds its step and reward, and every evaluated checkpoint's (``history``). Image RL often peaks and then
hacks its reward: the limit of ``save_total_limit`` would delete the peak (TRL's ``metric_for_best_model``, with the
eval reward).

    best = BestCheckpoint(out, enabled, is_main, resume_step)
    best.consider(step, eval_reward, checkpoint_path)   # rank 0, after a save at an evaluated step

A resume takes the best again among the evaluated checkpoints of the steps it goes on from that still exist (one of a
branch it went back from is not a candidate); a fresh start, or a run with ``save_best`` off, removes the pointer an
earlier run left, so pruning treats that checkpoint as any other.
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
        self.history: list[list] = []  # [step, reward, checkpoint name] of every evaluated checkpoint considered
        if not is_main:
            return
        if not enabled or resume_step is None:  # an earlier run's or an earlier launch's choice: not this run's
            self._forget()
            return
        try:
            saved = json.loads((self.root / BEST_RECORD).read_text(encoding="utf-8"))
            history = [[int(s), float(v), str(name)] for s, v, name in saved.get("history", [])]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none, or unreadable: found again
            history = []
        # the steps this launch goes on from, whose checkpoints are still there; the best of them (the first of
        # equal rewards, as consider keeps it), written once
        self.history = sorted((h for h in history if h[0] <= resume_step and (self.root / h[2]).is_dir()))
        if not self.history:
            self._forget()
            return
        self.step, self.value, self.name = max(self.history, key=lambda h: (h[1], -h[0]))
        self._write()

    def _forget(self) -> None:
        (self.root / BEST).unlink(missing_ok=True)
        (self.root / BEST_RECORD).unlink(missing_ok=True)

    def consider(self, step: int, value: float | None, path: Path) -> bool:
        """Rank 0: ``path`` (the checkpoint saved at ``step``, evaluated at ``value``) becomes the best when its
        reward is finite and above every earlier one; whether it did."""
        if not (self.enabled and self.is_main) or value is None or not math.isfinite(value):
            return False
        self.history.append([step, value, path.name])
        better = self.value is None or value > self.value
        if better:
            self.value, self.step, self.name = value, step, path.name
        self._write()  # the history grew either way
        if better:
            log.info(f"glm-grpo: checkpoints/best names {path.name} (eval reward {value:.4f}, the highest so far)")
        return better

    def _write(self) -> None:
        record = {"step": self.step, "checkpoint": self.name, "eval/reward_mean": self.value, "history": self.history}
        write_text_atomic(self.root / BEST_RECORD, json.dumps(record) + "\n")
        write_text_atomic(self.root / BEST, self.name)  # the pointer last: it protects the checkpoint from pruning
