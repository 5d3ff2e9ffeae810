"""``report.html``: what ``glm-grpo evaluate`` found, in one self-contained page a person opens in a browser.

Written next to ``evaluate.json`` from the same figures (nothing is recomputed here): the protocol the numbers
depend on (model, adapters and prompts with their sha256, samples, seeds, decode and sampling settings, the
command's overrides), per adapter the reward table with its 95 % intervals over prompts and the image-statistics
table base vs adapter with their own intervals (a reward that climbs while the images go dark or the G samples
of a prompt become copies is what reward hacking looks like), the alarms that fired during the adapter's run
(read from its eval.jsonl / metrics.jsonl), for each prompt category the base's and each adapter's first image of
every prompt, drawn with the same seeds, and the differences plot. Images are embedded as PNG data URIs, so
the file can be mailed or attached as it is. No script, no external resource::

    write_html(out / REPORT, record, results, rows_prompts, categories, alarms, plot=out / "evaluate.png")
"""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

import torch

from ..runtime.atomic_files import write_text_atomic

REPORT = "report.html"
TILE_PX = 160  # a thumbnail is shown at least this wide (small ones scaled up, pixelated: nothing invented)

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #111; background: #fafafa; max-width: 1400px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0 16px; background: #fff; }
th, td { border: 1px solid #ccc; padding: 3px 8px; font-size: 13px; vertical-align: top; }
th { background: #eee; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.up { background: #d9f2d9; } td.down { background: #f7d4d4; } td.moved { background: #fbe7b5; }
.gallery td { text-align: center; background: #c8c8c8; }
.gallery td.prompt { text-align: left; max-width: 320px; background: #fff; }
.gallery img { image-rendering: pixelated; display: block; margin: 0 auto; }
.caption { font-size: 12px; } .note { color: #555; font-size: 13px; } .alarm { color: #b00; font-weight: bold; }
"""


def png_data_uri(image: torch.Tensor) -> str:
    """``[3, h, w]`` uint8 -> ``data:image/png;base64,...``."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).cpu().numpy()).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _num(x, spec: str = ".4f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    """An HTML table; cells are HTML already (escape text before), a cell may be ``(html, css class)``."""

    def cell(c):
        text, css = c if isinstance(c, tuple) else (c, "")
        return f'<td class="{css}">{text}</td>' if css else f"<td>{text}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(c) for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><tr>{head}</tr>{body}</table>'


def _diff_cell(r: dict, signed: bool = True) -> tuple[str, str]:
    """A difference whose interval excludes 0 is coloured: green up / red down for a reward (``signed``), amber
    for an image statistic (which way is worse depends on the statistic and the prompt)."""
    moved = "up" if r["diff"] > 0 else "down"
    css = ("num " + (moved if signed else "moved")) if r["ci_excludes_0"] else "num"
    return _num(r["diff"], "+.4f"), css


def _ci(r: dict) -> str:
    """The interval, with its level where it is one of a family's (evaluation/stats.py family_level)."""
    from .stats import LEVEL

    if r.get("verdict") == "too few prompts":
        return "too few prompts"
    level = r.get("level", LEVEL)
    shown = "" if level == LEVEL else f" ({level:.1%})"
    return f"[{_num(r['ci'][0], '+.4f')}, {_num(r['ci'][1], '+.4f')}]{shown}"


def protocol_rows(record: dict) -> list[list[str]]:
    """The settings every figure depends on (evaluate.json's), one row each."""
    e = html.escape
    d = record["decode"]
    rows = [
        ["model", e(record["model"])],
        *[[f"adapter {name}", e(f"{path}  (sha256 {record['adapters_sha256'][i][:16]}...)")]
          for i, (name, path) in enumerate(record["adapters"].items())],
        ["prompts", e(f"{record['prompts']}  (sha256 {record['prompts_sha256'][:16]}...)")],
        ["prompt rows", str(record["num_prompts"])],
        ["samples", f"{record['samples_per_prompt']} per prompt and model"],
        ["seeds", e(f"seed {record['seed']}, scheme: {record['seeds']}")],
        ["image", f"{record['image'][0]} x {record['image'][1]}"],
        ["decode", e(", ".join(f"{k} {v}" for k, v in d.items()))],
        ["sampling", e(", ".join(f"{k} {v}" for k, v in record["sampling"].items()))],
        ["rewards", e(", ".join(r["name"] for r in record["rewards"]))],
        ["dtype, ranks", e(f"{record['dtype']}, {record['world_size']}")],
        ["command", e(" ".join(str(x) for x in _invocation(record["invocation"])) or "(defaults)")],
    ]  # fmt: skip
    return rows


def _invocation(inv: dict) -> list[str]:
    out = []
    if inv.get("config"):
        out += ["--config", inv["config"]]
    if inv.get("model_flag"):
        out += ["--model", inv["model_flag"]]
    if inv.get("rewards_flag"):
        out += ["--rewards", *inv["rewards_flag"]]
    return out + list(inv.get("overrides") or [])


def reward_section(name: str, s: dict) -> str:
    from .report import DOMAIN, TOTAL

    rows = [
        [html.escape(label), (_num(r["base"]), "num"), (_num(r["model"]), "num"), _diff_cell(r), (_ci(r), "num"),
         (_num(r["win_rate"], ".2f"), "num"), (str(r["prompts"]), "num"),
         "weighted sum" if label == TOTAL else html.escape(DOMAIN[r["trained_on"]])]
        for label, r in s["rewards"].items()
    ]  # fmt: skip
    for cat, per_label in s["categories"].items():
        rows += [
            [html.escape(f"  {cat}: {label}"), (_num(r["base"]), "num"), (_num(r["model"]), "num"), _diff_cell(r),
             (_ci(r), "num"), (_num(r["win_rate"], ".2f"), "num"), (str(r["prompts"]), "num"), "category"]
            for label, r in per_label.items()
        ]  # fmt: skip
    header = ["reward", "base", name, "difference", "95 % interval", "win rate", "prompts", "domain"]
    return _table(header, rows)


def statistics_section(name: str, stats: dict) -> str:
    from ..monitoring.image_stats import STATISTICS

    rows = [
        [html.escape(stat), html.escape(STATISTICS.get(stat, "")), (_num(r["base"]), "num"), (_num(r["model"]), "num"),
         _diff_cell(r, signed=False), (_ci(r), "num"), (str(r["prompts"]), "num")]
        for stat, r in stats.items()
    ]  # fmt: skip
    return _table(["statistic", "what it measures", "base", name, "difference", "interval", "prompts"], rows)


def alarms_section(alarms: dict | None) -> str:
    if alarms is None:
        return '<p class="note">No run records found beside the adapter (eval.jsonl / metrics.jsonl of its run).</p>'
    rules = html.escape("; ".join(alarms["rules"]) or "none configured")
    source = f'<p class="note">From {html.escape(alarms["file"])}; rules: {rules}.</p>'
    if not alarms["fired"]:
        return source + "<p>No alarm fired during training.</p>"
    rows = [
        [f'<span class="alarm">{html.escape(a["rule"])}</span>', (str(a["first_step"]), "num"),
         (f"{a['value']:.4g}", "num"), (f"{a['bound']:.4g}", "num"), html.escape(", ".join(map(str, a["steps"]))),
         "yes" if a["holding_at_end"] else "no"]
        for a in alarms["fired"]
    ]  # fmt: skip
    head = ["rule", "first fired at step", "value then", "bound", "held at steps", "still holding at the end"]
    return source + _table(head, rows)


def gallery_section(results: dict, names: list[str], prompts: list[str], categories, label: str, per_category: int):
    """Per category (one section when there are none): a row per prompt, the prompt then each model's first
    image (same seeds), captioned with that image's own ``label`` reward and, apart, the prompt's mean over its
    K samples (the tables' unit)."""
    groups: dict[str, list[int]] = {}
    for i, cat in enumerate(categories if categories is not None else ["all prompts"] * len(prompts)):
        groups.setdefault(cat, []).append(i)
    means = {n: torch.nanmean(results[n].rewards[label], dim=1) for n in names}
    k = results[names[0]].rewards[label].shape[1]
    parts = []
    for cat, indices in sorted(groups.items()):
        shown = indices[:per_category]
        rows = []
        for i in shown:
            row = [(html.escape(prompts[i]), "prompt")]
            for n in names:
                thumb = results[n].thumbs[i]
                width = max(TILE_PX, thumb.shape[-1])
                row.append(
                    f'<img src="{png_data_uri(thumb)}" width="{width}" alt="{html.escape(n)}, prompt {i}">'
                    f'<div class="caption">{html.escape(label)} {_num(float(results[n].rewards[label][i, 0]), ".3f")}'
                    f" (this image); prompt mean {_num(float(means[n][i]), '.3f')} over {k} samples</div>"
                )
            rows.append(row)
        more = f" (the first {len(shown)} of {len(indices)})" if len(shown) < len(indices) else ""
        parts.append(f"<h3>{html.escape(cat)}{more}</h3>" + _table(["prompt", *names], rows, "gallery"))
    return "".join(parts)


def write_html(
    path: Path,
    record: dict,
    results: dict,
    prompts: list[str],
    categories: list[str] | None,
    alarms: dict[str, dict | None],
    label: str,
    per_category: int = 16,
    plot: Path | None = None,
) -> Path:
    """The report (see the module docstring): ``record`` is evaluate.json's content, ``results`` the models'
    (evaluation/paired.py), ``alarms`` per adapter name (evaluation/report.py ``run_alarms``), ``label`` the
    reward the gallery captions show."""
    from .paired import BASE
    from .report import reward_failure_lines, undefined_lines

    names = [BASE, *record["adapters"]]
    failures = record.get("reward_failures") or {}
    body = [
        "<h1>glm-grpo evaluate: base vs adapter</h1>",
        '<p class="note">Paired: every model draws each prompt\'s tokens with the same noise and decodes them with '
        "the same seed, so a difference measures the adapter, not the seeds. Intervals: Student's t over prompts "
        "(docs/evaluate.md, with their simulated coverage; none below 3 prompts); a reward "
        "difference whose interval excludes 0 is green (up) or red (down), an image statistic's amber.</p>",
        "<h2>Protocol</h2>",
        _table(["setting", "value"], protocol_rows(record)),
    ]
    if not record["adapters"]:
        body.append("<p>No adapter: the base alone.</p>")
    for name in record["adapters"]:
        s = record["summary"][name]
        warning = s.get("base_warning")
        body += [
            f"<h2>{html.escape(name)}: rewards</h2>",
            f'<p class="alarm">{html.escape(warning)}</p>' if warning else "",
            reward_section(name, s),
            *(f'<p class="note">{html.escape(line)}</p>' for line in undefined_lines({name: s})),
            f"<h2>{html.escape(name)}: image statistics</h2>",
            '<p class="note">Per prompt, the mean over its samples (diversity and near-duplicates: over its '
            "sample pairs); a reward that rises while these move far is worth a look at the images.</p>",
            statistics_section(name, record["image_statistics"][name]),
            f"<h2>{html.escape(name)}: alarms during training</h2>",
            alarms_section(alarms.get(name)),
            *(f'<p class="alarm">{html.escape(line)}</p>' for line in reward_failure_lines({name: failures.get(name)})),
        ]
    body += ["<h2>Images, same seeds</h2>", gallery_section(results, names, prompts, categories, label, per_category)]
    if plot is not None and plot.is_file():
        uri = "data:image/png;base64," + base64.b64encode(plot.read_bytes()).decode("ascii")
        body += ["<h2>Differences</h2>", f'<img src="{uri}" alt="differences with their intervals">']
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>glm-grpo evaluate report</title>'
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, page)
    return path
