"""The adaptive entropy coefficient (Skywork-OR1, arXiv:2505.22312; TRL's ``use_adaptive_entropy``): the entropy
bonus's coefficient moved each optimizer step by the policy's entropy, so a bonus that keeps the policy from
collapsing does not push it past a target either (``grpo.entropy_target``).

After each optimizer step, given the mean entropy of the tokens the policy term trained on (every rank's):

* at or below the target: the coefficient grows by ``delta`` (up to ``high``); above it: shrinks by ``delta`` (down
  to ``low``);
* the next step's bonus takes the coefficient only while that entropy is at or below the target, else 0: above the
  target nothing needs raising (the first step, with no entropy measured yet, has no bonus).

Plain Python, no torch: the caller measures the entropy (all ranks) and applies the coefficient.

    control = EntropyControl(coef=0.0, target=0.5, delta=0.005, low=0.0, high=1.0)
    settings = dataclasses.replace(settings, entropy_coef=control.applied)   # this step's bonus
    ...                                                                      # the step
    control.update(world_entropy)                                            # after the optimizer step
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class EntropyControl:
    """``coef``: the coefficient now (``grpo.entropy_coef`` at the start); ``target``: the entropy in nats;
    ``delta``: the change per optimizer step; ``[low, high]``: the coefficient's range; ``last_entropy``: the
    entropy the last update saw (inf before any)."""

    coef: float
    target: float
    delta: float
    low: float
    high: float
    last_entropy: float = math.inf

    @property
    def applied(self) -> float:
        """The coefficient of the next optimizer step's bonus: ``coef`` while the last entropy is at or below the
        target, else 0."""
        return self.coef if self.last_entropy <= self.target else 0.0

    @classmethod
    def for_config(cls, grpo_cfg) -> EntropyControl | None:
        """The ``grpo`` section's controller, starting at ``entropy_coef``; None without ``entropy_target``."""
        g = grpo_cfg
        if g.entropy_target is None:
            return None
        return cls(g.entropy_coef, g.entropy_target, g.entropy_coef_delta, g.entropy_coef_min, g.entropy_coef_max)

    def update(self, entropy: float) -> None:
        """After an optimizer step whose trained tokens had mean entropy ``entropy`` (all ranks). A non-finite one (a
        step of non-finite numbers, or no trained token: NaN) leaves the controller as it was, where TRL's would
        lower the coefficient and stop the bonus on a NaN, and read no token as an entropy of 0."""
        if not math.isfinite(entropy):
            return
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.high)
        else:
            self.coef = max(self.coef - self.delta, self.low)
        self.last_entropy = entropy

    def state(self) -> dict:
        """For a checkpoint's trainer_state.json (strict JSON: no entropy measured yet is null, not Infinity)."""
        last = None if math.isinf(self.last_entropy) else self.last_entropy
        return {"coef": self.coef, "last_entropy": last}

    def load_state(self, state: dict) -> None:
        """A checkpoint's state; its coefficient moved into this run's [low, high] (a resume may change them)."""
        self.coef = min(max(float(state["coef"]), self.low), self.high)
        self.last_entropy = math.inf if state["last_entropy"] is None else float(state["last_entropy"])
