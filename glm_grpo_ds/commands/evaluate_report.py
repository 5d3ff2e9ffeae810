"""``glm-grpo evaluate``'s outputs besides the console: each batch's benchmark exports as it is sampled
(:func:`export_hook`), every rank's results joined on rank 0 (:func:`gather_results`), and rank 0's report
(:func:`write_report`: gallery.png, evaluate.png, each export's export.json, report.html and evaluate.json's
content; the pieces are in glm_grpo_ds/evaluation/report.py and html_report.py). The command:
glm_grpo_ds/commands/evaluate.py."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def gather_results(results: dict, names: list[str]) -> dict | None:
    """Every rank's results joined in rank order on rank 0 (None on the others); one process: unchanged."""
    from ..ds import dist

    if not dist.active():
        return results
    mine = {name: (results[name].rewards, results[name].thumbs, results[name].stats) for name in names}
    parts = dist.all_gather_object(mine)
    if dist.rank() != 0:
        return None
    for name in names:
        shares = [part[name] for part in parts if part[name][1] is not None and part[name][1].shape[0]]
        results[name].rewards = {label: torch.cat([s[0][label] for s in shares]) for label in shares[0][0]}
        results[name].thumbs = torch.cat([s[1] for s in shares])
        results[name].stats = {stat: torch.cat([s[2][stat] for s in shares]) for stat in shares[0][2]}
    return results


def export_hook(a, rows, size: tuple[int, int]):
    """``on_images(name, chunk, images)`` writing each batch in every ``--export`` layout (the files it wrote are
    recorded with the batch: evaluation/paired.py); the rows are checked for each layout's field first."""
    from ..evaluation.exports import EXPORTERS, check_rows

    k = a.samples_per_prompt
    for layout, _ in a.export:
        check_rows(layout, rows, k, size)

    def on_images(name, chunk, images):
        return [path for layout, d in a.export for path in EXPORTERS.get(layout)(Path(d), name, chunk, images, k)]

    return on_images


def write_report(a, results, settings, rows, adapter_names, adapters, weights, base_warnings=None) -> dict:
    """Rank 0: the weighted total, the summary, gallery.png, evaluate.png, each export's export.json and
    report.html; returns evaluate.json's content."""
    from ..evaluation.html_report import REPORT, write_html
    from ..evaluation.paired import BASE
    from ..evaluation.report import (
        GALLERY,
        PLOT,
        TOTAL,
        base_table,
        run_alarms,
        run_reward_failures,
        summarise,
        summarise_statistics,
        table,
        weighted_sum,
        write_gallery,
        write_plot,
    )
    from ..evaluation.stats import CAVEAT_BELOW, LEVEL, METHOD, MIN_PROMPTS, prompt_means

    if len(weights) > 1:
        for result in results.values():
            result.rewards[TOTAL] = weighted_sum(result.rewards, weights)
    has_categories = any(row.extra.get(a.category_key) is not None for row in rows)
    categories = [str(row.extra.get(a.category_key)) for row in rows] if has_categories else None
    named = dict(zip(adapter_names, adapters))
    summary = summarise(results, named, categories, settings["rewards"])
    for name, warning in (base_warnings or {}).items():
        summary[name]["base_warning"] = warning  # trained on another base model (adapters.other_base), or None
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    first_label = TOTAL if TOTAL in results[BASE].rewards else next(iter(results[BASE].rewards))
    names = [BASE, *adapter_names]
    write_gallery(out / GALLERY, results, names, [row.prompt for row in rows], first_label, a.gallery_prompts)
    if adapter_names:
        write_plot(out / PLOT, summary)
    for layout, export_dir in a.export:
        record = {**settings, "layout": layout, "models": {BASE: settings["model"], **named}}
        if layout == "dpg":
            record["dpg_resolution"] = settings["image"][0]  # compute_dpg_bench.py --resolution (one tile's side)
        Path(export_dir).mkdir(parents=True, exist_ok=True)
        (Path(export_dir) / "export.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    record = {
        **settings,
        # how it was asked for (not part of the resume check: an override that changes no figure is no other run)
        "invocation": {"config": a.config, "model_flag": a.model, "rewards_flag": a.rewards, "overrides": a.overrides},
        "adapters": named,
        # over prompts, each prompt's samples first, as the table's
        "base": {label: torch.nanmean(prompt_means(v)).item() for label, v in results[BASE].rewards.items()},
        "summary": summary,
        "image_statistics": summarise_statistics(results, named),
        "interval": {"method": METHOD, "level": LEVEL, "min_prompts": MIN_PROMPTS, "caveat_below": CAVEAT_BELOW},
        "table": table(summary) if adapter_names else base_table(results[BASE].rewards),
        "prompt_means": {
            name: {label: torch.nanmean(v, dim=1).tolist() for label, v in r.rewards.items()}
            for name, r in results.items()
        },
    }
    alarms = {name: run_alarms(path) for name, path in named.items()}
    record["alarms"] = alarms  # what the console prints under the table, as the report shows them
    record["reward_failures"] = {name: run_reward_failures(path) for name, path in named.items()}
    prompts = [row.prompt for row in rows]
    write_html(
        out / REPORT, record, results, prompts, categories, alarms, first_label,
        a.gallery_prompts, out / PLOT,
    )  # fmt: skip
    return record
