"""Settings a training run accepts and does not act on, said rather than refused (a run is often a short try of a
longer plan: a warmup longer than the run; a checkpoint limit kept while checkpoints are off). ``train --check``
prints them as notes and rank 0 logs them as warnings at start (alarms that cannot fire with one evaluation
too: evaluating once is a choice, fail_on_alarm counting on them is the surprise). What can mean nothing anywhere
is refused by ``TrainConfig.validate``; eval.* without eval.file and hub.* without hub.repo_id are neither
(``glm-grpo evaluate`` and ``glm-grpo push`` read them; the shipped configs keep an eval section ready).

    for line in unused_settings(cfg): ...
"""

from __future__ import annotations

from pathlib import Path

from .fields import default_of
from .objective_rules import OBJECTIVE_READS

ONE_FILE = (".txt", ".jsonl", ".parquet", ".csv", ".json")  # one prompt file: one split (data/__init__.py)


def unused_settings(cfg) -> list[str]:
    """One line per setting of ``cfg`` (a TrainConfig) this run will not act on."""
    lines = []
    if cfg.save_steps == 0 and cfg.save_total_limit != default_of(cfg, "save_total_limit"):
        lines.append(
            f"save_steps=0: this run saves no checkpoint (save_total_limit={cfg.save_total_limit} prunes nothing)"
        )
    if cfg.data.split != default_of(cfg.data, "split"):
        lines += _split_unused(Path(cfg.data.train_file), f"data.split={cfg.data.split}")
    ev = cfg.eval
    if ev.file and ev.split != default_of(ev, "split"):
        lines += _split_unused(Path(ev.file), f"eval.split={ev.split}")
    if ev.file and cfg.monitor.alarms and _evaluations(ev, cfg.max_steps) < 2:
        lines.append(
            "monitor.alarms compare each evaluation with the first, and this run evaluates once (eval.steps="
            f"{ev.steps}, eval.at_start={str(ev.at_start).lower()}): they cannot fire; set eval.steps=N or "
            "eval.at_start=true"
        )
    lines += _clip_range_unused(cfg.grpo)
    steps = cfg.total_optimizer_steps
    if cfg.optimizer.warmup_steps >= steps:
        lines.append(
            f"optimizer.warmup_steps={cfg.optimizer.warmup_steps} is not shorter than the run's {steps} optimizer "
            f"steps: the learning rate never reaches optimizer.lr={cfg.optimizer.lr:g}"
        )
    return lines


def _split_unused(source: Path, given: str) -> list[str]:
    """A split (``given``: data.split=S or eval.split=S) of a source of one split: one file, or a saved Dataset (not a
    DatasetDict)."""
    if source.suffix in ONE_FILE and not source.is_dir():
        return [f"{given} on one {source.suffix} file, which has no splits"]
    if (source / "state.json").is_file() and not (source / "dataset_dict.json").is_file():
        return [f"{given} on {source}, a saved Dataset (not a DatasetDict), which has no splits"]
    return []


def _clip_range_unused(grpo) -> list[str]:
    """The clip range given to an objective that has none (the shipped configs set it for the default, clip)."""
    keys = [key for key in ("epsilon_low", "epsilon_high") if getattr(grpo, key) != default_of(grpo, key)]
    if grpo.objective == "clip" or not keys:
        return []
    given = ", ".join(f"grpo.{key}={getattr(grpo, key)}" for key in keys)
    return [
        f"{given}: the clip objective's range; grpo.objective={grpo.objective} reads {OBJECTIVE_READS[grpo.objective]}"
    ]


def _evaluations(ev, max_steps: int) -> int:
    """How many evaluations a run of ``max_steps`` makes: step 0 (eval.at_start), every eval.steps, the last step."""
    every = max_steps // ev.steps if ev.steps > 0 else 0
    last = 0 if ev.steps > 0 and max_steps % ev.steps == 0 else 1
    return int(ev.at_start) + every + last
