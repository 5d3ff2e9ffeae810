"""The model card (``README.md``) of a merged pipeline, written by ``glm-grpo merge``
(glm_grpo_ds/commands/merge.py): the base model, the adapter (or checkpoint) it came from, the merged
dtype, and, when the adapter has a glm-grpo card (glm_grpo_ds/sharing/model_card.py), that card's results,
alarms, reward failures and training sections with its reward curve.

    write_merged_card(OUT.tmp, BASE, ADAPTER, "bf16", final_dir=OUT)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..model.glm_image import AR_DIR
from ..observability.plot import PLOT_NAME
from ..observability.records import run_config
from .card_parts import (
    CARD,
    TAG,
    TAGS,
    base_license,
    base_lines,
    base_model_id,
    is_ours,
    make_card,
    render_settings,
    usage_lines,
)


def _section(card_text: str, heading: str) -> list[str]:
    """The lines of ``## heading`` in a card of ours, without the heading (empty if absent)."""
    lines, out, inside = card_text.splitlines(), [], False
    for line in lines:
        if line.startswith("## "):
            inside = line[3:].strip() == heading
            continue
        if inside:
            out.append(line)
    return out


def _is_lora(src: Path) -> bool:
    """An adapter directory (or a checkpoint holding one, or a LoRA run's checkpoint), not full fine-tuning."""
    if any((d / "adapter_config.json").is_file() for d in (src, src / "adapter", src / "final_adapter")):
        return True
    state = src / "trainer_state.json"
    return state.is_file() and bool(json.loads(state.read_text(encoding="utf-8")).get("lora"))


def _trained_render(src: Path) -> dict | None:
    """The image size, decoder steps and guidance of the run that wrote ``src`` (a checkpoint's trainer state, else its
    run's ``config.json`` above it), for the card's snippet; None (GLM-Image's own) when not found."""
    state = src / "trainer_state.json"
    cfg = json.loads(state.read_text(encoding="utf-8")).get("config") if state.is_file() else None
    if not cfg:
        try:
            found = run_config(src)
        except ValueError:  # a run config cut off or edited: the snippet keeps GLM-Image's own settings
            found = None
        cfg = found[1] if found else None
    return render_settings(cfg) if cfg else None


def merged_card(base, adapter_src, card_src: Path | None, dtype: str, out_dir):
    """The card of a merged pipeline: base + ``adapter_src`` (adapter or checkpoint directory);
    ``card_src``: the adapter's own card, whose results and training summary are carried over."""
    from huggingface_hub import ModelCard

    hub_id, revision = base_model_id(str(base))
    lora = _is_lora(Path(adapter_src))
    what = (
        "a glm-grpo-ds GRPO adapter merged into the weights of" if lora else "the GRPO-fine-tuned weights in place of"
    )
    body = [
        "# GLM-Image + GRPO adapter (merged)" if lora else "# GLM-Image fine-tuned with GRPO",
        "",
        f"A complete `GlmImagePipeline`: the base pipeline with {what} its autoregressive model (`{AR_DIR}`); every "
        "other component is the base model's, unchanged.",
        "",
        *base_lines(str(base), hub_id, revision),
        f"- {'adapter' if lora else 'fine-tuned weights'}: `{adapter_src}`",
        f"- {'merged ' if lora else ''}weights dtype: {dtype}",
        "",
    ]
    tags = [*TAGS, *(["lora"] if lora else []), "merged", TAG]
    if card_src is not None and is_ours(card_src):
        text = ModelCard.load(card_src).text
        for heading in ("Results", "Alarms", "Reward failures", "Training"):
            section = _section(text, heading)
            if section:
                body += [f"## {heading} (of the adapter)", *section]
    elif card_src is not None:
        body += ["The adapter's own card is not a glm-grpo-ds card; see it for its training.", ""]
    else:
        body += ["The adapter came without a card (a checkpoint consolidated from its DeepSpeed shards).", ""]
    render = _trained_render(Path(adapter_src))
    body += usage_lines("pipeline", hub_id or str(Path(base).resolve()), str(Path(out_dir).resolve()), render=render)
    return make_card(
        dict(
            base_model=hub_id,
            library_name="diffusers",
            pipeline_tag="text-to-image",
            license=base_license(str(base)),
            tags=tags,
        ),
        body,
    )


def write_merged_card(out_dir, base, adapter_src, dtype: str, final_dir=None) -> Path:
    """``out_dir/README.md`` of a merged pipeline (replacing the base model's card copied with it), and
    the adapter's reward curve beside it when it has one; ``final_dir``: where ``out_dir`` will be
    renamed to (named in the card's snippet)."""
    src = Path(adapter_src)
    card_src = next((d / CARD for d in (src, src / "adapter", src / "final_adapter") if (d / CARD).is_file()), None)
    if card_src is not None and (card_src.parent / PLOT_NAME).is_file():
        shutil.copyfile(card_src.parent / PLOT_NAME, Path(out_dir) / PLOT_NAME)
    path = Path(out_dir) / CARD
    merged_card(base, src, card_src, dtype, final_dir or out_dir).save(path)
    return path
