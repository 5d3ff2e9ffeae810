"""What ``glm-grpo evaluate`` writes: the console table, ``evaluate.json``, the side-by-side gallery and the plot.

Per reward (and the weighted total when there are several) and per adapter: the base's and the adapter's
mean, the paired difference with its 95 % interval over prompts (evaluation/stats.py), the adapter's win rate over
prompts, and whether the adapter's run trained on that reward (in-domain) or not (out-of-domain: a gain
there is evidence the adapter generalises; a loss is what reward hacking looks like). The same broken down
by category when the prompts have one.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..observability.records import run_config
from .stats import family_level, paired_summary

EVALUATE_JSON = "evaluate.json"
GALLERY = "gallery.png"
PLOT = "evaluate.png"
TOTAL = "total"  # the weighted sum of the rewards, when there are several
DOMAIN = {True: "trained on", False: "out of domain", None: "? (no run config.json beside the adapter)"}


def weighted_sum(rewards: dict[str, torch.Tensor], weights: dict[str, float]) -> torch.Tensor:
    """``[P, K]`` sum_k w_k r_k, NaN where any reward is undefined. Training fills a failed reward from its group
    (advantages.weighted_total); here each model would fill it from its own samples, and a reward that timed out
    under one model only would move the paired total of two identical models. NaN leaves that sample out of the
    comparison under both (stats.paired_summary)."""
    return sum(weights[label] * values.double() for label, values in rewards.items())


def trained_rewards(adapter: str) -> list[dict] | None:
    """The rewards (``{"name", "args", ...}``) the run that wrote ``adapter`` trained on, from that run's
    ``config.json``; None when no run config is found."""
    found = run_config(adapter)
    rewards = None if found is None else found[1].get("rewards")
    if not isinstance(rewards, list):
        return None
    return [r if isinstance(r, dict) else {"name": str(r)} for r in rewards]


def _trained_on(spec: dict, trained: list[dict]) -> bool:
    """Whether the run trained on reward ``spec``: the same name with the same arguments (``ocr`` against another
    OCR model's text is another reward); the weight does not matter."""
    return any(t.get("name") == spec["name"] and (t.get("args") or {}) == (spec.get("args") or {}) for t in trained)


def run_alarms(adapter: str) -> dict | None:
    """What the image-statistics alarms did during the run that wrote ``adapter``
    (observability/records.py ``fired_alarms``); None when the run or its records are not found."""
    from ..observability.records import fired_alarms

    found = run_config(adapter)
    return None if found is None else fired_alarms(found[0])


def run_reward_failures(adapter: str) -> dict | None:
    """The rewards that failed on some samples during the run that wrote ``adapter`` (``{"file", "steps",
    "failed": {label: [[step, samples], ...]}}``, observability/closing.py's reading); None when no run is found."""
    from ..observability.closing import reward_failures
    from ..observability.records import read_metrics

    found = run_config(adapter)
    if found is None:
        return None
    metrics = found[0] / "metrics.jsonl"
    records = read_metrics(metrics) if metrics.is_file() else []
    failed = {label: [list(hit) for hit in hits] for label, hits in reward_failures(records).items()}
    return {"file": str(metrics), "steps": len(records), "failed": failed}


def reward_failure_lines(failures: dict[str, dict | None]) -> list[str]:
    """The console's lines under the table for the adapters whose run had a reward fail on some samples (those
    steps trained on the other rewards or were skipped): one per reward, in check-run's words; none otherwise."""
    from ..observability.closing import failure_phrase

    lines = []
    for name, found in failures.items():
        head = "reward failures during training" + ("" if len(failures) == 1 else f" ({name})")
        for label, hits in sorted((found or {}).get("failed", {}).items()):
            lines.append(f"{head}: {failure_phrase(label, [tuple(h) for h in hits], found['steps'])}")
    return lines


# why a reward's samples are undefined, and what to do, in both tables' lines
UNDEFINED_WHY = "the reward raised or returned NaN: its warning above; a rerun scores a batch it raised on again"


def undefined_lines(summary: dict) -> list[str]:
    """A line per (adapter, reward) whose reward this evaluation left undefined on some samples (it raised or
    returned NaN): those seeds are left out under both models, so its means rest on fewer samples."""
    lines = []
    for name, s in summary.items():
        for label, r in s["rewards"].items():
            base, model = r.get("undefined", (0, 0))
            if base or model:
                lines.append(
                    f"undefined: {label} on {base} of {r['samples']} base samples and {model} of {r['samples']} "
                    f"{name} samples ({UNDEFINED_WHY}); left out under both"
                )
    return lines


def alarm_lines(alarms: dict[str, dict | None]) -> list[str]:
    """The console's lines under the table: per adapter (``alarms``: its name -> :func:`run_alarms`) one line per
    alarm that fired during its run, or one saying none did or that its run's records were not found."""
    lines = []
    for name, found in alarms.items():
        head = "alarms" if len(alarms) == 1 else f"alarms ({name})"
        if found is None:
            lines.append(f"{head}: unknown, no run records beside the adapter (config.json, eval.jsonl, metrics.jsonl)")
        elif not found["fired"]:
            lines.append(f"{head}: none fired during training (rules: {'; '.join(found['rules']) or 'none'})")
        else:
            from ..monitoring.alarms import describe

            lines += [f"{head}: {describe(a)} ({found['file']})" for a in found["fired"]]
    return lines


def summarise(results: dict, adapters: dict[str, str], categories: list[str] | None, specs: list[dict]) -> dict:
    """``{adapter name: {"path", "trained_on", "rewards": {label: summary}, "categories": {...}}}``; ``specs``: the
    evaluated rewards (``{"name", "args", ...}``, in their order: labelled as ``build_rewards`` labels them)."""
    from ..rewards.registry import reward_labels
    from .paired import BASE

    base = results[BASE]
    by_label = dict(zip(reward_labels(specs), specs))
    out = {}
    for name, path in adapters.items():
        model = results[name]
        trained = trained_rewards(path)
        per_label = {
            label: {
                **paired_summary(base.rewards[label], model.rewards[label]),
                "trained_on": None if trained is None or label == TOTAL else _trained_on(by_label[label], trained),
            }
            for label in base.rewards
        }
        by_category = {}
        if categories is not None:
            level = family_level(len(set(categories)))  # a reward's categories are read together
            for cat in sorted(set(categories)):
                rows = torch.tensor([c == cat for c in categories])
                by_category[cat] = {
                    label: paired_summary(base.rewards[label][rows], model.rewards[label][rows], level)
                    for label in base.rewards
                }
        trained_names = None if trained is None else [t.get("name") for t in trained]
        out[name] = {"path": path, "trained_on": trained_names, "rewards": per_label, "categories": by_category}
    return out


def summarise_statistics(results: dict, adapters: dict[str, str]) -> dict:
    """``{adapter name: {statistic: paired summary}}``: each image statistic (monitoring/image_stats.py) of the
    adapter's images against the base's on the same prompts and seeds, with the rewards' interval over prompts, at
    the level of one of a family (all the statistics are read together)."""
    from .paired import BASE

    base = results[BASE]
    level = family_level(len(base.stats))
    return {
        name: {stat: paired_summary(base.stats[stat], results[name].stats[stat], level) for stat in base.stats}
        for name in adapters
    }


def _shown_path(path: str) -> str:
    """A path under the working directory relative to it (the console); evaluate.json keeps it absolute."""
    p = Path(path)
    return str(p.relative_to(Path.cwd())) if p.is_absolute() and p.is_relative_to(Path.cwd()) else path


def _num(x: float, spec: str = "+.4f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def interval_text(r: dict) -> str:
    """``[low, high]``, or ``too few prompts`` where there is no interval (evaluation/stats.py)."""
    if r.get("verdict") == "too few prompts":
        return "too few prompts"
    return f"[{_num(r['ci'][0])}, {_num(r['ci'][1])}]"


def table(summary: dict) -> str:
    """The console table (one block per adapter; categories indented under it), and a caveat line when an
    interval rests on fewer than :data:`~glm_grpo_ds.evaluation.stats.CAVEAT_BELOW` prompts."""
    from .stats import CAVEAT_BELOW, METHOD, MIN_PROMPTS

    lines = []
    head = (
        f"{'reward':<24} {'base':>9} {'adapter':>9} {'diff':>9} {'95% CI':>21} {'win rate':>8} {'prompts':>7}  domain"
    )
    caveat = few = signs = False
    for name, s in summary.items():
        other = "  (trained on another base model: see its warning)" if s.get("base_warning") else ""
        lines.append(f"{name}: {_shown_path(s['path'])}{other}")
        lines.append(head)
        for label, r in s["rewards"].items():
            domain = "weighted sum" if label == TOTAL else DOMAIN[r["trained_on"]]
            lines.append(
                f"{label:<24} {_num(r['base'], '.4f'):>9} {_num(r['model'], '.4f'):>9} {_num(r['diff']):>9} "
                f"{interval_text(r):>21} {_num(r['win_rate'], '.2f'):>8} {r['prompts']:>7}  {domain}"
            )
        for cat, per_label in s["categories"].items():
            for label, r in per_label.items():
                lines.append(
                    f"  {cat + ': ' + label:<22} {_num(r['base'], '.4f'):>9} {_num(r['model'], '.4f'):>9} "
                    f"{_num(r['diff']):>9} {interval_text(r):>21} {_num(r['win_rate'], '.2f'):>8} {r['prompts']:>7}"
                )
        rows = [*s["rewards"].values(), *(r for per in s["categories"].values() for r in per.values())]
        caveat |= any(r.get("caveat") for r in rows)
        few |= any(r.get("verdict") == "too few prompts" for r in rows)
        signs |= any(r.get("sign_test") and r["diff"] != 0 for r in rows)
    lines += undefined_lines(summary)
    if caveat:
        lines.append(
            f"95% CI: {METHOD}; with fewer than {CAVEAT_BELOW} prompts its level rests on the differences being "
            "roughly symmetric (docs/evaluate.md#intervals)"
        )
    if few:
        lines.append(f"too few prompts: no interval below {MIN_PROMPTS} prompts; evaluate more prompts")
    if signs:
        lines.append(
            "an interval with no width: every prompt moved by the same amount; whether that is a difference is the "
            "exact sign test's (3 of 3 prompts up: p = 0.25; 6 of 6 are needed)"
        )
    levels = {r["level"] for s in summary.values() for per in s["categories"].values() for r in per.values()}
    if levels:
        level, count = levels.pop(), len(next(iter(summary.values()))["categories"])
        lines.append(
            f"categories: each interval at {level:.1%} (Bonferroni over the {count} categories: all of a reward's "
            "together at 95%)"
        )
    return "\n".join(lines)


def base_table(rewards: dict[str, torch.Tensor]) -> str:
    """The console table of a base-only evaluation (no adapter): per reward the mean with its 95 % interval over
    prompts (evaluation/stats.py's, none below its minimum prompt count)."""
    from .stats import MIN_PROMPTS, mean_interval, prompt_means

    lines = ["base model only (no --adapter)", f"{'reward':<24} {'mean':>9} {'95% CI':>21} {'prompts':>7}"]
    for label, values in rewards.items():
        means = prompt_means(values)
        prompts = int((~torch.isnan(means)).sum())
        low, high = mean_interval(means)
        ci = "too few prompts" if prompts < MIN_PROMPTS else f"[{_num(low, '.4f')}, {_num(high, '.4f')}]"
        lines.append(f"{label:<24} {_num(torch.nanmean(means).item(), '.4f'):>9} {ci:>21} {prompts:>7}")
    for label, values in rewards.items():
        if undefined := int(torch.isnan(values).sum()):
            lines.append(
                f"undefined: {label} on {undefined} of {values.numel()} samples ({UNDEFINED_WHY}); left out of its mean"
            )
    return "\n".join(lines)


def shown_sample_rewards(results: dict, names: list[str], rows: int, label: str) -> list[float]:
    """The ``label`` reward of each image the galleries show (row-major: prompt ``i``, then each model of
    ``names``): the prompt's first sample's own reward, the one drawn in the tile (``ModelResult.thumbs``), not
    the mean over its K samples, which a tile of one sample would misattribute."""
    return [float(results[n].rewards[label][i, 0]) for i in range(rows) for n in names]


def write_gallery(path: Path, results: dict, names: list[str], prompts: list[str], label: str, max_prompts: int):
    """One row per prompt (at most ``max_prompts``): the base's first sample, then each adapter's (a column each,
    headed by the model's name), each captioned with its own ``label`` reward (:func:`shown_sample_rewards`)."""
    from ..observability.gallery import save_gallery

    rows = min(len(prompts), max_prompts)
    thumbs = torch.stack([results[n].thumbs[i] for i in range(rows) for n in names])
    captions = shown_sample_rewards(results, names, rows, label)
    return save_gallery(path, thumbs, prompts[:rows], captions, cols=len(names), headers=names)


def write_plot(path: Path, summary: dict) -> Path:
    """Paired differences with their intervals, one bar per (adapter, reward)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"{name}\n{label}", r) for name, s in summary.items() for label, r in s["rewards"].items()]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(bars)), 3.5))
    for i, (_, r) in enumerate(bars):
        low, high = r["ci"]
        colour = "C2" if r["ci_excludes_0"] and r["diff"] > 0 else "C3" if r["ci_excludes_0"] else "C7"
        ax.bar(i, r["diff"], color=colour)
        if not (math.isnan(low) or math.isnan(high)):
            ax.errorbar(i, r["diff"], yerr=[[r["diff"] - low], [high - r["diff"]]], color="k", capsize=4)
    ax.axhline(0, color="k", linewidth=0.8)
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize="small")
    ax.set_ylabel("adapter - base (95 % CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
