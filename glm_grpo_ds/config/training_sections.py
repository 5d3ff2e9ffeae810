"""The sections of the objective's optimisation: ``rewards``, ``optimizer`` and ``batch`` (``grpo``: grpo_section.py).
Each checks its own fields (``problems()``); TrainConfig.validate adds the rules that tie sections together (the
micro-batch against the group size, the disagreement gate against the number of rewards)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from .fields import choice_problems, setting

# what the metrics append to each reward's label (observability/metrics.py; records.py reads them back by these)
REWARD_STATS = ("_std", "_undefined", "_failed")


@dataclass
class RewardSpec:
    """One entry of ``rewards``."""

    name: str = setting(
        "",
        "A built-in reward name (see glm_grpo_ds/rewards), python:package.module:function or "
        "path/to/file.py:function (required).",
    )
    weight: float = setting(
        1.0,
        "Weight of this reward in the combination (see grpo.reward_combination); 0 = logged, not trained on (a "
        "training run refuses all weights 0: it would learn from no reward); negative = a penalty.",
    )
    args: dict = setting(help="Keyword arguments of the reward, e.g. {net: vgg} for lpips.", factory=dict)
    label: str = setting(
        "",
        "The reward's name in metrics.jsonl (reward/<label>), the trackers, the console and the reports; empty = "
        "its name (a plugin's is its path: path/file.py:function), a second use of one getting #2. Letters, "
        "digits, _ . - only, not ending in _std, _undefined or _failed (the keys logged beside it).",
    )

    def problems(self, prefix: str = "") -> list[str]:
        """One line per problem, keys written ``<prefix>key`` (TrainConfig.validate passes ``rewards[i].``)."""
        problems = choice_problems(self, prefix)
        if not self.name:
            problems.append(f"{prefix}name is required")
        if self.label and not re.fullmatch(r"[A-Za-z0-9_.\-]+", self.label):
            problems.append(f"{prefix}label {self.label!r}: letters, digits, _ . - only (it names metrics and tags)")
        problems += self._label_suffix_problems(prefix)
        if not math.isfinite(self.weight):  # a NaN weight made every reward undefined, blamed on the reward
            problems.append(f"{prefix}weight must be a finite number, got {self.weight}")
        return problems

    def _label_suffix_problems(self, prefix: str) -> list[str]:
        """A label (else the name) ending like the statistics logged beside each reward: labels ``q`` and
        ``q_std`` wrote each other's reward/q_std, and the readers of metrics.jsonl take reward/q_std for a
        statistic of ``q`` even alone (observability/records.py reward_means)."""
        shown = self.label or self.name
        if not shown.endswith(REWARD_STATS):
            return []
        key = "label" if self.label else "name"
        return [
            f"{prefix}{key} {shown!r} ends in {shown[shown.rindex('_') :]}, which the metrics append to every reward's "
            "label (reward/<label>_std, _undefined, _failed): give it a label that does not"
        ]


@dataclass
class OptimizerConfig:
    """The optimizer (a DeepSpeed client optimizer) and its learning-rate schedule."""

    name: Literal["adamw", "adamw_8bit", "paged_adamw_8bit"] = setting(
        "adamw_8bit",
        "adamw = torch AdamW (DeepSpeed CPU Adam with optimizer offload); adamw_8bit / paged_adamw_8bit = "
        "bitsandbytes 8-bit states, a quarter of AdamW's state memory (not with offload_optimizer).",
        noun="optimizer",
    )
    lr: float = setting(1e-5, "Peak learning rate (> 0, finite).")
    betas: list[float] = setting(help="Adam betas (two numbers in [0, 1)).", factory=lambda: [0.9, 0.999])
    eps: float = setting(1e-8, "Adam epsilon (> 0).")
    weight_decay: float = setting(0.0, "AdamW (decoupled) weight decay (>= 0).")
    schedule: Literal["constant", "linear", "cosine"] = setting(
        "constant", "Learning rate after warmup: constant, or linear / cosine decay to 0 at the last optimizer step."
    )
    warmup_steps: int = setting(0, "Optimizer steps of linear warmup to lr (>= 0).")
    max_grad_norm: float = setting(
        1.0, "Gradient clipping by global norm (DeepSpeed gradient_clipping); >= 0, 0 = no clipping."
    )

    def problems(self, prefix: str = "optimizer.") -> list[str]:
        """One line per problem, keys written ``<prefix>key``."""
        problems = choice_problems(self, prefix)
        # checked here, not by torch / bitsandbytes after the model loaded (a traceback minutes in); a NaN or
        # negative max_grad_norm turned clipping off without a word (DeepSpeed clips only when it is > 0)
        if not 0 < self.lr < math.inf:
            problems.append(f"{prefix}lr must be > 0 and finite, got {self.lr}")
        if not (len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas)):
            problems.append(f"{prefix}betas must be two numbers in [0, 1), got {self.betas}")
        if not 0 < self.eps < math.inf:
            problems.append(f"{prefix}eps must be > 0 and finite, got {self.eps}")
        if not 0 <= self.weight_decay < math.inf:
            problems.append(f"{prefix}weight_decay must be >= 0 and finite, got {self.weight_decay}")
        if not 0 <= self.max_grad_norm < math.inf:
            problems.append(f"{prefix}max_grad_norm must be >= 0 (0 = off) and finite, got {self.max_grad_norm}")
        if not self.warmup_steps >= 0:
            problems.append(f"{prefix}warmup_steps must be >= 0, got {self.warmup_steps}")
        return problems


@dataclass
class BatchConfig:
    """Sizes per rank and step."""

    prompts_per_rank: int = setting(1, "Prompts each rank samples per step (x G sequences), >= 1.")
    micro_batch_size: int = setting(
        4,
        "Sequences per forward/backward; must divide prompts_per_rank * G. Larger = fewer passes, more activation "
        "memory.",
    )
    mini_batches: int = setting(
        1,
        "Optimizer steps per rollout (and per grpo.num_iterations pass; TRL's steps_per_generation, verl's "
        "ppo_mini_batch_size as a count): each rank's sequences split into this many equal mini-batches, "
        "each one optimizer step on its own loss (normalised over the mini-batch); > 1 = more updates per costly "
        "rollout and decode, the later mini-batches off-policy by the earlier steps (their old log-probs stored, as "
        "num_iterations > 1 stores them). mini_batches x micro_batch_size must divide prompts_per_rank * G. When "
        "mini_batches divides grpo.group_size, the k-th mini-batch holds the k-th K-th of every group's samples, "
        "the same samples on any number of ranks; else, when it divides prompts_per_rank, whole prompts, the same on "
        "every number of ranks where it still divides it; else each rank's sequences in order (rank-dependent).",
    )

    def problems(self, prefix: str = "batch.") -> list[str]:
        """One line per problem, keys written ``<prefix>key``; that micro_batch_size divides the sequences of a
        step (which grpo.group_size sets) is TrainConfig.validate's."""
        problems = choice_problems(self, prefix)
        if not self.prompts_per_rank >= 1:
            problems.append(f"{prefix}prompts_per_rank must be >= 1, got {self.prompts_per_rank}")
        if not self.micro_batch_size >= 1:
            problems.append(f"{prefix}micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if not self.mini_batches >= 1:
            problems.append(f"{prefix}mini_batches must be >= 1, got {self.mini_batches}")
        return problems
