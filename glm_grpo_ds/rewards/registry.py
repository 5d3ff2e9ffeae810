"""Reward registry (built-in names and ``python:`` / file plugins) and the reward set of a run."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from pathlib import Path
from typing import Callable

import torch

_BUILTINS: dict[str, str] = {
    # name -> "module:Class" (imported on use, so e.g. OCR deps are only needed when asked for)
    "pixel_mse": "pixel:PixelMSEReward",
    "lpips": "lpips_reward:LPIPSReward",
    "ssim": "ssim:SSIMReward",
    "ocr": "ocr:OCRReward",
    "clip": "clip:CLIPReward",
    "preference": "clip:PreferenceReward",
    "aesthetic": "clip:AestheticReward",
}


def register_reward(name: str, target: str | Callable) -> None:
    """Make ``name`` usable in configs: ``target`` is a factory ``(**args) -> reward`` or a
    ``module:attr`` string inside this package."""
    _BUILTINS[name] = target


def builtin_names() -> list[str]:
    return sorted(_BUILTINS)


def _load_plugin(spec: str) -> Callable:
    """``python:pkg.mod:attr`` or ``path/to/file.py:attr``."""
    target = spec[len("python:") :] if spec.startswith("python:") else spec
    module_name, sep, attr = target.rpartition(":")
    if not sep or not attr:
        raise ValueError(f"reward {spec!r}: expected python:package.module:function or path/file.py:function")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ValueError(f"reward {spec!r}: file {path} does not exist")
        mod_spec = importlib.util.spec_from_file_location(f"glm_grpo_reward_{path.stem}", path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(f"reward {spec!r}: cannot import {module_name} ({err})") from None
    if not hasattr(module, attr):
        raise ValueError(f"reward {spec!r}: {module_name} has no attribute {attr!r}")
    return getattr(module, attr)


def build_reward(name: str, args: dict) -> Callable:
    if name.startswith("python:") or ".py:" in name:
        obj = _load_plugin(name)
        return obj(**args) if args else obj
    if name not in _BUILTINS:
        close = difflib.get_close_matches(name, list(_BUILTINS), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown reward {name!r}{hint} (built-ins: {', '.join(builtin_names())}; or python:module:function)")
    target = _BUILTINS[name]
    if isinstance(target, str):
        module_name, attr = target.split(":")
        target = getattr(importlib.import_module(f"{__package__}.{module_name}"), attr)
    try:
        return target(**args)
    except TypeError as err:
        raise ValueError(f"reward {name}: bad args {args} ({err})") from None


class RewardSet:
    """The rewards of a run; ``__call__`` returns ``{label: [N] float32}`` (NaN = undefined)."""

    def __init__(self, rewards: list[tuple[str, float, Callable]]):
        self.labels = [label for label, _, _ in rewards]
        self.weights = {label: weight for label, weight, _ in rewards}
        self.fns = {label: fn for label, _, fn in rewards}

    def __call__(self, images: torch.Tensor, prompts: list[str], samples: list[dict]) -> dict[str, torch.Tensor]:
        out = {}
        for label in self.labels:
            values = torch.as_tensor(self.fns[label](images, prompts, samples), dtype=torch.float32)
            values = values.to(images.device).reshape(-1)
            if values.shape[0] != images.shape[0]:
                raise ValueError(f"reward {label} returned {values.shape[0]} values for {images.shape[0]} images")
            out[label] = values
        return out


def build_rewards(specs) -> RewardSet:
    """From config ``RewardSpec``s; a name used twice gets ``#2``, ``#3`` appended as its label."""
    seen: dict[str, int] = {}
    built = []
    for s in specs:
        seen[s.name] = seen.get(s.name, 0) + 1
        label = s.name if seen[s.name] == 1 else f"{s.name}#{seen[s.name]}"
        built.append((label, s.weight, build_reward(s.name, dict(s.args))))
    return RewardSet(built)
