"""``glm-grpo evaluate``: did the run help? The base model against one or more adapters on the same prompts with
paired seeds, per reward: means, the paired difference with a 95 % interval over prompts, the win rate.

    glm-grpo evaluate --config launch/configs/tiny_world.yaml model.path=outputs/world/model \\
        --adapter outputs/world_run/final_adapter --prompts outputs/world/heldout.jsonl --samples-per-prompt 4
    glm-grpo evaluate --model zai-org/GLM-Image --adapter outputs/glm_image_lora/final_adapter \\
        --prompts my_eval.jsonl --rewards ocr aesthetic --samples-per-prompt 4 --seed 0 --out outputs/evaluate

Everything not given comes from ``--config`` (a training config: model, rewards with their arguments, image
size, sampling, the evaluation decode ``eval.*``, by default the pipeline's own 50 steps) or from the
training defaults; ``--model``, ``--prompts`` and ``--rewards NAME ...`` replace the config's. Without
``--config``, the run that wrote the first ``--adapter`` (its ``config.json`` beside ``final_adapter/`` or above
``checkpoints/step_N/adapter/``) gives what its own evaluation used (:data:`RUN_KEYS`: model, image size,
sampling, the ``eval.*`` decode, seed and K, rewards), one line naming the file and the keys; a flag or a
``key=value`` given here wins. Without either and without ``--rewards``, one line says to give ``--rewards``.
Before sampling, a line says what is coming (models x prompts x samples, size, decode); the count of prompts
follows, at least every 30 s in a log (runtime/progress_count.py). Sampling is
paired (glm_grpo_ds/evaluation/paired.py): every model draws prompt i's tokens with the same noise and decodes
them with the same seed, so the base against itself differs by exactly 0 and the differences measure the
adapters, not the seeds. The seeds follow the in-training evaluation's scheme (evaluation/seeds.py) and
``--seed`` / ``--samples-per-prompt`` / ``--num-prompts`` default to ``eval.seed`` / ``eval.group_size`` /
``eval.num_prompts``: with the run's config, the adapter's figures are the run's final evaluation's samples.
The rewards the adapter's run trained on are marked ``trained on``; the others ``out of domain``
(docs/evaluate.md says why both matter). ``--category-key`` (default ``category``) breaks the results down by
that column when the prompts have it.

Writes ``OUT/evaluate.json`` (settings and every figure), ``OUT/gallery.png`` (per prompt: base | adapter ...),
``OUT/evaluate.png`` (the differences with their intervals) and ``OUT/report.html`` (all of it in one page a person
opens: the protocol, the reward and image-statistics tables, the run's alarms, the images per category;
evaluation/html_report.py), and prints the table. Resumable: every
finished batch of prompts is kept in ``OUT/progress/``, and the same command run again (after an
interruption, or to print the table again) samples only what is missing; other settings with the same
``--out`` are refused unless ``--fresh``, and the settings hold the content of the prompt rows and of each
adapter's weights (sha256), so a prompt file or an adapter changed in place counts as other settings. With
``--export``, a stored batch whose exported files are gone is sampled again, so a resumed export is complete.

The prompts (``--prompts``, else ``eval.file``) are read as training reads ``eval.file``: any source
``data.train_file`` takes (glm_grpo_ds/data/: ``.txt``, ``.jsonl`` such as LongText-Bench's, CVTG-2K's ``.json``,
tables, dataset directories, Hub dataset ids) with ``eval.split`` / ``eval.revision``.

Several GPUs: ``deepspeed --num_gpus 8 --module glm_grpo_ds.commands.evaluate ...`` (or a hostfile): each rank
samples a contiguous share of the prompts with its own copy of the models (the AR, the decoder and the rewards
must fit one device), rank 0 gathers the rewards and writes the report; each prompt's seeds are its own, so the
figures do not depend on the rank count (up to the batches' floating-point rounding).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import torch

from .cli import parser_for


def parse_args(argv: list[str]) -> argparse.Namespace:
    from ..config.arguments import parse_with_overrides

    p = parser_for("evaluate")
    p.add_argument(
        "--config",
        default=None,
        help="a training config (YAML): model, rewards, size, sampling, eval.* (default: the adapter's run's)",
    )
    p.add_argument("--model", default=None, help="pipeline directory or Hub id (replaces model.path)")
    p.add_argument(
        "--adapter", action="append", default=[], help="a LoRA adapter to compare with the base (repeatable)"
    )
    p.add_argument("--prompts", default=None, help="the prompt file or dataset (default: eval.file of the config)")
    p.add_argument(
        "--rewards",
        nargs="+",
        default=None,
        metavar="NAME",
        help="reward names, e.g. --rewards pixel_mse ssim (replace the config's or the adapter's run's)",
    )
    p.add_argument(
        "--num-prompts", type=int, default=None, help="the first N prompts (0 = all; default: eval.num_prompts)"
    )
    p.add_argument(
        "--samples-per-prompt", type=int, default=None, help="K samples per prompt and model (default: eval.group_size)"
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seeds every prompt's rollout noise and decode (default: eval.seed, as the run's own evaluation)",
    )
    p.add_argument("--category-key", default="category", help="break the results down by this prompt column")
    p.add_argument("--batch-prompts", type=int, default=4, help="prompts rolled out together")
    p.add_argument("--gallery-prompts", type=int, default=16, help="prompts in gallery.png")
    p.add_argument(
        "--thumbnail",
        type=int,
        default=None,
        help="longest side of a gallery.png tile in pixels, never upscaled (default: logging.gallery_thumbnail, 128)",
    )
    p.add_argument("--device", default="auto", help="auto = cuda when available, else cpu")
    p.add_argument("--out", default="outputs/evaluate", help="output directory")
    p.add_argument(
        "--export",
        nargs=2,
        action="append",
        metavar=("LAYOUT", "DIR"),
        default=[],
        help="also write every model's images in a benchmark's layout: geneval, dpg, longtext or oneig "
        "(glm_grpo_ds/evaluation/exports.py); repeatable",
    )
    p.add_argument(
        "--fresh", action="store_true", help="discard the finished batches OUT/progress/ holds and sample everything"
    )
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # the launcher's
    p.add_argument("overrides", nargs="*", help="config overrides, key=value (as for glm-grpo train)")
    args = parse_with_overrides(p, argv)
    # --rewards takes every word after it, overrides too (`--rewards pixel_mse rollout.height=128`); a reward name
    # never holds "=", a config override always does: those go back to the overrides
    if args.rewards:
        args.overrides += [word for word in args.rewards if "=" in word]
        args.rewards = [word for word in args.rewards if "=" not in word] or None
    return args


def _absolute(source: str) -> str:
    """A local path made absolute (evaluate.json names every file the same way); a Hub id as it is."""
    path = Path(source)
    return str(path.resolve()) if path.exists() else source


# What evaluate takes, without --config, from the run that wrote the adapter: what that run's own evaluation
# sampled, decoded and scored with (an adapter trained at 64x64 is not judged at the default 1024x1024).
RUN_KEYS = (
    "model.path",
    "model.revision",
    "rollout.height",
    "rollout.width",
    "grpo.sampling.temperature",
    "grpo.sampling.top_k",
    "grpo.sampling.top_p",
    "eval.num_inference_steps",
    "eval.guidance_scale",
    "eval.seed",
    "eval.group_size",
    "rewards",
)
REWARDS_HINT = "give --rewards NAME [NAME ...] (e.g. --rewards pixel_mse ssim) or --config with a rewards list"


def _given(a, key: str) -> bool:
    """Whether this command line sets ``key`` itself: a ``key=value`` on it or above it (a section), or its flag."""
    if (key.startswith("model.") and a.model) or (key == "rewards" and a.rewards):
        return True
    for item in a.overrides:
        set_key = item.split("=", 1)[0].strip()
        if set_key == key or key.startswith(set_key + ".") or set_key.startswith(key + "."):
            return True
    return False


def _lookup(tree: dict, key: str):
    """``tree``'s value at the dotted ``key``; KeyError when a run of another version has no such key."""
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def _shown(key: str, value) -> str:
    if key == "rewards":
        return "rewards=[" + ", ".join(str(r.get("name")) if isinstance(r, dict) else str(r) for r in value) + "]"
    return f"{key}={json.dumps(value)}"


def run_overrides(a, adapters: list[str]) -> tuple[list[str], list[str]]:
    """Without ``--config``: ``(overrides, lines)``, the :data:`RUN_KEYS` of the first adapter's run that this
    command line does not set, as ``key=value`` overrides, and the lines saying so (the file, the keys; one more
    per other adapter whose run differs). ``([], [])`` with ``--config`` or without a run config."""
    from ..evaluation.report import run_config

    if a.config is not None:
        return [], []
    runs = [(i, found) for i, path in enumerate(adapters) for found in [run_config(path)] if found is not None]
    if not runs:
        return [], []
    taken = {}
    for i, (run, train) in runs:
        values = {}
        for key in RUN_KEYS:
            try:
                values[key] = _lookup(train, key)
            except KeyError:
                continue
        taken[i] = (run, {key: value for key, value in values.items() if not _given(a, key)})
    first, (run, values) = runs[0][0], taken[runs[0][0]]
    if not values:
        return [], []
    overrides = [f"{key}={json.dumps(value)}" for key, value in values.items()]
    lines = [
        f"glm-grpo evaluate: settings of adapter_{first}'s run, from {run / 'config.json'}: "
        + ", ".join(_shown(key, value) for key, value in values.items())
        + " (a flag, --config or key=value given here wins)"
    ]
    for i, (other, other_values) in taken.items():
        differ = [_shown(key, v) for key, v in other_values.items() if key in values and v != values[key]]
        if i != first and differ:
            lines.append(
                f"glm-grpo evaluate: warning: adapter_{i}'s run ({other / 'config.json'}) had {', '.join(differ)}; "
                f"every model is evaluated with adapter_{first}'s (give key=value to choose)"
            )
    return overrides, lines


def load_settings(a, adapters: list[str] = ()):
    """``(config, prompt source, lines)``: the config with ``--model`` / ``--prompts`` / ``--rewards`` applied (and,
    without ``--config``, the settings of ``adapters``' run: :func:`run_overrides`, with its lines to print)."""
    from ..config import load_config

    from_run, lines = run_overrides(a, list(adapters))
    if a.config is None and not _given(a, "rewards") and not any(o.startswith("rewards=") for o in from_run):
        raise ValueError(f"no rewards to score the images with: {REWARDS_HINT}")
    overrides = [*from_run, *a.overrides]
    if a.model:
        overrides.append(f"model.path={a.model}")
    if a.rewards:
        overrides.append("rewards=[" + ", ".join(f"{{name: {name}}}" for name in a.rewards) + "]")
    if a.config is None and a.prompts:
        overrides.append(f"data.train_file={a.prompts}")  # the config needs a training file; never read here
    cfg = load_config(a.config, overrides)
    prompts = a.prompts or cfg.eval.file
    if not prompts:
        raise ValueError("give --prompts FILE (or a --config with eval.file)")
    prompts = _absolute(prompts)
    # unset: the run's own evaluation's (its prompts, K and seed: evaluation/seeds.py)
    if a.samples_per_prompt is None:
        a.samples_per_prompt = cfg.eval.group_size
    if a.num_prompts is None:
        a.num_prompts = cfg.eval.num_prompts
    if a.thumbnail is None:
        a.thumbnail = cfg.logging.gallery_thumbnail
    if a.thumbnail < 16:
        raise ValueError(f"--thumbnail must be >= 16 pixels, got {a.thumbnail}")
    for flag, value in (("--samples-per-prompt", a.samples_per_prompt), ("--batch-prompts", a.batch_prompts)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    return cfg, prompts, lines


PROGRESS = "progress"  # OUT/progress/rank_<r>/: settings.json and each finished (model, batch of prompts)


def start_ranks(device_flag: str) -> tuple[int, int, int, torch.device]:
    """``(rank, world size, local rank, device)``: under the deepspeed launcher (WORLD_SIZE > 1) the process
    group is started and each rank takes its own GPU (CPU ranks on a machine without one); else one process."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from ..ds import engine as ds_engine

        return ds_engine.init_distributed()
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    return 0, 1, 0, torch.device(auto if device_flag == "auto" else device_flag)


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


def progress_store(store: Path, settings: dict, fresh: bool) -> Path:
    """``OUT/progress/rank_<r>``, emptied when ``fresh``; an interrupted run with the same settings resumes from
    it, one with other settings is refused (one line naming --fresh and --out)."""
    recorded = store / "settings.json"
    if fresh and store.exists():
        shutil.rmtree(store)
    if recorded.is_file():
        before, now = json.loads(recorded.read_text()), json.loads(json.dumps(settings))
        differ = sorted(key for key in before.keys() | now.keys() if before.get(key) != now.get(key))
        if differ:
            raise ValueError(
                f"{store} holds an evaluation with other settings ({', '.join(differ)}); give another --out, "
                "or --fresh to discard it"
            )
    store.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return store


def read_rows(a, cfg, prompt_source, rank: int, world: int, local_rank: int) -> tuple[list, list, str]:
    """``(rows, this rank's share, the source's name)``: the held-out prompts, read as training reads eval.file
    (eval.split / eval.revision, whether they come from --prompts or the config; a Hub dataset is downloaded, or
    its Arrow cache built, by rank 0 first), the first ``--num-prompts``, in contiguous shares per rank."""
    from ..data import load_prompts

    ev = cfg.eval
    key = "--prompts" if a.prompts else "eval.file"
    rows = load_prompts(prompt_source, key, cfg.data, ev.split, ev.revision, rank, local_rank, section="eval")
    rows = rows[: a.num_prompts] if a.num_prompts else rows
    name = rows.where  # the source, with the split taken from a DatasetDict
    rows = list(rows)
    share = -(-len(rows) // world)  # the last ranks' shares may be shorter or empty
    return rows, rows[rank * share : (rank + 1) * share], name


def run_settings(a, cfg, loaded, adapters, rows, prompts_name, decode, seed, world) -> dict:
    """What the evaluation's figures depend on, recorded in evaluate.json and checked on resume. Contents, not only
    paths (evaluation/fingerprints.py): a rerun after the prompts or an adapter changed is refused instead of mixing
    stored batches of the old ones with new ones."""
    from ..evaluation import seeds
    from ..evaluation.fingerprints import adapter_sha256, rows_sha256

    s = loaded.sampling
    return {
        "model": str(loaded.model_dir),
        "adapters": adapters,
        "adapters_sha256": [adapter_sha256(path) for path in adapters],
        "prompts": prompts_name,
        "prompts_revision": cfg.eval.revision,
        "prompts_sha256": rows_sha256(rows),
        "num_prompts": len(rows),
        "samples_per_prompt": a.samples_per_prompt,
        "seed": seed,
        "seeds": seeds.SCHEME,
        "image": [cfg.rollout.height, cfg.rollout.width],
        "decode": decode.record(),
        "sampling": {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p},
        "rewards": [dataclasses.asdict(spec) for spec in cfg.rewards],
        "batch_prompts": a.batch_prompts,
        "thumbnail": a.thumbnail,
        "dtype": str(loaded.dtype),
        "export": a.export,
        "world_size": world,
    }


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
    from ..advantages import weighted_total
    from ..evaluation.html_report import REPORT, write_html
    from ..evaluation.paired import BASE
    from ..evaluation.report import (
        GALLERY,
        PLOT,
        TOTAL,
        base_table,
        run_alarms,
        summarise,
        summarise_statistics,
        table,
        write_gallery,
        write_plot,
    )
    from ..evaluation.stats import CAVEAT_BELOW, LEVEL, METHOD, MIN_PROMPTS

    k = a.samples_per_prompt
    if len(weights) > 1:  # the weighted total, as training combines the rewards
        for result in results.values():
            flat = {label: v.reshape(-1) for label, v in result.rewards.items()}
            result.rewards[TOTAL] = weighted_total(flat, weights, k).view(len(rows), k)
    has_categories = any(row.extra.get(a.category_key) is not None for row in rows)
    categories = [str(row.extra.get(a.category_key)) for row in rows] if has_categories else None
    named = dict(zip(adapter_names, adapters))
    summary = summarise(results, named, categories)
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
        "base": {label: torch.nanmean(v).item() for label, v in results[BASE].rewards.items()},
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
    prompts = [row.prompt for row in rows]
    write_html(
        out / REPORT, record, results, prompts, categories, alarms, first_label,
        a.gallery_prompts, out / PLOT,
    )  # fmt: skip
    return record


def start_line(models: int, prompts: int, k: int, cfg, decode) -> str:
    """What the evaluation is about to sample: models x prompts x samples, the size, the decode and the rewards."""
    steps, guidance = decode.num_inference_steps, decode.guidance_scale
    return (
        f"evaluate: {models} model{'s' * (models > 1)} x {prompts} prompts x {k} samples = {models * prompts * k} "
        f"images at {cfg.rollout.height}x{cfg.rollout.width}, decoded with {steps} DiT step{'s' * (steps != 1)} "
        f"(guidance {guidance:g}), rewards {', '.join(r.name for r in cfg.rewards)}"
    )


def run(a) -> dict | None:
    """The evaluation (collective under the launcher): evaluate.json's content on rank 0, None on the others."""
    from ..decoder import ImageDecoder, resolve_settings
    from ..evaluation.paired import BASE, evaluate_models
    from ..experience import ExperienceMaker
    from ..model.adapters import find_adapter
    from ..model.policy import load_for_sampling
    from ..rewards import build_rewards
    from ..rollout.backends import ModelSampler
    from ..runtime.progress_count import Count

    adapters = [str(find_adapter(path).resolve()) for path in a.adapter]
    cfg, prompt_source, lines = load_settings(a, adapters)
    rank, world, local_rank, device = start_ranks(a.device)
    rows, mine, prompts_name = read_rows(a, cfg, prompt_source, rank, world, local_rank)
    m = cfg.model
    loaded = load_for_sampling(
        m.path, m.revision, m.dtype, m.attn_implementation, cfg.grpo.sampling, device, adapters, m.trust_remote_code
    )
    names = [BASE, *loaded.adapter_names]
    reward_fn = build_rewards(cfg.rewards)
    sampler = ModelSampler(loaded.model, loaded.processor, cfg.rollout, loaded.sampling, device)
    maker = ExperienceMaker(sampler, ImageDecoder(loaded.model_dir, cfg.decoder, device), reward_fn, cfg, device)
    decode = resolve_settings(cfg.eval.num_inference_steps, cfg.eval.guidance_scale)
    seed = cfg.eval.seed if a.seed is None else a.seed
    settings = run_settings(a, cfg, loaded, adapters, rows, prompts_name, decode, seed, world)
    on_images = export_hook(a, rows, (cfg.rollout.height, cfg.rollout.width)) if a.export else None
    store = progress_store(Path(a.out) / PROGRESS / f"rank_{rank}", settings, a.fresh)
    if rank == 0:  # every input checked (an error stays one line): where the settings came from, what is coming
        for line in [*lines, start_line(len(names), len(rows), a.samples_per_prompt, cfg, decode)]:
            print(line, file=sys.stderr, flush=True)
    desc = f"evaluate ({len(names)} model{'s' * (len(names) > 1)} x {a.samples_per_prompt} samples)"
    with Count(len(mine), desc, "prompts", enabled=rank == 0) as bar:
        results = evaluate_models(
            loaded.model, names, maker, mine, a.samples_per_prompt, seed, decode,
            batch_prompts=a.batch_prompts, thumb_side=a.thumbnail, progress=bar.update, store=store,
            on_images=on_images,
        )  # fmt: skip
    results = gather_results(results, names)
    if results is None:  # another rank's: rank 0 reports
        return None
    warnings = dict(zip(loaded.adapter_names, loaded.adapter_warnings))
    return write_report(a, results, settings, rows, loaded.adapter_names, adapters, reward_fn.weights, warnings)


def main(argv: list[str] | None = None) -> int:
    from ..config import ConfigError
    from ..ds import dist
    from ..evaluation.html_report import REPORT
    from ..evaluation.report import EVALUATE_JSON, alarm_lines

    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result = run(a)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"glm-grpo evaluate: {err}", file=sys.stderr)
        dist.shutdown(agreed=False)
        return 2
    dist.shutdown()
    if result is None:  # not rank 0
        return 0
    (Path(a.out) / EVALUATE_JSON).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(result["table"])
    for line in alarm_lines(result["alarms"]):  # the adapters' runs: one line per alarm that fired, or none
        print(line)
    print(f"wrote {Path(a.out) / EVALUATE_JSON}")
    print(f"report: {Path(a.out) / REPORT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
