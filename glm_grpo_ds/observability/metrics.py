"""A step's records and what they measure: timers and peak memory, the progress display on rank 0 (other ranks
get no-op objects, so the training loop never branches on rank), the fields of a record. Writing and reading the
JSON-lines files is records.py's; experiment trackers are in tracking.py, the plots in plot.py.
:func:`step_record` builds a training step's record from the update's per-rank statistics (two collectives for all
of them, see glm_grpo_ds/ds/dist.py)."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass

import torch

from ..ds import dist
from ..runtime import log, oom
from ..runtime.memory_probe import phase_peak, run_peak_bytes
from .step_status import NAME, NO_STATUS


@contextlib.contextmanager
def timer(timings: dict[str, float], name: str):
    """``timings[name]`` = wall seconds spent inside the block, the block's CUDA work included."""
    _sync_cuda()
    start = time.perf_counter()
    try:
        yield
    finally:
        _sync_cuda()
        timings[name] = time.perf_counter() - start


def _sync_cuda() -> None:
    # CUDA kernels run after their launch returns: without waiting, a phase would be timed by its launches. This
    # thread's stream, not the device: a device synchronize during rollout.one_step_off's graph capture on its thread
    # is invalid in every capture mode (CUDA error 900, the capture lost), and that thread's stream is not this phase's.
    if torch.cuda.is_initialized():
        torch.cuda.current_stream().synchronize()


@contextlib.contextmanager
def measure(timings: dict[str, float], peaks: dict[str, float], name: str, device: torch.device):
    """:func:`timer` and the block's peak memory: ``peaks["memory/<name>_peak_mb"]``
    (glm_grpo_ds/runtime/memory_probe.py). An out-of-memory error leaving the block is marked with ``name``, its
    phase (glm_grpo_ds/runtime/oom.py), for the run's line about it."""
    with oom.marking(phase=name), phase_peak(peaks, f"memory/{name}_peak_mb", device), timer(timings, name):
        yield


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated (CUDA) or peak resident set size of this process (CPU) over the whole
    run (loading included), in MB."""
    return run_peak_bytes(device) / 2**20


class Progress:
    """Progress on rank 0: step, reward, KL, loss, elapsed time and ETA.

    On a terminal: a tqdm bar (its ``[elapsed<remaining]`` is the ETA). When stderr is not a
    terminal (log files, SLURM, the ``deepspeed`` launcher piping output) tqdm's carriage-return
    redraws would become one log line per refresh, so instead one compact line is printed at the
    first step, every ``every`` steps and at the last step. The run's log file (``logs/rank_<r>.log``,
    runtime/run_log.py) gets that line at every step, on every rank, bar or not: the record of when each
    step ended, for the post-mortem of a slow or stuck run.

    ``status`` (glm_grpo_ds/observability/step_status.py): where the running step is, shown in the bar's
    description, or as lines between the step lines (the interval counts from the last step line).
    """

    def __init__(self, total: int, initial: int, enabled: bool, every: int = 10, stream=None, status=NO_STATUS):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.initial, self.every = total, initial, every
        self.bar, self.lines, self.status = None, False, status
        self.t0 = time.perf_counter()
        if enabled and self.stream.isatty():
            from tqdm import tqdm

            status.idle()  # a status line of its own (the load's) goes first: the bar takes the line
            self.bar = tqdm(total=total, initial=initial, desc=NAME, unit="step", file=self.stream, dynamic_ncols=True)
            status.show_in(self.bar)
        elif enabled:
            self.lines = True

    def update(self, record: dict) -> None:
        def fmt(key: str, spec: str) -> str:  # None: undefined reward / skipped non-finite step
            return "n/a" if record.get(key) is None else format(record[key], spec)

        stats = dict(
            reward=fmt("reward_mean", ".4g"),
            kl=fmt("kl", ".3g"),
            loss=fmt("loss", ".3g"),
            entropy=fmt("entropy", ".3g"),
        )
        from tqdm import tqdm

        step = record["step"]
        elapsed = time.perf_counter() - self.t0
        per_step = elapsed / max(1, step - self.initial)
        line = (
            f"grpo step {step}/{self.total} "
            + " ".join(f"{k} {v}" for k, v in stats.items())
            + f" | {per_step:.2f} s/step, elapsed {tqdm.format_interval(elapsed)}, "
            f"eta {tqdm.format_interval(per_step * (self.total - step))}"
        )
        log.to_file(line)
        self.status.idle()
        if self.bar is not None:
            self.bar.set_postfix(**stats)
            self.bar.update(1)
        elif self.lines:
            if step % self.every and step != self.total and step != self.initial + 1:
                return
            print(line, file=self.stream, flush=True)
            self.status.printed()

    def close(self) -> None:
        if self.bar is not None:
            self.status.idle()
            self.status.show_in(None)
            self.bar.close()


def nan_mean(values: torch.Tensor) -> float | None:
    """Mean of the defined (non-NaN) values; None when there are none."""
    mean = torch.nanmean(values).item()
    return None if math.isnan(mean) else mean


def disagreement_fields(disagreement: torch.Tensor | None, gate: float | None) -> dict:
    """A step's record of its rewards' disagreement (advantages.reward_disagreement, over the global batch):
    ``rewards/disagreement`` (mean) and ``rewards/disagreement_max``, with ``grpo.disagreement_gate`` also
    ``rewards/gated_fraction`` (the share of samples whose advantage it zeroed). ``{}`` with one reward."""
    if disagreement is None:
        return {}
    defined = disagreement[~torch.isnan(disagreement)]
    fields = {
        "rewards/disagreement": nan_mean(disagreement),
        "rewards/disagreement_max": defined.max().item() if defined.numel() else None,
    }
    if gate is not None:
        fields["rewards/gated_fraction"] = (disagreement > gate).float().mean().item()
    return fields


def advantage_fields(advantages: torch.Tensor) -> dict:
    """A step's record of the advantages the update trains on (``[N]``, the global batch's: every rank computes
    the same tensor from the all-gathered rewards, so no collective is needed): ``advantages/mean`` and
    ``advantages/std`` (unbiased, like ``reward_std``; None with fewer than two samples). Zeros of constant or
    undefined groups count. With the ``group`` estimator the mean is 0 up to rounding (each group is centred)
    and the std is ~1 when every group has a reward spread, lower as groups teach nothing; a mean away from 0
    or a std far above 1 says the estimator or a reward misbehaves (the seeds' plan logged both)."""
    return {"advantages/mean": nan_mean(advantages), "advantages/std": nan_std(advantages)}


def nan_std(values: torch.Tensor) -> float | None:
    defined = values[~torch.isnan(values)]
    return defined.std().item() if defined.numel() > 1 else None


def image_record(
    images: torch.Tensor, group_size: int, names: list[str], real: int | None = None, distance=None
) -> dict:
    """Collective: ``images/<statistic>`` and ``images/<statistic>_spread`` over every rank's ``images``
    (``[n, 3, H, W]``, groups of ``group_size``; monitoring/image_stats.py), the first ``real`` gathered samples
    only when given (the evaluation's padding dropped), and ``time/image_stats`` (this rank's computation).
    ``distance``: the lpips reward's (``RewardSet.pair_distance``), for ``lpips_diversity``, left out without one.
    ``{}`` when ``names`` is empty (monitor.statistics: [])."""
    from ..monitoring.image_stats import computable, sample_table, summarize

    names = computable(names, distance)
    if not names:
        return {}
    fields: dict = {}
    with timer(fields, "time/image_stats"):
        table = sample_table(images, group_size, names, distance)
    gathered = dist.all_gather(table)
    return {**summarize(names, gathered if real is None else gathered[:real]), **fields}


def finite_or_none(x: float | None) -> float | None:
    """JSON has no NaN / inf: a non-finite statistic is written as null."""
    return x if x is not None and math.isfinite(x) else None


# update statistics averaged over ranks (each rank's value is already a mean over its tokens)
# written when the run uses them: the sampler correction's raw weights, the top-entropy selection (update_stats.py)
_OPTIONAL_MEANS = (
    "correction/weight_mean",
    "correction/outside_fraction",
    "top_entropy/threshold",
    "top_entropy/kept_fraction",
    "off_policy/masked_fraction",
    "sequence_weight_mean",
    "entropy_coef",
    "entropy_control/coef",
)
_MEAN_OVER_RANKS = (
    "loss",
    "kl",
    "clip_frac_low",
    "clip_frac_high",
    "ratio_mean",
    "entropy",
    "mismatch/logp_abs_mean",
    "mismatch/kl_k3",
    "mismatch/frac_beyond",
)


@dataclass
class StepFacts:
    """What the trainer knows of a step besides the update's statistics: the record's run-level fields."""

    dead_groups: torch.Tensor  # [measured groups] True where the group's advantages are all 0 (advantages.py)
    prompts_skipped: int  # dead prompts passed over to pick this step's (data.dead_prompt_skip_prob)
    dead_prompts: int | None  # prompts known dead so far; None when not tracked
    skipped_before: int  # optimizer steps skipped before this step
    lr: float
    grad_norm: float | None  # None when no update ran (the engine's norm would be the previous step's)
    before_load_mb: float | None  # this rank's memory before the models loaded, when measured


def step_record(
    step: int,
    stats: dict,
    all_rewards: torch.Tensor,
    all_per_reward: dict[str, torch.Tensor],
    failed: dict[str, int],
    timings: dict[str, float],
    peaks: dict[str, float],
    generated_tokens: int,
    num_iterations: int,
    device: torch.device,
    facts: StepFacts | None = None,
) -> dict:
    """One ``metrics.jsonl`` object for ``step`` (1-based), the one place that builds it (``facts``: the run-level
    fields, :class:`StepFacts`; left out by the unit tests of the statistics). ``stats``: this rank's
    :func:`glm_grpo_ds.update.grpo_update` result; ``all_rewards`` / ``all_per_reward``: the gathered
    global batch; ``failed``: this rank's count of samples per reward whose reward raised;
    ``timings``: this rank's seconds of ``rollout``, ``decode``, ``reward``, ``update`` (the record has each
    phase's max over ranks, and its tokens/s from them); ``peaks``: this rank's
    ``memory/<phase>_peak_mb`` of those phases (:func:`measure`; the record has the max over ranks);
    ``generated_tokens``: over
    all ranks. Collective: every rank calls it, and gets the same record."""
    memory_key = "peak_gpu_memory_mb" if device.type == "cuda" else "peak_rss_mb"
    # present on every rank alike (grpo.sampler_correction / grpo.top_entropy_quantile are run-wide settings)
    optional = [key for key in _OPTIONAL_MEANS if key in stats]
    sums, maxima = _rank_values(stats, optional, failed, peaks, memory_key, device)
    # each phase's slowest rank (a slow reward on one rank is that phase's time; the others wait in the next gather)
    maxima.update({f"time/{phase}": float(seconds) for phase, seconds in timings.items()})
    total, top = dist.reduce_stats(sums, maxima)
    timings = {phase: top[f"time/{phase}"] for phase in timings}
    world = dist.world_size()
    record = {
        "step": step,
        "skipped": int(top["skipped"]),
        "reward_mean": nan_mean(all_rewards),
        "reward_std": nan_std(all_rewards),
    }
    record.update({key: finite_or_none(total[key] / world) for key in _MEAN_OVER_RANKS})
    record["ratio_min"] = finite_or_none(-top["-ratio_min"])
    record["ratio_max"] = finite_or_none(top["ratio_max"])
    record["first_iteration_ratio_min"] = finite_or_none(-top["-first_ratio_min"])
    record["first_iteration_ratio_max"] = finite_or_none(top["first_ratio_max"])
    record["mismatch/logp_abs_max"] = finite_or_none(top["mismatch/logp_abs_max"])
    record.update({key: finite_or_none(total[key] / world) for key in optional})
    if "correction/weight_max" in top:
        record["correction/weight_min"] = finite_or_none(-top["-correction/weight_min"])
        record["correction/weight_max"] = finite_or_none(top["correction/weight_max"])
    record.update({f"time/{phase}": seconds for phase, seconds in timings.items()})
    record["rollout_tokens_per_s"] = generated_tokens / max(timings["rollout"], 1e-9)
    record["update_tokens_per_s"] = generated_tokens * num_iterations / max(timings["update"], 1e-9)
    record[memory_key] = top[memory_key]
    record.update({key: top[key] for key in sorted(peaks)})
    _add_rewards(record, all_per_reward, total)
    if facts is not None:
        _add_facts(record, facts)
    return record


def _rank_values(
    stats: dict, optional: list[str], failed: dict[str, int], peaks: dict[str, float], memory_key: str, device
) -> tuple[dict[str, float], dict[str, float]]:
    """This rank's ``(sums, maxima)`` for :func:`~glm_grpo_ds.ds.dist.reduce_stats`: what the record averages
    over ranks, and what it takes the max of (a min as the max of its negation)."""
    sums = {key: float(stats[key]) for key in _MEAN_OVER_RANKS}
    sums.update({key: float(stats[key]) for key in optional})
    sums.update({f"failed/{label}": float(n) for label, n in failed.items()})
    first = stats.get("iterations", [stats])[0]  # ratio must be exactly 1 there (old log-probs = these)
    maxima = {
        "skipped": float(stats["skipped"]),
        "ratio_max": float(stats["ratio_max"]),
        "-ratio_min": -float(stats["ratio_min"]),
        "first_ratio_max": float(first["ratio_max"]),
        "mismatch/logp_abs_max": float(stats["mismatch/logp_abs_max"]),
        "-first_ratio_min": -float(first["ratio_min"]),
        memory_key: peak_memory_mb(device),
        **peaks,
    }
    if "correction/weight_max" in stats:
        maxima.update(
            {
                "correction/weight_max": stats["correction/weight_max"],
                "-correction/weight_min": -stats["correction/weight_min"],
            }
        )
    return sums, maxima


def _add_rewards(record: dict, all_per_reward: dict[str, torch.Tensor], total: dict[str, float]) -> None:
    """Each reward's mean, std and undefined count over the global batch, and its failures summed over ranks."""
    for label, values in all_per_reward.items():
        record[f"reward/{label}"] = nan_mean(values)
        record[f"reward/{label}_std"] = nan_std(values)
        record[f"reward/{label}_undefined"] = int(torch.isnan(values).sum())
        # samples whose reward raised (a subset of _undefined), summed over ranks
        record[f"reward/{label}_failed"] = int(total[f"failed/{label}"])


def _add_facts(record: dict, facts: StepFacts) -> None:
    """The run-level fields of :class:`StepFacts`."""
    if facts.before_load_mb is not None:
        record["memory/before_load_mb"] = facts.before_load_mb
    # TRL's name (docs/training.md): the share of the measured groups (none measured: null)
    dead = facts.dead_groups
    record["frac_reward_zero_std"] = dead.float().mean().item() if dead.numel() else None
    record["prompts_skipped"] = facts.prompts_skipped
    if facts.dead_prompts is not None:
        record["dead_prompts"] = facts.dead_prompts
    # DeepSpeed decides a skip from the all-reduced gradient norm (same on every rank); the record's max over
    # ranks makes the agreement explicit
    record.update(
        skipped_steps=facts.skipped_before + record["skipped"],
        lr=facts.lr,
        grad_norm=finite_or_none(facts.grad_norm),
    )
