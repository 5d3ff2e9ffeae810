"""The pieces every glm-grpo model card is made of, a run's (model_card.py) and a merged pipeline's
(merged_card.py): the base model's Hub id and license, the "How to use" code, the card's YAML metadata and the
tag that marks a card as ours.

``base_model`` is a Hub id or nothing: the Hub refuses a README whose ``base_model`` is a local path
(transformers#33922). It is ``hub.base_model`` when set, else ``model.path`` when that is a Hub id
(``namespace/name``) or a snapshot in a Hugging Face cache (``.../models--ns--name/snapshots/<sha>``,
whose sha is the revision); a plain local directory is named in the text only.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..config.fields import is_repo_id

CARD = "README.md"
TAG = "glm-grpo-ds"  # marks a card this module wrote (a peft or other card is replaced, ours kept)
TAGS = ["glm-image", "grpo", "text-to-image"]


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


def base_lines(path: str, hub_id: str | None, revision: str | None) -> list[str]:
    name = f"[{hub_id}](https://huggingface.co/{hub_id})" if hub_id else f"`{path}` (a local directory)"
    rev = f", revision `{revision}`" if revision else ""
    return [f"- base model: {name}{rev}"]


def random_lines(name: str) -> list[str]:
    """A run on a ``random:`` model (glm_grpo_ds/model/random_weights.py): said where the base model would be."""
    return [f"- base model: `{name}`, **random weights**: time and memory figures only; these weights, images, rewards "
            "and results mean nothing"]  # fmt: skip


def render_settings(cfg: dict) -> dict | None:
    """A run's image size, decoder steps and guidance from its training config (``to_dict`` form), for
    :func:`usage_lines`; None when the config lacks one (an older run's)."""
    rollout, decoder = cfg.get("rollout") or {}, cfg.get("decoder") or {}
    render = dict(
        height=rollout.get("height"),
        width=rollout.get("width"),
        num_inference_steps=decoder.get("num_inference_steps"),
        guidance_scale=decoder.get("guidance_scale"),
    )
    return None if None in render.values() else render


def usage_lines(
    kind: str,
    base_ref: str,
    weights: str,
    extra: str = "",
    render: dict | None = None,
    base_revision: str | None = None,
) -> list[str]:
    """How to load the weights: ``kind`` adapter | model | pipeline; ``base_ref`` / ``weights``: Hub ids or
    absolute directories (a card is read from anywhere, so never a path relative to where training ran);
    ``extra``: more from_pretrained arguments of the weights (``, subfolder=..., revision=...``);
    ``render``: the run's image size, decoder steps and guidance (else GLM-Image's 1024, 30 and 1.5);
    ``base_revision``: the base's commit the run trained on (a Hub base): the code and commands load that one,
    not whatever its main is by then."""
    r = {"height": 1024, "width": 1024, "num_inference_steps": 30, "guidance_scale": 1.5, **(render or {})}
    pin = f', revision="{base_revision}"' if base_revision else ""
    pin_flag = f" --revision {base_revision}" if base_revision else ""
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
            f'pipe = GlmImagePipeline.from_pretrained("{base_ref}"{pin}, dtype=dtype)',
            "# unmerged, as it was trained: merged into bf16 weights, a small change is mostly rounded away",
            "pipe.vision_language_encoder = PeftModel.from_pretrained(",
            f'    pipe.vision_language_encoder, "{weights}"{extra}',
            ")",
        ]
    else:
        load = [
            "from transformers import GlmImageForConditionalGeneration",
            "",
            f'ar = GlmImageForConditionalGeneration.from_pretrained("{weights}"{extra}, dtype=dtype)',
            f'pipe = GlmImagePipeline.from_pretrained("{base_ref}"{pin}, vision_language_encoder=ar, dtype=dtype)',
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
            f'glm-grpo render --model {base_ref}{pin_flag} --adapter {adapter} --prompt "a red cube on a wooden table" '
            + size,
            f"glm-grpo merge --base {base_ref}{pin_flag} --adapter {adapter} --out GLM-Image-grpo   # a pipeline",
            "```",
            "",
        ]
    return lines


def make_card(data_kwargs: dict, body: list[str]):
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(**{k: v for k, v in data_kwargs.items() if v is not None})
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body).rstrip() + "\n")


# huggingface_hub's model card template, which peft's save_pretrained fills in an adapter directory
TEMPLATE_MARK = "<!-- Provide a quick summary of what the model is/does. -->"


def is_users(card_path: str | os.PathLike) -> bool:
    """Whether ``card_path`` is a card someone wrote: there, neither this module's (:func:`is_ours`) nor the template
    peft fills in when it saves an adapter. ``glm-grpo push`` uploads such a card as it is."""
    path = Path(card_path)
    return path.is_file() and not is_ours(path) and TEMPLATE_MARK not in path.read_text(encoding="utf-8")


def is_ours(card_path: str | os.PathLike) -> bool:
    """Whether ``card_path`` is a card this module wrote (``glm-grpo push`` keeps those, writes them again for another
    repo, replaces peft's template)."""
    from huggingface_hub import ModelCard

    if not Path(card_path).is_file():
        return False
    try:
        return TAG in (ModelCard.load(card_path).data.get("tags") or [])
    except ValueError:
        return False
