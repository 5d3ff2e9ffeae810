"""The statistics of one GRPO update (glm_grpo_ds/update.py), accumulated micro-batch by micro-batch.

    stats = UpdateStats()
    for optimizer step ...:                          # grpo.num_iterations x batch.mini_batches of them
        for micro-batch ...:
            stats.add_mismatch(sums)                 # first iteration: sampler vs trainer (corrections.mismatch_sums)
            stats.add_correction(sums)               # first iteration: corrections.correction_sums (None: none)
            stats.add_selection(selection)           # the top-entropy selection of update.policy_token_weights
            stats.add(loss, loss_stats, applied)     # policy_loss's stats, whether DeepSpeed applied the step
        stats.end_iteration()                        # an "iteration": one optimizer step
    stats.result()                                   # the dict the step record reads (observability/metrics.py)

Token statistics are token-weighted over micro-batches, then averaged over optimizer steps (each step's kept under
``"iterations"``); the ratio extremes are over everything; ``loss`` adds up over a step's micro-batches (their
losses sum to its mini-batch's loss), then is averaged over the steps; ``skipped`` counts the optimizer steps
DeepSpeed skipped. :meth:`UpdateStats.not_run` is the result of an update that did not run at all (every step
skipped, no statistic: NaN, written as null).
"""

from __future__ import annotations

import math
from collections import defaultdict

# the loss statistics averaged over tokens (policy_loss's stats), and the first iteration's sampler-vs-trainer ones
TOKEN_MEANS = ("clip_frac_low", "clip_frac_high", "ratio_mean", "kl", "entropy")
MISMATCH_KEYS = ("mismatch/logp_abs_mean", "mismatch/logp_abs_max", "mismatch/kl_k3", "mismatch/frac_beyond")


def extreme(pick, *values: float) -> float:
    """``pick`` (min or max) of ``values``, NaN when any is: Python's min/max keep whichever comes first of a NaN and
    a number, so a NaN ratio would show as 1.0 or not by micro-batch order."""
    return math.nan if any(math.isnan(v) for v in values) else pick(values)


class UpdateStats:
    def __init__(self):
        self.iterations: list[dict] = []
        self.skipped = 0
        self.mismatch: dict[str, float] = defaultdict(float)
        self.correction: dict[str, float] = defaultdict(float)
        self.selection: dict[str, float] = defaultdict(float)
        self.masked: dict[str, float] = defaultdict(float)  # grpo.off_policy_mask_threshold, every iteration
        self.weighted: dict[str, float] = defaultdict(float)  # a sequence-weighting objective (vespo), every iteration
        self._new_iteration()

    def _new_iteration(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.ratio_mins: list[float] = []
        self.ratio_maxs: list[float] = []

    def add_mismatch(self, sums: dict) -> None:
        """One micro-batch's :func:`glm_grpo_ds.corrections.mismatch_sums` (tensors): summed, ``max`` maximised."""
        for key, value in sums.items():
            v = value.item()
            self.mismatch[key] = extreme(max, self.mismatch[key], v) if key == "max" else self.mismatch[key] + v

    def add_correction(self, sums: dict | None) -> None:
        """One micro-batch's :func:`glm_grpo_ds.corrections.correction_sums` (None: no sampler correction)."""
        if sums is None:
            return
        c = self.correction
        c["sum"] += sums["sum"].item()
        c["outside"] += sums["outside"].item()
        c["units"] += sums["units"].item()
        c["min"] = extreme(min, c.get("min", math.inf), sums["min"].item())
        c["max"] = extreme(max, c.get("max", -math.inf), sums["max"].item())

    def add_selection(self, selection: dict) -> None:
        """One micro-batch's top-entropy selection (update.policy_token_weights; empty: none)."""
        if not selection:
            return
        s = self.selection
        s["threshold"] += selection["threshold"].item()
        s["calls"] += 1
        s["kept"] += selection["kept"].item()
        s["tokens"] += selection["tokens"].item()

    def add(self, loss, loss_stats: dict, applied: bool | None) -> None:
        """One micro-batch's loss and :func:`glm_grpo_ds.grpo.policy_loss` stats; ``applied``: what
        glm_grpo_ds.ds.engine.step returned (False = the optimizer step was skipped)."""
        self.skipped += applied is False
        tokens = loss_stats["num_tokens"].item()
        self.sums["loss"] += loss.item()
        self.sums["tokens"] += tokens
        if "off_policy_masked" in loss_stats:
            self.masked["dropped"] += loss_stats["off_policy_masked"].item()
            self.masked["tokens"] += tokens
        if "sequence_weight_sum" in loss_stats:
            self.weighted["sum"] += loss_stats["sequence_weight_sum"].item()
            self.weighted["sequences"] += loss_stats["sequences"].item()
        for key in TOKEN_MEANS:
            self.sums[key] += loss_stats[key].item() * tokens
        self.ratio_mins.append(loss_stats["ratio_min"].item())
        self.ratio_maxs.append(loss_stats["ratio_max"].item())

    def end_iteration(self) -> None:
        tokens = max(self.sums["tokens"], 1.0)
        iteration = {key: self.sums[key] / tokens for key in TOKEN_MEANS}
        iteration.update(
            loss=self.sums["loss"],
            ratio_min=extreme(min, *self.ratio_mins),
            ratio_max=extreme(max, *self.ratio_maxs),
            tokens=self.sums["tokens"],
        )
        self.iterations.append(iteration)
        self._new_iteration()

    def result(self) -> dict:
        its = self.iterations
        out = {key: sum(it[key] for it in its) / len(its) for key in its[0]}
        out["ratio_min"] = extreme(min, *(it["ratio_min"] for it in its))
        out["ratio_max"] = extreme(max, *(it["ratio_max"] for it in its))
        out["iterations"] = its
        out["skipped"] = self.skipped
        n = max(self.mismatch["tokens"], 1.0)
        out["mismatch/logp_abs_mean"] = self.mismatch["abs"] / n
        out["mismatch/logp_abs_max"] = self.mismatch["max"]
        out["mismatch/kl_k3"] = self.mismatch["k3"] / n
        out["mismatch/frac_beyond"] = self.mismatch["beyond"] / n
        c = self.correction
        if c["units"]:  # grpo.sampler_correction: the raw weights pi_old / pi_sampler of the first iteration
            out["correction/weight_mean"] = c["sum"] / c["units"]
            out["correction/weight_min"], out["correction/weight_max"] = c["min"], c["max"]
            out["correction/outside_fraction"] = c["outside"] / c["units"]  # clipped (truncate) or zeroed (mask)
        sel = self.selection
        if sel["calls"]:  # grpo.top_entropy_quantile < 1: over every iteration's micro-batches
            out["top_entropy/threshold"] = sel["threshold"] / sel["calls"]
            out["top_entropy/kept_fraction"] = sel["kept"] / max(sel["tokens"], 1.0)
        if self.masked["tokens"]:  # grpo.off_policy_mask_threshold: the tokens of the sequences it took out
            out["off_policy/masked_fraction"] = self.masked["dropped"] / self.masked["tokens"]
        if self.weighted["sequences"]:  # grpo.objective vespo: the mean of its sequences' phi(w)
            out["sequence_weight_mean"] = self.weighted["sum"] / self.weighted["sequences"]
        return out

    @staticmethod
    def not_run(num_iterations: int) -> dict:
        nan = float("nan")
        iteration = dict.fromkeys(("loss", *TOKEN_MEANS, "ratio_min"), nan)
        iteration.update(ratio_max=nan, tokens=0.0)
        mismatch = dict.fromkeys(MISMATCH_KEYS, nan)
        return dict(iteration, iterations=[dict(iteration)] * num_iterations, skipped=num_iterations, **mismatch)
