"""Reward registry (built-in names and ``python:`` / file plugins) and the weighted combination."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from pathlib import Path
from typing import Callable

import torch

_BUILTINS: dict[str, Callable[..., Callable]] = {}


def register_reward(name: str, factory: Callable[..., Callable]) -> None:
    """Make ``name`` usable in configs; ``factory(**args)`` returns the reward callable."""
    _BUILTINS[name] = factory


def _register_builtins() -> None:
    from .pixel import PixelMSEReward

    register_reward("pixel_mse", PixelMSEReward)


_register_builtins()


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
        raise ValueError(f"unknown reward {name!r}{hint} (built-ins: {', '.join(sorted(_BUILTINS))}; or python:module:function)")
    return _BUILTINS[name](**args)


class CombinedReward:
    """Weighted sum of rewards; returns ``(total [N], per-reward {name: [N]})``."""

    def __init__(self, rewards: list[tuple[str, float, Callable]]):
        self.rewards = rewards

    def __call__(self, images: torch.Tensor, prompts: list[str], samples: list[dict]):
        per: dict[str, torch.Tensor] = {}
        total = torch.zeros(images.shape[0], device=images.device)
        for name, weight, fn in self.rewards:
            values = torch.as_tensor(fn(images, prompts, samples), dtype=torch.float32, device=images.device).reshape(-1)
            if values.shape[0] != images.shape[0]:
                raise ValueError(f"reward {name} returned {values.shape[0]} values for {images.shape[0]} images")
            if torch.isnan(values).any():
                bad = int(torch.isnan(values).sum())
                raise ValueError(
                    f"reward {name} is undefined (NaN) for {bad} of {values.shape[0]} samples; "
                    "e.g. pixel_mse needs a target_image in every dataset row"
                )
            per[name] = values
            total = total + weight * values
        return total, per


def build_rewards(specs) -> CombinedReward:
    """From config ``RewardSpec``s."""
    return CombinedReward([(s.name, s.weight, build_reward(s.name, dict(s.args))) for s in specs])
