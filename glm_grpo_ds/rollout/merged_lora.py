"""Sampling with the LoRA adapters merged into the base weights, the frozen base restored bitwise afterwards.

    keep = BaseCopy("device")                       # once per run (the trainer): where the frozen base's copy lives
    with lora_merged(policy, keep):                 # W <- W + scale * B @ A, peft's wrappers out of the call path
        batch = rollout(policy, ...)                # a decode step issues the plain model's kernels
    # here every base weight is torch.equal to what it was, and the peft wrappers are back

Why: peft's LoRA layers run every adapted linear as the base matmul plus two adapter matmuls, dtype casts and a
scaled add, from Python: on the full-size AR (6 targets x 40 layers) ~1 000-1 400 extra kernels and ~12 000
Python calls per decode step (issue #39). Merged, the step is the plain model's. The trainer's passes (new, old
and reference log-probs) run outside the block with the unmerged adapters, so the first iteration's ratio is
still exactly 1; the sampler then draws from ``bf16(W + s B A)`` instead of ``W x + s B A x``, a rounding gap
that the ``mismatch/*`` metrics report and ``grpo.sampler_correction`` can correct.

Restoring: ``W + s B A - s B A`` is not ``W`` after rounding, so the base weights of the adapted linears are
copied once per run (:class:`BaseCopy`: on the device, or in pinned host memory, chosen by
``rollout.merge_copy``; the trainer makes the one copy and hands it to its samplers, rollout/backends.py) and
copied back after each rollout. Under ZeRO-3 on several ranks the rollout's gathered
parameters are buffers DeepSpeed discards when the gather ends, so nothing needs restoring and no copy is kept
(``restore=False``); at world size 1 a gathered parameter is the stored one and is restored like any other.
"""

from __future__ import annotations

import contextlib

import torch


class BaseCopy:
    """The frozen base weights of the adapted linears, copied the first time a merge sees them (the base never
    changes during training, so one copy serves every rollout). ``where``: ``"device"`` (the weights' own
    device: fastest restore, costs the bytes there) or ``"host"`` (pinned CPU memory when CUDA is present)."""

    def __init__(self, where: str = "device"):
        if where not in ("device", "host"):
            raise ValueError(f"BaseCopy: where must be 'device' or 'host', got {where!r}")
        self.where = where
        self.saved: dict[str, torch.Tensor] = {}

    def keep(self, name: str, weight: torch.Tensor) -> None:
        if name in self.saved:
            return
        if self.where == "device":
            self.saved[name] = weight.detach().clone()
        else:
            pinned = weight.device.type == "cuda"
            copy = torch.empty(weight.shape, dtype=weight.dtype, device="cpu", pin_memory=pinned)
            self.saved[name] = copy.copy_(weight.detach())

    def restore(self, name: str, weight: torch.Tensor) -> None:
        weight.copy_(self.saved[name], non_blocking=True)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.saved.values())


def adapted_linear_bytes(model) -> int:
    """Bytes of the base weights that :func:`lora_merged` copies (the planner's figure for ``BaseCopy``)."""
    return sum(w.numel() * w.element_size() for _, _, w in lora_layers(model))


def lora_layers(model):
    """``(name, module, base weight)`` of every peft LoRA layer of ``model``: what a merge adds a delta to."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module, module.get_base_layer().weight


def merged_weight(weight: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``W + D`` as a merge writes it: summed in fp32, rounded once to the weight's dtype."""
    return (weight.float() + delta).to(weight.dtype)


def kept_fraction(pairs) -> tuple[float, float]:
    """Over ``(weight, delta)`` pairs together, with ``got = merged_weight(W, D) - W``: the part of the deltas a merge
    keeps, ``<got, D> / |D|^2``, and its relative error ``|got - D| / |D|`` (NaN, NaN without a delta). A delta much
    smaller than the spacing of W's dtype rounds back to W: kept 0."""
    dot = dd = err = 0.0
    for w, d in pairs:
        got = merged_weight(w, d).float() - w.float()
        dot += float((got * d).sum())
        dd += float((d * d).sum())
        err += float(((got - d) ** 2).sum())
    return (dot / dd, (err / dd) ** 0.5) if dd > 0 else (float("nan"), float("nan"))


def lora_delta(module) -> torch.Tensor:
    """``scale * B @ A`` of the module's active adapters, in fp32 (peft's own ``get_delta_weight``)."""
    total = None
    for adapter in module.active_adapters:
        if adapter in module.lora_A:
            delta = module.get_delta_weight(adapter).float()
            total = delta if total is None else total + delta
    return total


@contextlib.contextmanager
def lora_merged(model, keep: BaseCopy | None, restore: bool = True):
    """Inside the block every peft LoRA layer of ``model`` is replaced in its parent by its base layer, whose
    weight holds ``W + s B A`` (computed in fp32, rounded once to the weight's dtype). On exit the wrappers go
    back and, with ``restore``, every base weight is copied back from ``keep`` (bitwise). Yields the number of
    merged layers. Refuses a partitioned parameter (ZeRO-3 outside the rollout's gather): it has no data."""
    layers = list(lora_layers(model))
    merged: list[tuple[torch.nn.Module, str, torch.nn.Module, str, torch.Tensor]] = []
    try:
        with torch.no_grad():
            for name, module, weight in layers:
                if weight.numel() == 0:
                    raise RuntimeError(
                        f"rollout.merge_lora: {name} is partitioned (ZeRO-3 without the rollout's gather); "
                        "set rollout.gather_parameters: true"
                    )
                delta = lora_delta(module)
                if restore:
                    keep.keep(name, weight)
                parent_name, _, child = name.rpartition(".")
                parent = model.get_submodule(parent_name)
                merged.append((parent, child, module, name, weight))
                if delta is not None:
                    weight.copy_(merged_weight(weight, delta))
                setattr(parent, child, module.get_base_layer())
        yield len(merged)
    finally:
        with torch.no_grad():
            for parent, child, module, name, weight in merged:
                setattr(parent, child, module)
                if restore:
                    keep.restore(name, weight)
