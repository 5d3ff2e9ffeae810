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

The pieces are elsewhere: the sections read from the run's files in run_sections.py, the base model's Hub id
and license, the usage code and the metadata (shared with merged_card.py) in card_parts.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..lifecycle.checkpoint import ADAPTER_EMA, FINAL_ADAPTER_EMA
from ..model.glm_image import AR_DIR
from ..observability.plot import PLOT_NAME, plot_training
from ..observability.records import read_run_record
from ..rewards.registry import reward_labels
from .card_parts import (
    CARD,
    TAG,
    TAGS,
    base_license,
    base_lines,
    base_model_id,
    make_card,
    random_lines,
    render_settings,
    usage_lines,
)
from .run_sections import (
    alarms_section,
    data_lines,
    results_section,
    reward_failures_section,
    run_results,
    segments_lines,
    training_section,
    versions_section,
)

CHECKPOINT_PREFIX = "checkpoints"  # checkpoints/step_N/ in the Hub repo, as in output_dir
# lora.ema_decay's moving average of the adapter: final_adapter_ema/ (and each checkpoint's adapter_ema/), uploaded
# to ema/ in the Hub repo beside the final adapter at its root
EMA_DIRS, EMA_SUBFOLDER = (FINAL_ADAPTER_EMA, ADAPTER_EMA), "ema"


def run_step_dir(step: int) -> str:
    """``step_000200``: a checkpoint's directory name (glm_grpo_ds.lifecycle.checkpoint.step_dir_name)."""
    return f"step_{step:06d}"


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


def _base(saved: dict) -> tuple[str, str | None, str | None, str | None]:
    """``(base, random name, Hub id, revision)`` of the base model the run of ``saved`` (its config.json) trained:
    where the trainer really loaded from (model/source.py: absolute directory, Hub id + commit) when recorded, else
    ``model.path``; a random: model (glm_grpo_ds/model/random_weights.py) is its name."""
    model, hub = saved["train"]["model"], saved["train"].get("hub") or {}
    source = saved.get("model_source") or {}
    random_name = source.get("random_weights")
    base = random_name or source.get("path") or model["path"]  # random: the name renders it
    if source.get("repo_id") and not hub.get("base_model"):
        return base, random_name, source["repo_id"], source.get("commit") or source.get("revision")
    return base, random_name, *base_model_id(base, model.get("revision"), hub.get("base_model"))


def _as_of(saved: dict, trainer_state: Path, step: int) -> dict:
    """``saved`` (config.json) as it was when checkpoint ``step`` was written: the training config its
    ``trainer_state.json`` holds (when it does) and the resumes' changes that came before it."""
    state = json.loads(trainer_state.read_text(encoding="utf-8")) if trainer_state.is_file() else {}
    segments = [seg for seg in saved.get("segments") or [] if int(seg.get("from_step", 0)) < step]
    config = state.get("config") if isinstance(state.get("config"), dict) else saved["train"]
    return {**saved, "train": config, "segments": segments}


def _where(hub: dict, weights: Path, step: int | None) -> tuple[str, str]:
    """Where readers of the card get the weights and the loading call's extra arguments: the Hub repo when the run
    uploads them there (a checkpoint's subfolder, the final average's ema/, the revision), else ``weights``'
    directory (a checkpoint's adapter_ema/ is not uploaded)."""
    ema = weights.name in EMA_DIRS
    uploaded = hub.get("repo_id") and (step is None or (hub.get("push_checkpoints") and not ema))
    extra = f', subfolder="{CHECKPOINT_PREFIX}/{run_step_dir(step)}"' if uploaded and step is not None else ""
    extra += f', subfolder="{EMA_SUBFOLDER}"' if uploaded and ema and step is None else ""
    extra += f', revision="{hub["revision"]}"' if uploaded and hub.get("revision") else ""
    return (hub["repo_id"] if uploaded else str(weights.resolve())), extra


def _ema_lines(decay, is_ema: bool, uploaded: bool, step: int | None) -> list[str]:
    """With ``lora.ema_decay``: whose weights the in-run evaluations sampled (the average's), said on every card."""
    if not decay:
        return []
    if is_ema:
        line = (
            f"These weights are the adapter's exponential moving average (lora.ema_decay {decay}, diffusers' "
            "EMAModel with its warm-up), which the in-run evaluations sampled: the eval rewards above are this "
            "average's, the training rewards the adapter's (`final_adapter/`)."
        )
    else:
        final = f"`final_adapter_ema/`{f', uploaded to `{EMA_SUBFOLDER}/`' if uploaded else ''}"
        where = final if step is None else "the checkpoint's `adapter_ema/`, not uploaded"
        line = (
            f"The eval rewards above are of the adapter's moving average (lora.ema_decay {decay}: {where}), which "
            "the in-run evaluations sampled; the training rewards are this adapter's."
        )
    return [line, ""]


def run_card(run_dir: str | os.PathLike, weights_dir: str | os.PathLike, step: int | None = None, curve=True, hub=None):
    """The ``ModelCard`` of ``weights_dir`` (an adapter or a full model) written by the run in
    ``run_dir``; ``step``: a checkpoint's card (results up to that step); ``hub``: where the weights are uploaded
    (``repo_id``, ``revision``, ``push_checkpoints``; default: the run's ``hub`` section; ``glm-grpo push`` with
    options of its own passes those)."""
    run, weights = Path(run_dir), Path(weights_dir)
    saved = read_run_record(run)
    if saved is None:
        raise FileNotFoundError(f"{run}/config.json not found: {run} is not a glm-grpo run directory")
    if step is not None:  # a checkpoint's card, written again later (glm-grpo push): its own settings, not a later
        saved = _as_of(saved, weights.parent / "trainer_state.json", step)  # launch's, and the changes before it
    cfg, ds = saved["train"], saved.get("deepspeed", {})
    hub = (cfg.get("hub") or {}) if hub is None else hub
    base, random_name, hub_id, revision = _base(saved)
    is_adapter = (weights / "adapter_config.json").is_file()
    labels = reward_labels(cfg["rewards"])
    res = run_results(run, step)
    decay = (cfg.get("lora") or {}).get("ema_decay")
    is_ema = weights.name in EMA_DIRS
    what = "LoRA adapter" if is_adapter else "fine-tuned autoregressive model"
    what = f"moving average (decay {decay}) of a LoRA adapter" if is_ema else what
    title = f"# {hub.get('repo_id') or run.resolve().name}" + (f": checkpoint at step {step}" if step else "")
    body = [
        title,
        "",
        f"A {what} for the autoregressive policy of GLM-Image (`{AR_DIR}`, "
        "`GlmImageForConditionalGeneration`), trained with GRPO by glm-grpo-ds on rewards computed from the "
        "images the frozen DiT decoder renders. "
        "The DiT, VAE and glyph encoder of the base pipeline are unchanged.",
        "",
        *(random_lines(random_name) if random_name else base_lines(base, hub_id, revision)),
        *data_lines(saved),
        "- rewards: " + ", ".join(f"{label} (weight {s['weight']})" for label, s in zip(labels, cfg["rewards"])),
        "",
        *results_section(res, cfg, labels),
        *_ema_lines(decay, is_ema, bool(hub.get("repo_id")), step),
    ]
    if curve and _curve(run, weights):
        body += [f"![reward curve]({PLOT_NAME})", ""]
    body += alarms_section(run, step)
    body += reward_failures_section(res)
    body += training_section(cfg, ds, labels)
    body += segments_lines(saved)
    where, extra = _where(hub, weights, step)
    body += usage_lines(
        "adapter" if is_adapter else "model",
        hub_id or (base if random_name else str(Path(base).resolve())),
        where,
        extra,
        render_settings(cfg),
        base_revision=revision if hub_id else None,
    )
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


def write_run_card(run_dir, weights_dir, step: int | None = None, hub: dict | None = None) -> Path:
    """Write ``weights_dir/README.md`` (replacing peft's blank template) and, for the final weights
    (``step`` None), ``reward_curve.png`` beside it; ``hub``: as :func:`run_card`. Returns the card's path."""
    path = Path(weights_dir) / CARD
    run_card(run_dir, weights_dir, step, curve=step is None, hub=hub).save(path)
    return path
