"""The KL term's reference policy when it is reset during training (``grpo.ref_sync_steps``).

Without resets the reference is the starting model: a LoRA run's policy with its adapters off, full fine-tuning's
frozen reference engine. With ``grpo.ref_sync_steps`` N > 0 it is reset after every N-th step's update (ProRL's
reference resets; TRL's ``sync_ref_model``):

* LoRA (:class:`LoraReference`; TRL refuses ``sync_ref_model`` under PEFT): the adapters' weights are copied, whole,
  on every rank (under ZeRO-3 gathered once per reset), and the reference pass runs the policy with its adapters off
  plus the copy's low-rank update on each adapted projection, added by a forward hook as peft adds the live
  adapter's (the input cast to the adapter's dtype, ``B(A(x)) x scaling``, the sum cast back): right after a reset
  the reference's log-probs are the policy's. A hard reset only (``ref_sync_alpha`` 1): a mix of two adapters'
  factors is not a mix of their updates.
* full fine-tuning (:class:`ModelReference`): each trained parameter of the reference engine becomes
  ``ref_sync_alpha`` x the policy's + (1 - ref_sync_alpha) x its own (TRL's ``ref_model_mixup_alpha``), one
  parameter gathered at a time under ZeRO-3 (ds/gathering.py ``mix_into``).

Each checkpoint keeps the reference of a run that has reset it (``reference-<i>.safetensors``: the adapters' copy,
or the reference engine's trained parameters in shards of at most ``SHARD_BYTES``, which bound what rank 0 holds on
the host while it writes them; a resume reads them back, every rank agreeing that it could)::

    reference = for_run(cfg, engine, ref_engine, device)   # None without resets
    with reference.forward():          # LoRA: the reference's passes (base weights + the copy, after a reset)
        ...
    reference.reset(step)              # after step's update (collective under ZeRO-3)
    reference.write(checkpoint_dir, rank)  /  reference.read(checkpoint_dir)
"""

from __future__ import annotations

import contextlib
from functools import partial
from pathlib import Path

import torch

from ..ds.engine import SHARD_BYTES, gathered, is_zero3, mix_into, set_tensors, shard_groups, unwrap, whole_tensors
from ..lifecycle.checkpoint import REFERENCE_FILES as FILES
from .kept import KeptTensors, kept_files


def files(directory) -> list[Path]:
    """The reference's files in checkpoint ``directory``, in order ([] for none: saved before a reset)."""
    return kept_files(directory, FILES)


def for_run(cfg, engine, ref_engine, device: torch.device):
    """The run's reference with resets (``grpo.ref_sync_steps`` > 0): a :class:`LoraReference` or a
    :class:`ModelReference`; None without resets."""
    if cfg.grpo.ref_sync_steps == 0:
        return None
    if cfg.lora is None:
        return ModelReference(ref_engine, engine, cfg.grpo.ref_sync_alpha)
    return LoraReference(unwrap(engine), device, is_zero3(engine))


def _adapted_layers(peft_model) -> dict[str, torch.nn.Module]:
    """Module name -> each peft LoRA layer of the model (every one a plain LoRA linear with one adapter)."""
    from peft.tuners.lora import LoraLayer

    layers = {name: m for name, m in peft_model.named_modules() if isinstance(m, LoraLayer)}
    for name, layer in layers.items():
        if len(layer.active_adapters) != 1 or layer.lora_variant or not hasattr(layer, "base_layer"):
            raise ValueError(
                f"{name}: a reference reset copies one plain LoRA adapter per layer; this layer has "
                f"{layer.active_adapters} (variants {list(layer.lora_variant)})"
            )
    return layers


def _add_update(layer, args, kwargs, output, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """Forward hook: the copied adapter's update on ``layer``'s output, computed as peft computes the live one's."""
    x = args[0] if args else kwargs["x"]
    linear = torch.nn.functional.linear  # looked up per call: the linear ZeRO-3 installs, as peft's nn.Linear calls
    update = linear(linear(x.to(a.dtype), a), b) * scaling
    return (output + update).to(output.dtype)


class LoraReference(KeptTensors):
    """A LoRA run's reference: the base model until the first :meth:`reset`, then the base weights plus the adapters
    copied at the last reset."""

    pattern = FILES

    def __init__(self, peft_model, device: torch.device, zero3: bool):
        self.model, self.device, self.zero3 = peft_model, device, zero3
        self.layers = _adapted_layers(peft_model)
        self.copy: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # layer name -> (A, B); empty: the base model
        self.expected = {f"{name}.lora_{part}" for name in self.layers for part in "AB"}

    def _weights(self, layer) -> tuple[torch.nn.Parameter, torch.nn.Parameter]:
        name = layer.active_adapters[0]
        return layer.lora_A[name].weight, layer.lora_B[name].weight

    def reset(self, step: int) -> None:
        """Take the adapters' weights as they are now (collective under ZeRO-3: every rank gathers them)."""
        params = [p for layer in self.layers.values() for p in self._weights(layer)]
        with gathered(params, self.zero3), torch.no_grad():
            self.copy = {
                name: tuple(p.detach().clone().to(self.device) for p in self._weights(layer))
                for name, layer in self.layers.items()
            }
        self.step = step

    @contextlib.contextmanager
    def forward(self):
        """The reference inside the block: the adapters off, and the last reset's copy added where there is one."""
        hooks = []
        try:
            for name, (a, b) in self.copy.items():
                layer = self.layers[name]
                scaling = layer.scaling[layer.active_adapters[0]]
                hook = partial(_add_update, a=a, b=b, scaling=scaling)
                hooks.append(layer.register_forward_hook(hook, with_kwargs=True))
            with self.model.disable_adapter():
                yield
        finally:
            for hook in hooks:
                hook.remove()

    def _shards(self, rank: int):
        """One file: the copy as CPU tensors, ``<layer>.lora_A`` / ``<layer>.lora_B`` (rank 0's; every rank holds
        the same)."""
        if rank == 0:
            yield {f"{name}.lora_{p}": t.cpu() for name, (a, b) in self.copy.items() for p, t in zip("AB", (a, b))}

    def _take(self, get, step: int) -> None:
        self.copy = (
            {}
            if get is None
            else {
                name: (get(f"{name}.lora_A").to(self.device), get(f"{name}.lora_B").to(self.device))
                for name in self.layers
            }
        )
        self.step = step


class ModelReference(KeptTensors):
    """Full fine-tuning's reference engine, reset towards the policy engine: ``alpha`` x the policy + (1 - alpha) x
    itself, for each parameter the policy trains."""

    pattern = FILES

    def __init__(self, ref_engine, engine, alpha: float):
        self.ref, self.policy, self.alpha = unwrap(ref_engine), unwrap(engine), alpha
        self.zero3 = is_zero3(engine)
        self.names = [name for name, p in self.policy.named_parameters() if p.requires_grad]
        self.expected = set(self.names)

    def reset(self, step: int) -> None:
        """Mix the policy's weights as they are now into the reference (collective under ZeRO-3)."""
        mix_into(self.ref, self.policy, self.alpha, self.zero3)
        self.step = step

    def _shards(self, rank: int):
        """The reference's trained parameters, whole, in shards of at most SHARD_BYTES (a larger parameter alone):
        rank 0's hold the tensors, the others' are empty (collective: every rank gathers each parameter)."""
        for names in shard_groups(self.ref, self.names, SHARD_BYTES):
            yield whole_tensors(self.ref, names, self.zero3, rank)

    def _take(self, get, step: int) -> None:
        """The checkpoint's parameters into the reference engine, one at a time (every rank reads each: no rank
        holds more than one parameter of it); without files the engine holds the starting model already."""
        if get is not None:
            for name in self.names:
                set_tensors(self.ref, {name: get(name)}, self.zero3)
        self.step = step
