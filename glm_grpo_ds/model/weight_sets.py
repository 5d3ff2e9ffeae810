"""Several full sets of the AR's weights over one model in memory: ``glm-grpo evaluate`` comparing a full fine-tuning's
``final_model/`` with its base (and with LoRA adapters) on the same model. Each set is kept on the CPU and the one in
use is copied into the model's own parameters. Copying in place, rather than swapping modules, keeps every object
built over the model pointing at the same tensors: peft's layers (their ``base_layer`` holds the same Parameter), the
sampler, a captured CUDA graph. Host memory: one copy of the AR's weights per set, the base's included (~20 GiB each
for GLM-Image in bf16); a switch copies one set to the device (a few seconds at that size, once per batch and set)."""

from __future__ import annotations

import torch

from ..config import ConfigError


def _cpu_copy(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: p.detach().to("cpu", copy=True) for key, p in params.items()}


def _shape(t: torch.Tensor | None) -> str:
    return "missing" if t is None else str(list(t.shape))


class WeightSets:
    """The base's weights of ``ar`` and any number of other sets of the same shapes, one in use at a time."""

    def __init__(self, ar: torch.nn.Module):
        # the Parameter objects themselves: Module.to() replaces their .data, not them, and peft keeps them
        self._params = dict(ar.named_parameters())
        self._sets: dict[str | None, dict[str, torch.Tensor]] = {None: _cpu_copy(self._params)}
        self._current: str | None = None

    @property
    def names(self) -> list[str]:
        return [name for name in self._sets if name is not None]

    def add(self, name: str, other: torch.nn.Module, where: str) -> None:
        """``other``'s weights (a model of the AR's class) as set ``name``; refused in one line (ConfigError naming
        ``where``) when a parameter's name or shape differs from the base's."""
        params, base = dict(other.named_parameters()), self._sets[None]
        for key in sorted(base.keys() | params.keys()):
            mine, theirs = params.get(key), base.get(key)
            if mine is None or theirs is None or mine.shape != theirs.shape:
                raise ConfigError(
                    f"{where} does not fit the base model's AR: its {key} is {_shape(mine)}, the base's "
                    f"{_shape(theirs)}; give the base model the run trained"
                )
        self._sets[name] = _cpu_copy(params)

    @torch.no_grad()
    def use(self, name: str | None) -> None:
        """The model computes with set ``name``'s weights; a name without a set (the base, a LoRA adapter's): the
        base's."""
        name = name if name in self._sets else None
        if name == self._current:
            return
        for key, param in self._params.items():
            param.data.copy_(self._sets[name][key])
        self._current = name
