"""The sections of a run's model card (model_card.py) read from the run's own files: the results from
``metrics.jsonl`` / ``eval.jsonl`` (steps done, the training reward of the last step and of the first / last
:data:`WINDOW` steps, the first and last eval reward), the image-statistics alarms that fired
(monitoring/alarms.py), the training settings from ``config.json`` (GRPO group size, beta, learning rate,
LoRA r / alpha, ZeRO stage, world size, ...) with the rewards and their weights, the training data, the
settings a resume changed and the framework versions. merged_card.py reuses the results, alarms and
training sections of an adapter's card.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..config.fields import is_repo_id
from ..config.redact import redacted
from ..monitoring.alarms import describe
from ..observability.closing import failure_phrase, reward_failures
from ..observability.records import fired_alarms, read_metrics, reward_means
from ..runtime.versions import NOT_INSTALLED

WINDOW = 10  # steps averaged for the "last steps" training reward (a single step's reward is noisy)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def run_results(run_dir: str | os.PathLike, step: int | None = None) -> dict:
    """The numbers a card reports, from ``metrics.jsonl`` / ``eval.jsonl`` (records up to ``step`` when
    given): ``steps_done``, ``final_train_reward`` (the last step's ``reward_mean``), ``last_window_reward``
    / ``first_window_reward`` (mean of the last / first ``WINDOW`` steps with a reward), ``final_rewards``
    ({label: last step's value}), ``first_eval`` / ``final_eval`` ((step, eval reward) or None), ``recorded_steps``
    (the records read) and ``reward_failures`` (observability/closing.py's, over them)."""
    run = Path(run_dir)
    rows = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
    evals = read_metrics(run / "eval.jsonl") if (run / "eval.jsonl").is_file() else []
    if step is not None:
        rows = [r for r in rows if r["step"] <= step]
        evals = [e for e in evals if e["step"] <= step]
    rewards = [r["reward_mean"] for r in rows if r.get("reward_mean") is not None]
    last = rows[-1] if rows else {}
    labelled = reward_means(last)
    evals = [e for e in evals if e.get("eval/reward_mean") is not None]
    return {
        "steps_done": last.get("step", 0),
        "final_train_reward": last.get("reward_mean"),
        "last_window_reward": _mean(rewards[-WINDOW:]),
        "first_window_reward": _mean(rewards[:WINDOW]),
        "rewarded_steps": len(rewards),
        "final_rewards": labelled,
        "first_eval": (evals[0]["step"], evals[0]["eval/reward_mean"]) if evals else None,
        "final_eval": (evals[-1]["step"], evals[-1]["eval/reward_mean"]) if evals else None,
        "recorded_steps": len(rows),
        "reward_failures": reward_failures(rows),
    }


def _world_and_stage(ds: dict) -> tuple[int | None, int | None]:
    per_rank = ds.get("train_micro_batch_size_per_gpu", 0) * ds.get("gradient_accumulation_steps", 0)
    world = ds["train_batch_size"] // per_rank if per_rank and "train_batch_size" in ds else None
    return world, ds.get("zero_optimization", {}).get("stage")


def _table(rows: list[tuple[str, object]]) -> str:
    return "\n".join(["| | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def results_section(res: dict, cfg: dict, labels: list[str]) -> list[str]:
    done, planned = res["steps_done"], cfg["max_steps"]
    # resumed past a max_steps lowered below its checkpoint: no "80 of 60"
    rows = [("steps done", f"{done} of {planned}" if done <= planned else f"{done} (max_steps lowered to {planned})")]
    rows.append(("final training reward (last step, mean over its samples)", _fmt(res["final_train_reward"])))
    if res["rewarded_steps"] >= 2 * WINDOW:  # the first and last windows do not overlap
        rows.append(
            (
                f"training reward, mean of the first -> last {WINDOW} steps",
                f"{_fmt(res['first_window_reward'])} -> {_fmt(res['last_window_reward'])}",
            )
        )
    if len(labels) > 1:
        rows += [(f"final training reward: {label}", _fmt(res["final_rewards"].get(label))) for label in labels]
    if res["final_eval"] is not None and res["first_eval"] != res["final_eval"]:
        (s0, r0), (s1, r1) = res["first_eval"], res["final_eval"]
        rows.append((f"eval reward (fixed seeds), step {s0} -> step {s1}", f"{_fmt(r0)} -> {_fmt(r1)}"))
    elif res["final_eval"] is not None:
        at = res["final_eval"][0]
        when = f"at step {at}" + (" (before training: the base model's)" if at == 0 else "")
        rows.append((f"eval reward (fixed seeds) {when}", _fmt(res["final_eval"][1])))
    else:
        rows.append(("eval reward", "no evaluation (eval.file unset)"))
    return ["## Results", "", _table(rows), ""]


def alarms_section(run: Path, step: int | None) -> list[str]:
    """The image-statistics alarms of the run (up to ``step``): one item per rule that fired, or a line saying
    none did; nothing when its records hold no image statistics (monitor.statistics: [])."""
    alarms = fired_alarms(run, step)
    if alarms is None:
        return []
    rules = "; ".join(f"`{rule}`" for rule in alarms["rules"]) or "none"
    if not alarms["fired"]:
        return ["## Alarms", "", f"No image-statistics alarm fired during training (rules: {rules}).", ""]
    return [
        "## Alarms",
        "",
        f"Image-statistics alarms that fired during training (rules: {rules}): a sign the images changed in a way "
        "the reward may not see (reward hacking, collapse); look at the samples before trusting the reward.",
        "",
        *(f"- {describe(a)}" for a in alarms["fired"]),
        "",
    ]


def reward_failures_section(res: dict) -> list[str]:
    """The rewards that raised on some samples during training (``res``: :func:`run_results`, up to its step): those
    steps trained on the other rewards, or were skipped. Nothing when every reward scored every sample."""
    failed = res["reward_failures"]
    if not failed:
        return []
    return [
        "## Reward failures",
        "",
        "Rewards that raised on some samples during training: their samples were left out of those steps' "
        "advantages, so those steps trained on the other rewards (or were skipped).",
        "",
        *(f"- {failure_phrase(label, hits, res['recorded_steps'])}" for label, hits in sorted(failed.items())),
        "",
    ]


_OBJECTIVE_WORDS = {
    "clip": "clipped surrogate",
    "cispo": "CISPO's capped, detached importance weights",
    "sapo": "SAPO's soft gate",
    "vespo": "VESPO's gamma-weighted sequences",
}


def _objective_row(g: dict) -> tuple[str, str]:
    """The card's row of the policy term's numbers (runs before grpo.objective existed clipped)."""
    objective = g.get("objective", "clip")
    if objective == "cispo":
        return "CISPO weight cap", str(g["cispo_max"])
    if objective == "sapo":
        return "SAPO temperatures positive / negative", f"{g['sapo_temperature_pos']} / {g['sapo_temperature_neg']}"
    if objective == "vespo":
        pos, neg = f"{g['vespo_k_pos']}, {g['vespo_lambda_pos']}", f"{g['vespo_k_neg']}, {g['vespo_lambda_neg']}"
        return "VESPO k, lambda positive / negative", f"{pos} / {neg}"
    return "clip epsilon low / high", f"{g['epsilon_low']} / {g['epsilon_high']}"


def _updates(g: dict, batch: dict) -> str:
    """Optimizer steps per rollout: num_iterations, times the mini-batches when there are several."""
    mini = batch.get("mini_batches", 1)  # runs before batch.mini_batches had one
    return (
        str(g["num_iterations"])
        if mini == 1
        else f"{g['num_iterations'] * mini} ({g['num_iterations']} x {mini} mini-batches)"
    )


def training_section(cfg: dict, ds: dict, labels: list[str]) -> list[str]:
    g, o, lora = cfg["grpo"], cfg["optimizer"], cfg.get("lora")
    world, stage = _world_and_stage(ds)
    rows = [
        (
            "method",
            f"GRPO (group-relative advantages, {_OBJECTIVE_WORDS[g.get('objective', 'clip')]}, k3 KL to the "
            "frozen reference)",
        ),  # fmt: skip
        ("group size G", g["group_size"]),
        ("beta (KL)", g["beta"]),
        _objective_row(g),
        ("updates per rollout", _updates(g, cfg.get("batch", {}))),
        (
            "loss aggregation / advantage estimator",
            f"{g['aggregation']} / {g.get('advantage_estimator', g.get('advantage_scale'))}",
        ),
        ("optimizer, learning rate", f"{o['name']}, {o['lr']} ({o['schedule']}, warmup {o['warmup_steps']})"),
        ("steps", cfg["max_steps"]),
        ("prompts per step", None if world is None else world * cfg["batch"]["prompts_per_rank"]),
        ("image size", f"{cfg['rollout']['width']}x{cfg['rollout']['height']}"),
        (
            "fine-tuning",
            "full"
            if lora is None
            else f"LoRA r={lora['r']}, alpha={lora['alpha']}, dropout={lora['dropout']}, "
            f"modules {', '.join(lora['target_modules'])}",
        ),
        ("DeepSpeed ZeRO stage", stage),
        ("world size (ranks)", world),
        ("seed", cfg["seed"]),
    ]
    sampling = g.get("sampling", {})
    rows.append(("sampling", ", ".join(f"{k} {v}" for k, v in sampling.items())))
    lines = ["## Training", "", _table([(k, _fmt(v)) for k, v in rows]), "", "Rewards:", ""]
    lines += ["| reward | weight | arguments |", "|---|---|---|"]
    for label, spec in zip(labels, cfg["rewards"]):
        args = ", ".join(f"{k}={v}" for k, v in redacted(spec.get("args", {})).items()) or "-"  # the card is public
        lines.append(f"| {label} | {spec['weight']} | {args} |")
    if len(labels) > 1:
        lines += ["", f"Combined with `{g['reward_combination']}`."]
    return [*lines, ""]


def data_lines(saved: dict) -> list[str]:
    """The training data: the file or Hub dataset (with its revision) and its number of prompts, from
    config.json (runs before data fingerprints were recorded: the configured source only)."""
    data = saved["train"]["data"]
    source = data["train_file"]
    rows = (saved.get("data") or {}).get("rows")
    where = (
        f"[{source}](https://huggingface.co/datasets/{source})"
        + (f", revision `{data['revision']}`" if data.get("revision") else "")
        if is_repo_id(source) and not os.path.exists(source)
        else f"`{source}`"
    )
    return [f"- training data: {where}" + (f", {rows} prompts" if rows is not None else "")]


def versions_section(saved: dict) -> list[str]:
    """The framework versions the run trained with (config.json's ``versions``), as TRL's cards list them."""
    versions = {k: v for k, v in (saved.get("versions") or {}).items() if v != NOT_INSTALLED}
    if not versions:
        return []
    return ["## Framework versions", "", *(f"- {name}: {v}" for name, v in versions.items()), ""]


def segments_lines(saved: dict) -> list[str]:
    """Which steps ran with what, when a resume changed settings (config.json's ``segments``,
    glm_grpo_ds/lifecycle/resume.py); nothing for a run trained with one set of settings. The training section
    above gives the last segment's settings."""
    later = [seg for seg in saved.get("segments") or [] if seg.get("changed")]
    if not later:
        return []
    lines = ["Settings changed during training (the values above are the last ones):", ""]
    for seg in later:
        changed = ", ".join(f"`{key}` {old!r} -> {new!r}" for key, (old, new) in seg["changed"].items())
        lines.append(f"- from step {seg['from_step'] + 1}: {changed}")
    return [*lines, ""]
