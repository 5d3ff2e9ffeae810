"""Shared pieces of the built-in rewards: frozen models that visit the images' device, the
per-sample target images / texts, and :class:`SampleNeed`, what a reward needs of a sample."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..runtime import log
from .targets import load_target


@dataclass(frozen=True)
class SampleNeed:
    """A field a reward needs of a sample (else its value there is undefined, NaN).

    A reward class (or plugin function) declares it as ``needs = SampleNeed(...)``; the trainer
    refuses, before any model loads, a prompt file where no row has it (registry.check_reward_inputs),
    and ``glm-grpo score`` refuses a command line that lacks it."""

    field: str  # the dataset row's field, e.g. "target_image"
    present: Callable[[str, dict], bool]  # (prompt, sample) -> whether this sample has it
    fix: str  # how to add it to a prompt file


TARGET_IMAGE = SampleNeed(
    "target_image",
    lambda prompt, sample: bool(sample.get("target_image")),
    "give the rows a target image (the data.target_image_key column / JSON key), or remove the reward",
)


class FrozenModel:
    """A reward model loaded once per rank: eval mode, no gradients. It moves to the device of the
    images it scores; with ``offload`` it goes back to the CPU after each call (frees accelerator
    memory between rollouts at the cost of a copy per step)."""

    def __init__(self, module: torch.nn.Module, offload: bool = False):
        self.module = module.eval().requires_grad_(False)
        self.offload = offload

    @contextlib.contextmanager
    def on(self, device: torch.device):
        first = next(self.module.parameters(), None)
        if first is not None and first.device != device:
            self.module.to(device)
        try:
            with torch.no_grad():
                yield self.module
        finally:
            if self.offload:
                self.module.to("cpu")


def frozen_pretrained(model_class, model: str, what: str, offload: bool = False) -> tuple[FrozenModel, Path | str]:
    """``model_class.from_pretrained(model)`` as a :class:`FrozenModel`, with the path or Hub id it was read from (for
    its processor); weights the checkpoint lacks or that were not read are refused in one line naming ``what``."""
    from ..runtime.loading_info import refusal, unread_weights

    path = Path(model).expanduser() if Path(model).expanduser().is_dir() else model  # else a Hub id
    module, info = model_class.from_pretrained(path, output_loading_info=True)
    problem = unread_weights(info)
    if problem:
        raise RewardError(refusal(f"{what} {model}", problem))
    return FrozenModel(module, offload), path


def stack_targets(samples: list[dict], height: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(targets [N, 3, H, W] in [0, 1], has_target [N] bool)``; rows without a target get zeros, and so do rows
    whose target cannot be read (a file truncated or replaced since the start's check): warned once per file, the
    reward undefined for that row alone, not the batch."""
    targets = torch.zeros(len(samples), 3, height, width, device=device)
    has = torch.zeros(len(samples), dtype=torch.bool, device=device)
    on_device: dict[str, torch.Tensor | None] = {}  # each file copied once: a group's G rows share their target
    for i, sample in enumerate(samples):
        path = sample.get("target_image")
        if path and path not in on_device:
            try:
                on_device[path] = load_target(path, height, width).to(device)
            except ValueError as err:
                log.warning_once(f"target:{path}", f"glm-grpo: {err}; the rows with it score undefined", True)
                on_device[path] = None
        if path and on_device[path] is not None:
            targets[i] = on_device[path]
            has[i] = True
    return targets, has


def glyph_texts(prompt: str) -> list[str]:
    """Quoted spans of a prompt, as ``GlmImagePipeline.get_glyph_texts`` extracts them for the DiT."""
    from diffusers import GlmImagePipeline

    return GlmImagePipeline.get_glyph_texts(None, prompt)[0]


def text_to_render(prompt: str, sample: dict) -> str | None:
    """The dataset row's ``text`` if given (a list of regions: joined by spaces), else the prompt's quoted spans
    joined by spaces; None if neither."""
    text = sample.get("text")
    if isinstance(text, (list, tuple)):
        text = " ".join(str(t) for t in text if t is not None and str(t).strip())  # a JSON null is no region
    if text:
        return str(text)
    spans = [s for s in glyph_texts(prompt) if s.strip()]
    return " ".join(spans) if spans else None


TEXT_TO_RENDER = SampleNeed(
    "text",
    lambda prompt, sample: text_to_render(prompt, sample) is not None,
    "give the rows a text (the data.text_key column / JSON key) or quote the text in the prompts, or remove the reward",
)


def normalise_text(text: str, case_sensitive: bool) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if case_sensitive else text.lower()


class RewardError(ValueError):
    """A reward that cannot be built (unknown name, bad plugin, bad args) or that broke its contract (not one value
    per image); the message says which."""


def reward_values(label: str, raw, n: int, device=None) -> torch.Tensor:
    """A reward function's return for ``n`` images as ``[n]`` float32, NaN where it is undefined: None (not applicable
    to that sample, TRL's convention), NaN and +-inf (an infinite reward would make every advantage of its group
    NaN). ``[n, 1]``, ``[1, n]`` and for one image a single number are read as ``[n]``; any other shape or count is
    a RewardError (an input error: one line, exit 2)."""
    if isinstance(raw, (list, tuple)):
        raw = [float("nan") if value is None else value for value in raw]
    try:
        values = torch.as_tensor(raw, dtype=torch.float32).detach().to(device)
    except torch.OutOfMemoryError:  # the copy to the device met a full GPU: not the values' fault (memory/oom.py)
        raise
    except (TypeError, ValueError, RuntimeError) as err:  # a function, a string, ragged lists: not numbers
        raise RewardError(
            f"reward {label} returned {type(raw).__name__}, not numbers ({err}): a reward returns one value per "
            "image (a [N] tensor or a list; None or NaN where it is undefined)"
        ) from None
    # a model head's [n, 1] column, a [1, n] row and, for one image, one number (.squeeze() of [1, 1]) hold one value
    # per image; flattening any other shape would give the values to the wrong images ([2, n/2] is not [n])
    if values.numel() == n and (values.dim() == 0 or (values.dim() == 2 and 1 in values.shape)):
        values = values.reshape(-1)
    if values.dim() != 1 or values.shape[0] != n:
        got = f"{values.numel()} values" if values.dim() <= 1 else f"shape {list(values.shape)}"
        raise RewardError(
            f"reward {label} returned {got} for {n} images: a reward returns one per image (a [N] tensor or a "
            "list; None or NaN where it is undefined)"
        )
    return torch.where(torch.isfinite(values), values, torch.full_like(values, float("nan")))
