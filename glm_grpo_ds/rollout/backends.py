"""Sampling backends: what the experience maker (glm_grpo_ds/experience/path.py) samples token grids with.

A backend turns prompts into a :class:`Sampled`: the :class:`RolloutBatch` (tokens, the sampler's log-probs under
the policy's distribution, glm_grpo_ds/sampling.py) and, when the trainer asked for them, the log-probs its update
needs from the same weights (reference / old), computed while the weights are gathered for sampling::

    keep = BaseCopy("device")                                     # rollout.merge_lora: the run's one base copy
    sampler = EngineSampler(engine, processor, cfg, device, before_update=logprobs_fn, base_copy=keep)  # training
    sampler = ModelSampler(model, processor, cfg.rollout, sampling, device)                            # the tools
    got = sampler.sample(["a red cube"], [seed], group_size=4)
    got.batch, got.ref_logps, got.old_logps
    sampler.sync_weights(step)                                     # the trainer, after each step's update phase

What a backend must provide (:class:`SamplingBackend`, the seam a vLLM-class engine would plug into;
docs/design.md "Sampling backends"): ``processor`` (the prompts' chat template); ``sample(prompts, seeds,
group_size, on_tokens)`` drawing each prompt's rows from the stream its integer seed starts (one seed for all
rows, or one per prompt; the caller derives them: runtime/seeding.py, evaluation/seeds.py), with the log-probs of
the drawn tokens under the policy's distribution (the trainer compares them with its own: the ``mismatch/*``
metrics); ``sync_weights(step)``, called by the trainer once the start weights are loaded and after each step's
update phase: the in-process backends
read the current weights at every call and do nothing there, an out-of-process engine would receive the new
weights; and its speed-ups behind the decode loop's options (compile, CUDA graph capture:
glm_grpo_ds/rollout/decode_loop.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol, runtime_checkable

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


@runtime_checkable
class SamplingBackend(Protocol):
    """What :class:`~glm_grpo_ds.experience.ExperienceMaker` and the trainer need of a sampler (module docstring)."""

    processor: object

    def sample(
        self,
        prompts: list[str],
        seeds: list[int],
        group_size: int,
        on_tokens: Callable[[int, int], None] | None = None,
    ) -> Sampled:
        """``group_size`` rows per prompt, group by group; ``seeds``: one for all rows, or one per prompt."""
        ...

    def sync_weights(self, step: int) -> None:
        """The policy's weights after ``step`` steps are the ones to sample with from now on: called once the
        weights the run starts from are loaded (``step`` = the start step: 0, or a resumed checkpoint's), then after
        each step's update phase."""
        ...


def seeded_generators(seeds: list[int], device: torch.device) -> list[torch.Generator]:
    """The sampling streams of ``seeds`` on ``device`` (where the rollout draws its noise), one per seed: a
    generator seeded with the same integer on the same device draws the same tokens."""
    return [torch.Generator(device=device).manual_seed(seed) for seed in seeds]


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


class EngineSampler:
    """The trainer's backend: samples with the policy inside a DeepSpeed engine, the parameters gathered once for
    the whole rollout under ZeRO-3 (``rollout.gather_parameters`` unless ``gather`` says otherwise), the adapters
    cast / merged for sampling as the rollout section asks. ``before_update(policy, batch) -> (ref, old)``, if
    given, runs inside that same gather with the adapters the trainer trains (outside the cast and the merge).

    ``base_copy``: with ``rollout.merge_lora``, the run's one :class:`BaseCopy` of the frozen base weights, which
    every sampler of the policy shares (the trainer makes it where its memory plan places it); None where the
    merge restores nothing (no merge, or ZeRO-3 on several ranks, whose gathered weights are discarded)."""

    def __init__(
        self,
        engine,
        processor,
        cfg,
        device: torch.device,
        before_update: Callable | None = None,
        gather: bool | None = None,
        base_copy: BaseCopy | None = None,
    ):
        self.engine, self.processor, self.cfg, self.device = engine, processor, cfg, device
        self.before_update, self.base_copy = before_update, base_copy
        self.gather = cfg.rollout.gather_parameters if gather is None else gather

    def sample(self, prompts, seeds, group_size, on_tokens=None) -> Sampled:
        engine, r = self.engine, self.cfg.rollout
        policy = ds_engine.unwrap(engine)
        if threading.current_thread() is threading.main_thread():
            policy.eval()
        elif policy.training:  # a mode change here would race the main thread's use of the module
            raise RuntimeError(
                "EngineSampler: a background rollout found the policy in training mode: put it in eval mode on the "
                "caller's thread before (experience/off_policy.py RolloutAhead.start does)"
            )
        # a sharded ZeRO-3 rollout fetches parameters in per-module hooks, which torch.compile cannot trace, a
        # CUDA graph cannot capture and a merge cannot write into
        whole = self.gather or not ds_engine.is_zero3(engine)
        with torch.no_grad(), ds_engine.gathered_for_rollout(engine, self.gather):
            merge = None
            # ZeRO-3 on several ranks: the merge writes W + sBA into full buffers the gather frees, unrestored
            merged_away = r.merge_lora and whole and ds_engine.gather_discards_writes(engine, self.gather)
            if r.merge_lora and whole:
                if not merged_away and self.base_copy is None:
                    raise ValueError(
                        "EngineSampler: rollout.merge_lora needs base_copy (the run's BaseCopy) to restore the base"
                    )
                merge = partial(lora_merged, policy, self.base_copy, not merged_away)
            with sampling_adapters(policy, r, whole, merge):
                batch = rollout(
                    policy,
                    self.processor,
                    prompts,
                    group_size,
                    r.height,
                    r.width,
                    self.cfg.grpo.sampling,
                    seeded_generators(seeds, self.device),  # one for all rows or one per prompt: rollout() takes either
                    self.device,
                    loop_options(r, whole),
                    on_tokens,
                )
            if self.before_update is None:
                return Sampled(batch)
            if not merged_away:
                return self._before_update(policy, batch)
        # the gathered buffers still held the merged W + sBA: the reference (adapters off) and old passes would have
        # read the sampling policy's weights as the base. They gather the base again, as the rollout did
        with torch.no_grad(), ds_engine.gathered_for_rollout(engine, self.gather):
            return self._before_update(policy, batch)

    def _before_update(self, policy, batch: RolloutBatch) -> Sampled:
        """``batch`` with the update's log-probs from the weights gathered now (``before_update``)."""
        with ds_engine.training_linear():
            ref, old = self.before_update(policy, batch)
        return Sampled(batch, ref, old)

    def sync_weights(self, step: int) -> None:
        """Nothing to do: the sampler samples with the engine's own model, whose weights the optimizer has just
        updated (a merge takes the adapters as they are at each :meth:`sample`)."""


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

    def sample(self, prompts, seeds, group_size, on_tokens=None) -> Sampled:
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
                seeded_generators(seeds, self.device),
                self.device,
                loop_options(r),
                on_tokens,
            )
        return Sampled(batch)

    def sync_weights(self, step: int) -> None:
        """Nothing to do: the model sampled is the caller's, used as it is at each :meth:`sample`."""
