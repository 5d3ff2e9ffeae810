"""Model cards (``README.md``) for what glm-grpo writes: a run's final adapter (LoRA) or model (full
fine-tuning) and each checkpoint's adapter; a merged pipeline's card (``glm-grpo merge``) is built from
these pieces in merged_card.py.

Made with huggingface_hub's ``ModelCard`` / ``ModelCardData`` and read from the run's own files, so a
card can be (re)written from ``output_dir`` alone at any time::

    from glm_grpo_ds.sharing.model_card import write_run_card
    write_run_card(OUTPUT_DIR, OUTPUT_DIR / "final_adapter")   # the trainer does this on rank 0 at the end
    glm-grpo push OUTPUT_DIR                                   # writes the card if missing, then uploads

The YAML metadata: ``base_model``, ``library_name`` (peft / transformers / diffusers),
``pipeline_tag: text-to-image``, ``tags`` (glm-image, grpo, text-to-image, lora, glm-grpo-ds) and the
base card's ``license`` when the base directory has a README.md. The text: the base model and its
revision, the results (steps done, the final training reward from ``metrics.jsonl``, the first and
last eval reward from ``eval.jsonl``, the reward curve), the image-statistics alarms that fired during
training (each with its step, value and bound; monitoring/alarms.py), the training settings from ``config.json``
(GRPO group size, beta, learning rate, LoRA r / alpha, ZeRO stage, world size, ...), the rewards with
their weights, and how to load the weights.

``base_model`` is a Hub id or nothing: the Hub refuses a README whose ``base_model`` is a local path
(transformers#33922). It is ``hub.base_model`` when set, else ``model.path`` when that is a Hub id
(``namespace/name``) or a snapshot in a Hugging Face cache (``.../models--ns--name/snapshots/<sha>``,
whose sha is the revision); a plain local directory is named in the text only.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..config.fields import is_repo_id
from ..model.glm_image import AR_DIR
from ..monitoring.alarms import describe
from ..observability.metrics import fired_alarms, read_metrics
from ..observability.plot import PLOT_NAME, plot_training
from ..runtime.versions import NOT_INSTALLED

CARD = "README.md"
TAG = "glm-grpo-ds"  # marks a card this module wrote (a peft or other card is replaced, ours kept)
TAGS = ["glm-image", "grpo", "text-to-image"]
WINDOW = 10  # steps averaged for the "last steps" training reward (a single step's reward is noisy)
CHECKPOINT_PREFIX = "checkpoints"  # checkpoints/step_N/ in the Hub repo, as in output_dir


def run_step_dir(step: int) -> str:
    """``step_000200``: a checkpoint's directory name (glm_grpo_ds.lifecycle.checkpoint.step_dir_name)."""
    return f"step_{step:06d}"


def base_model_id(path: str, revision: str | None = None, override: str | None = None) -> tuple[str | None, str | None]:
    """``(Hub id or None, revision or None)`` of the base model at ``path`` (see the module docstring)."""
    if override:
        return override, revision
    parts = Path(path).parts
    for i, part in enumerate(parts[:-2]):
        # huggingface_hub's cache layout: models--{namespace}--{name}/snapshots/{commit sha}
        if part.startswith("models--") and parts[i + 1] == "snapshots":
            repo = part[len("models--") :].replace("--", "/")
            if is_repo_id(repo):
                return repo, revision or parts[i + 2]
    if not os.path.exists(path) and is_repo_id(path):
        return path, revision
    return None, revision


def base_license(path: str) -> str | None:
    """The license in the base directory's own card (GLM-Image ships one), so derived weights keep it."""
    from huggingface_hub import ModelCard

    card = Path(path) / CARD
    if not card.is_file():
        return None
    try:
        return ModelCard.load(card).data.get("license")
    except ValueError:  # a README without valid metadata: no license to carry over
        return None


def reward_labels(specs: list[dict]) -> list[str]:
    """The metric labels of the rewards, as glm_grpo_ds.rewards.build_rewards names them (name, name#2, ...)."""
    seen: dict[str, int] = {}
    labels = []
    for s in specs:
        seen[s["name"]] = seen.get(s["name"], 0) + 1
        labels.append(s["name"] if seen[s["name"]] == 1 else f"{s['name']}#{seen[s['name']]}")
    return labels


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def run_results(run_dir: str | os.PathLike, step: int | None = None) -> dict:
    """The numbers a card reports, from ``metrics.jsonl`` / ``eval.jsonl`` (records up to ``step`` when
    given): ``steps_done``, ``final_train_reward`` (the last step's ``reward_mean``), ``last_window_reward``
    / ``first_window_reward`` (mean of the last / first ``WINDOW`` steps with a reward), ``final_rewards``
    ({label: last step's value}), ``first_eval`` / ``final_eval`` ((step, eval reward) or None)."""
    run = Path(run_dir)
    rows = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
    evals = read_metrics(run / "eval.jsonl") if (run / "eval.jsonl").is_file() else []
    if step is not None:
        rows = [r for r in rows if r["step"] <= step]
        evals = [e for e in evals if e["step"] <= step]
    rewards = [r["reward_mean"] for r in rows if r.get("reward_mean") is not None]
    last = rows[-1] if rows else {}
    labelled = {
        k[len("reward/") :]: v
        for k, v in last.items()
        if k.startswith("reward/") and not k.endswith(("_std", "_undefined", "_failed"))
    }
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
    }


def _world_and_stage(ds: dict) -> tuple[int | None, int | None]:
    per_rank = ds.get("train_micro_batch_size_per_gpu", 0) * ds.get("gradient_accumulation_steps", 0)
    world = ds["train_batch_size"] // per_rank if per_rank and "train_batch_size" in ds else None
    return world, ds.get("zero_optimization", {}).get("stage")


def _table(rows: list[tuple[str, object]]) -> str:
    return "\n".join(["| | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def _results_section(res: dict, cfg: dict, labels: list[str]) -> list[str]:
    rows = [("steps done", f"{res['steps_done']} of {cfg['max_steps']}")]
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
        rows.append((f"eval reward (fixed seeds) at step {res['final_eval'][0]}", _fmt(res["final_eval"][1])))
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


def _training_section(cfg: dict, ds: dict, labels: list[str]) -> list[str]:
    g, o, lora = cfg["grpo"], cfg["optimizer"], cfg.get("lora")
    world, stage = _world_and_stage(ds)
    rows = [
        ("method", "GRPO (group-relative advantages, clipped surrogate, k3 KL to the frozen reference)"),
        ("group size G", g["group_size"]),
        ("beta (KL)", g["beta"]),
        ("clip epsilon low / high", f"{g['epsilon_low']} / {g['epsilon_high']}"),
        ("updates per rollout", g["num_iterations"]),
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
        args = ", ".join(f"{k}={v}" for k, v in spec.get("args", {}).items()) or "-"
        lines.append(f"| {label} | {spec['weight']} | {args} |")
    if len(labels) > 1:
        lines += ["", f"Combined with `{g['reward_combination']}`."]
    return [*lines, ""]


def base_lines(path: str, hub_id: str | None, revision: str | None) -> list[str]:
    name = f"[{hub_id}](https://huggingface.co/{hub_id})" if hub_id else f"`{path}` (a local directory)"
    rev = f", revision `{revision}`" if revision else ""
    return [f"- base model: {name}{rev}"]


def usage_lines(kind: str, base_ref: str, weights: str, extra: str = "", render: dict | None = None) -> list[str]:
    """How to load the weights: ``kind`` adapter | model | pipeline; ``base_ref`` / ``weights``: Hub ids or
    absolute directories (a card is read from anywhere, so never a path relative to where training ran);
    ``extra``: more from_pretrained arguments of the weights (``, subfolder=..., revision=...``);
    ``render``: the run's image size, decoder steps and guidance (else GLM-Image's 1024, 30 and 1.5)."""
    r = {"height": 1024, "width": 1024, "num_inference_steps": 30, "guidance_scale": 1.5, **(render or {})}
    call = (
        f'image = pipe("a red cube on a wooden table", height={r["height"]}, width={r["width"]}, '
        f"num_inference_steps={r['num_inference_steps']}, guidance_scale={r['guidance_scale']}).images[0]"
    )
    if kind == "pipeline":
        load = [f'pipe = GlmImagePipeline.from_pretrained("{weights}"{extra}, dtype=dtype)']
    elif kind == "adapter":
        load = [
            "from peft import PeftModel",
            "",
            f'pipe = GlmImagePipeline.from_pretrained("{base_ref}", dtype=dtype)',
            "pipe.vision_language_encoder = PeftModel.from_pretrained(",
            f'    pipe.vision_language_encoder, "{weights}"{extra}',
            ").merge_and_unload()",
        ]
    else:
        load = [
            "from transformers import GlmImageForConditionalGeneration",
            "",
            f'ar = GlmImageForConditionalGeneration.from_pretrained("{weights}"{extra}, dtype=dtype)',
            f'pipe = GlmImagePipeline.from_pretrained("{base_ref}", vision_language_encoder=ar, dtype=dtype)',
        ]
    code = [
        "import torch",
        "from diffusers import GlmImagePipeline",
        "",
        'device = "cuda" if torch.cuda.is_available() else "cpu"',
        'dtype = torch.bfloat16 if device == "cuda" else torch.float32',
        *load,
        "pipe.to(device)",
        call,
        'image.save("grpo.png")',
    ]
    lines = ["## How to use", "", "```python", *code, "```", ""]
    if kind == "adapter":
        local = os.path.isabs(weights)  # else a Hub repo: the render and merge commands need a local copy
        adapter = weights if local else "ADAPTER_DIR"
        size = f"--height {r['height']} --width {r['width']} --steps {r['num_inference_steps']}"
        size += f" --guidance {r['guidance_scale']}"
        lines += [
            "With glm-grpo-ds installed"
            + ("" if local else " (`ADAPTER_DIR`: a local copy of this repository, e.g. from `hf download`)")
            + ":",
            "",
            "```bash",
            f'glm-grpo render --model {base_ref} --adapter {adapter} --prompt "a red cube on a wooden table" {size}',
            f"glm-grpo merge --base {base_ref} --adapter {adapter} --out GLM-Image-grpo   # a complete pipeline",
            "```",
            "",
        ]
    return lines


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


def make_card(data_kwargs: dict, body: list[str]):
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(**{k: v for k, v in data_kwargs.items() if v is not None})
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body).rstrip() + "\n")


def _curve(run: Path, weights_dir: Path) -> bool:
    """Put the run's reward curve beside the weights (``reward_curve.png``, referenced relatively).
    ``output_dir/reward_curve.png`` is used when it is current (not older than ``metrics.jsonl``: with
    ``logging.plot: false`` an earlier run's may be lying there), else it is drawn now."""
    metrics, curve = run / "metrics.jsonl", run / PLOT_NAME
    if not metrics.is_file() or metrics.stat().st_size == 0:
        return False
    if curve.is_file() and curve.stat().st_mtime >= metrics.stat().st_mtime:
        shutil.copyfile(curve, weights_dir / PLOT_NAME)
    else:
        plot_training(metrics, weights_dir / PLOT_NAME, run / "eval.jsonl")
    return True


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


def run_card(run_dir: str | os.PathLike, weights_dir: str | os.PathLike, step: int | None = None, curve=True):
    """The ``ModelCard`` of ``weights_dir`` (an adapter or a full model) written by the run in
    ``run_dir``; ``step``: a checkpoint's card (results up to that step)."""
    run, weights = Path(run_dir), Path(weights_dir)
    saved = json.loads((run / "config.json").read_text(encoding="utf-8"))
    cfg, ds = saved["train"], saved.get("deepspeed", {})
    hub = cfg.get("hub") or {}
    model = cfg["model"]
    # where the trainer really loaded from (model_source.py: absolute directory, Hub id + commit) when recorded
    source = saved.get("model_source") or {}
    base = source.get("path") or model["path"]
    if source.get("repo_id") and not hub.get("base_model"):
        hub_id, revision = source["repo_id"], source.get("commit") or source.get("revision")
    else:
        hub_id, revision = base_model_id(base, model.get("revision"), hub.get("base_model"))
    is_adapter = (weights / "adapter_config.json").is_file()
    labels = reward_labels(cfg["rewards"])
    res = run_results(run, step)
    what = "LoRA adapter" if is_adapter else "fine-tuned autoregressive model"
    title = f"# {hub.get('repo_id') or run.resolve().name}" + (f": checkpoint at step {step}" if step else "")
    body = [
        title,
        "",
        f"A {what} for the autoregressive policy of GLM-Image (`{AR_DIR}`, "
        "`GlmImageForConditionalGeneration`), trained with GRPO by glm-grpo-ds on rewards computed from the "
        "images the frozen DiT decoder renders. "
        "The DiT, VAE and glyph encoder of the base pipeline are unchanged.",
        "",
        *base_lines(base, hub_id, revision),
        *data_lines(saved),
        "- rewards: " + ", ".join(f"{label} (weight {s['weight']})" for label, s in zip(labels, cfg["rewards"])),
        "",
        *_results_section(res, cfg, labels),
    ]
    if curve and _curve(run, weights):
        body += [f"![reward curve]({PLOT_NAME})", ""]
    body += alarms_section(run, step)
    body += _training_section(cfg, ds, labels)
    body += segments_lines(saved)
    # where readers of this card get the weights: the Hub repo when the run uploads them there, else this directory
    uploaded = hub.get("repo_id") and (step is None or hub.get("push_checkpoints"))
    extra = f', subfolder="{CHECKPOINT_PREFIX}/{run_step_dir(step)}"' if uploaded and step is not None else ""
    extra += f', revision="{hub["revision"]}"' if uploaded and hub.get("revision") else ""
    where = hub["repo_id"] if uploaded else str(weights.resolve())
    dec, rollout = cfg["decoder"], cfg["rollout"]
    render = dict(
        height=rollout["height"],
        width=rollout["width"],
        num_inference_steps=dec["num_inference_steps"],
        guidance_scale=dec["guidance_scale"],
    )
    body += usage_lines("adapter" if is_adapter else "model", hub_id or str(Path(base).resolve()), where, extra, render)
    body += versions_section(saved)
    tags = [*TAGS, *(["lora"] if is_adapter else []), TAG]
    return make_card(
        dict(
            base_model=hub_id,
            library_name="peft" if is_adapter else "transformers",
            pipeline_tag="text-to-image",
            license=base_license(base),
            tags=tags,
        ),
        body,
    )


def write_run_card(run_dir, weights_dir, step: int | None = None) -> Path:
    """Write ``weights_dir/README.md`` (replacing peft's blank template) and, for the final weights
    (``step`` None), ``reward_curve.png`` beside it. Returns the card's path."""
    path = Path(weights_dir) / CARD
    run_card(run_dir, weights_dir, step, curve=step is None).save(path)
    return path


def is_ours(card_path: str | os.PathLike) -> bool:
    """Whether ``card_path`` is a card this module wrote (``glm-grpo push`` keeps those, replaces others)."""
    from huggingface_hub import ModelCard

    if not Path(card_path).is_file():
        return False
    try:
        return TAG in (ModelCard.load(card_path).data.get("tags") or [])
    except ValueError:
        return False
