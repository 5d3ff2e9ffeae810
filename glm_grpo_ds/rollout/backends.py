"""Sampling backends: what the experience maker (glm_grpo_ds/experience.py) samples token grids with.

A backend turns prompts into a :class:`Sampled`: the :class:`RolloutBatch` (tokens, the sampler's log-probs under
the policy's distribution, glm_grpo_ds/sampling.py) and, when the trainer asked for them, the log-probs its update
needs from the same weights (reference / old), computed while the weights are gathered for sampling::

    sampler = EngineSampler(engine, processor, cfg, device, before_update=logprobs_fn)   # training, in-run eval
    sampler = ModelSampler(model, processor, cfg.rollout, sampling, device)              # the tools
    got = sampler.sample(["a red cube"], [generator], group_size=4)
    got.batch, got.ref_logps, got.old_logps

What a backend must provide (the seam a vLLM-class engine would plug into; docs/design.md "Sampling backends"):
``processor`` (the prompts' chat template), ``sample(prompts, generators, group_size, on_tokens)`` drawing each
prompt's rows from its own generator, log-probs of the drawn tokens under the policy's distribution (the
trainer compares them with its own: the ``mismatch/*`` metrics), the current weights (the engine sampler reads
them from the engine at every call; an external engine would need a weight sync per step), and its speed-ups
behind the decode loop's options (compile, CUDA graph capture: glm_grpo_ds/rollout/decode_loop.py).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch

from ..ds import engine as ds_engine
from ..model.adapters import adapters_in_base_dtype
from .batch import RolloutBatch
from .decode_loop import LoopOptions
from .fused_lora import lora_fused
from .generate import rollout
from .merged_lora import BaseCopy, lora_merged


@dataclass
class Sampled:
    """One sampling call's result. ``ref_logps`` / ``old_logps`` ``[N, n]``: the teacher-forced log-probs of the
    sampled tokens under the frozen reference and under the policy before its update, when the trainer asked
    for them to be computed inside the sampling's parameter gather (glm_grpo_ds/update.py
    ``logprobs_before_update``); None when not asked for (the update computes what it needs itself)."""

    batch: RolloutBatch
    ref_logps: torch.Tensor | None = None
    old_logps: torch.Tensor | None = None


class SamplingBackend(Protocol):
    processor: object

    def sample(
        self,
        prompts: list[str],
        generators: list[torch.Generator],
        group_size: int,
        on_tokens: Callable[[int, int], None] | None = None,
    ) -> Sampled: ...


def loop_options(rollout_cfg, whole: bool = True) -> LoopOptions:
    """The decode loop's speed-ups from the rollout section; ``whole``: the weights are materialised (not ZeRO-3
    sharded), which torch.compile, a CUDA graph capture and a merge need."""
    r = rollout_cfg
    return LoopOptions(compile=r.compile and whole, compile_scope=r.compile_scope, cuda_graph=r.cuda_graph and whole)


@contextlib.contextmanager
def sampling_adapters(model, rollout_cfg, whole: bool = True, merge: Callable | None = None):
    """Inside the block ``model``'s adapters sample as the rollout section asks: cast to the model dtype
    (``adapters_in_model_dtype``), then merged (``merge``: the merge's context, made by the trainer's backend) or
    fused (``fuse_lora``); ``whole``: the weights are materialised (a fusion needs them, as a merge does)."""
    r = rollout_cfg
    with contextlib.ExitStack() as stack:
        if r.adapters_in_model_dtype:
            stack.enter_context(adapters_in_base_dtype(model))
        if merge is not None:
            stack.enter_context(merge())
        if r.fuse_lora and whole:
            stack.enter_context(lora_fused(model))
        yield


_base_copies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def base_copy(policy, where: str) -> BaseCopy:
    """The run's one :class:`BaseCopy` of ``policy`` (``rollout.merge_copy``; ``auto`` unresolved by the trainer's
    memory plan, e.g. in a benchmark, keeps it on the device)."""
    if policy not in _base_copies:
        _base_copies[policy] = BaseCopy("host" if where == "host" else "device")
    return _base_copies[policy]


class EngineSampler:
    """The trainer's backend: samples with the policy inside a DeepSpeed engine, the parameters gathered once for
    the whole rollout under ZeRO-3 (``rollout.gather_parameters`` unless ``gather`` says otherwise), the adapters
    cast / merged for sampling as the rollout section asks. ``before_update(policy, batch) -> (ref, old)``, if
    given, runs inside that same gather with the adapters the trainer trains (outside the cast and the merge)."""

    def __init__(
        self,
        engine,
        processor,
        cfg,
        device: torch.device,
        before_update: Callable | None = None,
        gather: bool | None = None,
    ):
        self.engine, self.processor, self.cfg, self.device = engine, processor, cfg, device
        self.before_update = before_update
        self.gather = cfg.rollout.gather_parameters if gather is None else gather

    def sample(self, prompts, generators, group_size, on_tokens=None) -> Sampled:
        engine, r = self.engine, self.cfg.rollout
        policy = ds_engine.unwrap(engine)
        policy.eval()
        # a sharded ZeRO-3 rollout fetches parameters in per-module hooks, which torch.compile cannot trace, a
        # CUDA graph cannot capture and a merge cannot write into
        whole = self.gather or not ds_engine.is_zero3(engine)
        with torch.no_grad(), ds_engine.gathered_for_rollout(engine, self.gather):
            merge = None
            if r.merge_lora and whole:
                restore = not ds_engine.gather_discards_writes(engine, self.gather)
                merge = partial(lora_merged, policy, base_copy(policy, r.merge_copy), restore)
            with sampling_adapters(policy, r, whole, merge):
                batch = rollout(
                    policy,
                    self.processor,
                    prompts,
                    group_size,
                    r.height,
                    r.width,
                    self.cfg.grpo.sampling,
                    generators,  # one for all rows or one per prompt: rollout() takes either list
                    self.device,
                    loop_options(r, whole),
                    on_tokens,
                )
            if self.before_update is None:
                return Sampled(batch)
            with ds_engine.training_linear():
                ref, old = self.before_update(policy, batch)
        return Sampled(batch, ref, old)


class ModelSampler:
    """The tools' backend: a model on this process's device outside DeepSpeed (a plain AR, or a peft model with
    the adapter it computes as set active: glm_grpo_ds/evaluation/paired.py). The rollout section's loop options,
    ``adapters_in_model_dtype`` and ``fuse_lora`` apply as in training; ``merge_lora`` does not (a peft model
    holding several adapters shares one base: the tools sample the unmerged policy, the exact one)."""

    def __init__(self, model, processor, rollout_cfg, sampling, device: torch.device):
        self.model, self.processor, self.rollout_cfg, self.sampling, self.device = (
            model,
            processor,
            rollout_cfg,
            sampling,
            device,
        )

    def sample(self, prompts, generators, group_size, on_tokens=None) -> Sampled:
        r = self.rollout_cfg
        with torch.no_grad(), sampling_adapters(self.model, r):
            batch = rollout(
                self.model,
                self.processor,
                prompts,
                group_size,
                r.height,
                r.width,
                self.sampling,
                generators,
                self.device,
                loop_options(r),
                on_tokens,
            )
        return Sampled(batch)
