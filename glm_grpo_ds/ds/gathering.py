"""ZeRO-3 parameter gathering around the work that needs whole parameters: the rollout (every parameter
gathered once, the per-module hooks off), a list of parameters, and torch's own ``F.linear`` for work without
gradients (zero.Init replaces it process-wide) with the training linear put back where its rounding matters.
"""

from __future__ import annotations

import contextlib
import threading

import torch


def is_zero3(engine) -> bool:
    return engine.zero_optimization_stage() == 3


@contextlib.contextmanager
def gathered_for_rollout(engine, enabled: bool = True):
    """Under ZeRO-3, gather every parameter of the policy once for the whole rollout and take the
    per-module ZeRO hooks off (they would re-check and re-fetch on every token), then restore
    them. Other stages / disabled: a no-op (parameters stay sharded, hooks fetch per module)."""
    import deepspeed

    if not enabled or not is_zero3(engine):
        with plain_linear():
            yield
        return
    offload = engine.optimizer.parameter_offload if hasattr(engine.optimizer, "parameter_offload") else engine.optimizer
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params):
        for p in params:
            p.ds_active_sub_modules.clear()
        for hook in offload.forward_hooks + offload.backward_hooks:
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        try:
            with plain_linear():
                yield
        finally:
            offload._register_deepspeed_module(offload.module)


def gather_discards_writes(engine, gather: bool) -> bool:
    """True when writes into the parameters inside :func:`gathered_for_rollout` vanish with the gather: ZeRO-3
    on several ranks hands out full buffers it frees afterwards (``GatheredParameters`` without a modifier
    rank). At world size 1 the gathered parameter is the stored partition itself, and other stages hold the
    parameters whole: there a write stays."""
    from .dist import world_size

    return gather and is_zero3(engine) and world_size() > 1


@contextlib.contextmanager
def plain_linear():
    """torch's own ``F.linear`` inside the block, for work without gradients (rollout, decode, rewards).

    ZeRO-3's ``zero.Init`` replaces ``torch.nn.functional.linear`` process-wide with a memory-saving
    autograd Function, and the replacement stays ("persists unless manually reset"). It only helps
    backward, yet every call pays for an autograd Function: on the tiny model it halved the rollout's
    speed, and it slowed the frozen DiT and reward models alike. Training forwards keep it.

    The swap is process-wide, so it is made on the main thread only: a background thread swapping (a rollout drawn
    ahead under ZeRO-3) would change the linear under the main thread's forwards, and restore it out of order.
    """
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as ZeroInit

    original = getattr(ZeroInit, "linear_bk", None)
    patched = torch.nn.functional.linear
    if original is None or patched is original:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            f"plain_linear: ZeRO-3's process-wide F.linear would be swapped on thread "
            f"{threading.current_thread().name}, under the main thread's forwards: only the main thread may (a "
            "background rollout, rollout.one_step_off, is refused with ZeRO-3)"
        )
    torch.nn.functional.linear = original
    _zero_linear.append(patched)
    try:
        yield
    finally:
        _zero_linear.pop()
        torch.nn.functional.linear = patched


_zero_linear: list = []  # the linear zero.Init installed, while a plain_linear block has taken it off


@contextlib.contextmanager
def training_linear():
    """Inside :func:`plain_linear`: put back the linear training forwards use, so a no-grad pass in the
    rollout's gather (the reference / old log-probs) rounds exactly as the engine's forward would: the
    first iteration's ratio stays exactly 1 and the KL to an unchanged reference exactly 0."""
    if not _zero_linear:
        yield
        return
    current = torch.nn.functional.linear
    torch.nn.functional.linear = _zero_linear[-1]
    try:
        yield
    finally:
        torch.nn.functional.linear = current


@contextlib.contextmanager
def gathered(params: list, enabled: bool):
    """Full copies of ``params`` on every rank inside the block (ZeRO-3), else a no-op."""
    if not enabled:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params):
        yield


@contextlib.contextmanager
def written(params: list, zero3: bool):
    """``params`` whole inside the block, where a write to them is kept: under ZeRO-3 rank 0's values are partitioned
    back to every rank on the way out (every rank computes the same, so rank 0's are everyone's)."""
    if not zero3:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
        yield


@torch.no_grad()
def mix_into(target, source, alpha: float, zero3: bool) -> None:
    """Each parameter ``source`` trains, in ``target`` (the same architecture, paired by name), becomes ``alpha`` x
    source's + (1 - alpha) x its own (TRL's SyncRefModelCallback formula; alpha 1 copies): full fine-tuning's
    reference reset (grpo.ref_sync_steps) from the policy. Under ZeRO-3 collective, one parameter pair gathered at a
    time (TRL's gathers both whole models at once). The frozen parameters are equal in both and left alone."""
    targets = dict(target.named_parameters())
    for name, p in source.named_parameters():
        if p.requires_grad:
            q = targets[name]
            with gathered([p], zero3), written([q], zero3):
                q.data.mul_(1.0 - alpha).add_(p.data.to(q.dtype), alpha=alpha)


SHARD_BYTES = 2 * 2**30  # the most of a model's parameters rank 0 gathers to its host before writing them to a file


def shard_groups(module, names: list[str], bound: int) -> list[list[str]]:
    """``names`` (parameters of ``module``, in order) in consecutive groups of at most ``bound`` bytes each, a larger
    parameter alone: the files a model is written in, sized from the whole parameters (ZeRO-3's ``ds_numel``)."""
    params, groups, size = dict(module.named_parameters()), [], 0
    for name in names:
        p = params[name]
        nbytes = getattr(p, "ds_numel", p.numel()) * p.element_size()
        if not groups or size + nbytes > bound:
            groups, size = groups + [[]], 0
        groups[-1].append(name)
        size += nbytes
    return groups


@torch.no_grad()
def whole_tensors(module, names: list[str], zero3: bool, rank: int) -> dict[str, torch.Tensor]:
    """Rank 0: ``module``'s parameters ``names``, whole, as CPU tensors (gathered one at a time under ZeRO-3: rank
    0's CPU memory holds them, no device holds more than one); ``{}`` on the other ranks (collective)."""
    params, out = dict(module.named_parameters()), {}
    for name in names:
        with gathered([params[name]], zero3):
            if rank == 0:
                out[name] = params[name].data.detach().to("cpu", copy=True)
    return out


@torch.no_grad()
def set_tensors(module, tensors: dict[str, torch.Tensor], zero3: bool) -> None:
    """``module``'s parameters named in ``tensors`` take their values (collective under ZeRO-3: every rank passes the
    same tensors; rank 0's are kept)."""
    params = dict(module.named_parameters())
    for name, value in tensors.items():
        with written([params[name]], zero3):
            params[name].data.copy_(value)
