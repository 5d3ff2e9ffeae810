"""DeepSpeed engines: everything the training loop asks of DeepSpeed, in one namespace.

Here: engine construction, ZeRO-3 partitioned loading, the micro-batch backward / step / gradient norm / lr, and the
optimizer settings over a checkpoint's; re-exported from the modules beside it: the process group start
(process_group.py :func:`init_distributed`: NCCL on GPUs, DeepSpeed's CPU accelerator and gloo otherwise, so the
same command runs on a laptop), the client optimizer and lr schedule (optimizer.py) and the parameter gathering of
rollouts (gathering.py). The rest of the package calls these functions, never the engine's
own API, so a DeepSpeed upgrade is read here::

    deepspeed --num_gpus 2 --module glm_grpo_ds.train --config CFG --deepspeed ds_configs/zero3.json
"""

from __future__ import annotations

import contextlib

import torch

from ..runtime import run_log
from . import dist
from .ds_config import zero_stage
from .gathering import (
    SHARD_BYTES,
    gather_discards_writes,
    gathered,
    gathered_for_rollout,
    is_zero3,
    mix_into,
    plain_linear,
    set_tensors,
    shard_groups,
    training_linear,
    whole_tensors,
    written,
)
from .optimizer import apply_optimizer_settings, build_optimizer, build_scheduler
from .process_group import cpu_comm_op_needs_build, init_distributed, this_environments_ninja

# The rest of the package (and the tests) call all of these as ds.engine's: the process group, the optimizer and
# the gathers live in modules of their own (process_group.py, optimizer.py, gathering.py) and are named here too.
__all__ = [
    "init_distributed",
    "this_environments_ninja",
    "cpu_comm_op_needs_build",
    "zero3_model_loading",
    "build_optimizer",
    "build_scheduler",
    "apply_optimizer_settings",
    "apply_optimizer_config",
    "initialize",
    "initialize_reference",
    "gathered_for_rollout",
    "gather_discards_writes",
    "plain_linear",
    "training_linear",
    "gathered",
    "mix_into",
    "whole_tensors",
    "shard_groups",
    "SHARD_BYTES",
    "set_tensors",
    "written",
    "unwrap",
    "is_zero3",
    "backward",
    "grad_norm",
    "current_lr",
    "step",
    "full_grad",
    "counted_comms",
    "parameter_bytes",
]


@contextlib.contextmanager
def zero3_model_loading(ds_config: dict):
    """Inside the block, transformers' ``from_pretrained`` builds weights partitioned across ranks
    (``zero.Init``) under ZeRO-3, so a 9B AR never materialises whole on one rank. Load only the
    DeepSpeed-managed models (policy, reference) inside it: the decoder and reward models live
    outside DeepSpeed and must load whole."""
    if zero_stage(ds_config) != 3:
        yield
        return
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    keep_alive = HfDeepSpeedConfig(ds_config)
    try:
        yield
    finally:
        unset_hf_deepspeed_config()
        del keep_alive


def apply_optimizer_config(engine, opt_cfg) -> float:
    """:func:`apply_optimizer_settings` on the param groups DeepSpeed steps with (under ZeRO and bf16 its wrapper's
    ``param_groups`` are the client optimizer's, which the lr scheduler writes to), and ``optimizer.max_grad_norm``
    as the wrapper's clipping: ZeRO-1/2's and the bf16 / fp16 optimizers' ``load_state_dict`` restore the
    checkpoint's ``clip_grad`` (ZeRO-3 and stage 0 clip with the config's). The lr of the next step."""
    groups, scheduler = engine.optimizer.param_groups, engine.lr_scheduler
    if scheduler is None or scheduler.optimizer.param_groups is not groups:
        # a DeepSpeed whose wrapper copies the groups: setting one list would leave the other's lr in force
        raise RuntimeError(
            "DeepSpeed's optimizer and the lr scheduler hold different param groups; the config's optimizer "
            "settings cannot be applied after the checkpoint load (glm_grpo_ds/ds/engine.py)"
        )
    if hasattr(engine.optimizer, "clip_grad"):
        engine.optimizer.clip_grad = opt_cfg.max_grad_norm
    return apply_optimizer_settings(groups, scheduler, opt_cfg)


def initialize(model, ds_config: dict, opt_cfg, total_optimizer_steps: int):
    """Wrap the policy in a DeepSpeed training engine; returns the engine. The optimizer is ours
    (torch / bitsandbytes) unless the ds_config names one (CPU offload: DeepSpeed's CPU Adam)."""
    import deepspeed

    params = [p for p in model.parameters() if p.requires_grad]
    if "optimizer" in ds_config:  # DeepSpeed builds the optimizer, then calls us for its schedule
        client_opt = None
        scheduler = lambda opt: build_scheduler(opt, opt_cfg, total_optimizer_steps)  # noqa: E731
    else:
        client_opt = build_optimizer(params, opt_cfg)
        scheduler = build_scheduler(client_opt, opt_cfg, total_optimizer_steps)
    with run_log.prints_to_log("DeepSpeed"):  # some of its op builders and helpers print() rather than log
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=params, optimizer=client_opt, lr_scheduler=scheduler, config=ds_config
        )
    run_log.adopt_library_loggers()  # loggers of what loading the model imported (their console handlers)
    return engine


def initialize_reference(model, ds_config: dict):
    """Frozen reference (full fine-tuning) in its own DeepSpeed engine, sharded like the policy at
    ZeRO-3, without optimizer states."""
    import deepspeed

    ref = {
        "train_micro_batch_size_per_gpu": ds_config["train_micro_batch_size_per_gpu"],
        "train_batch_size": ds_config["train_batch_size"],
        "gradient_accumulation_steps": ds_config["gradient_accumulation_steps"],
        "bf16": ds_config.get("bf16", {"enabled": False}),
        "fp16": ds_config.get("fp16", {"enabled": False}),
        "steps_per_print": 10**9,
    }
    stage = zero_stage(ds_config)
    ref["zero_optimization"] = (
        {
            k: v
            for k, v in ds_config["zero_optimization"].items()
            if k.startswith("stage3") or k in ("stage", "offload_param")
        }
        if stage == 3
        else {"stage": 0}
    )
    with run_log.prints_to_log("DeepSpeed"):
        engine, *_ = deepspeed.initialize(model=model, config=ref)
    engine.eval()
    return engine


def unwrap(engine):
    """The model inside a DeepSpeed engine (the peft model under LoRA): for train/eval mode, the
    rollout's forwards (no ZeRO hooks needed once gathered), adapter toggling and saving."""
    return engine.module


def backward(engine, loss: torch.Tensor) -> None:
    """Backward of one micro-batch's loss. ``scale_wrt_gas=False``: the loss is already divided by
    the whole rollout's normaliser (glm_grpo_ds/update.py), so DeepSpeed must not divide it again
    by the gradient-accumulation steps."""
    engine.backward(loss, scale_wrt_gas=False)


def grad_norm(engine) -> float | None:
    """Global gradient norm of the last optimizer step (None before the first, or if not tracked)."""
    norm = engine.get_global_grad_norm()
    return None if norm is None else float(norm)


def current_lr(engine) -> float:
    return engine.get_lr()[0]


def step(engine) -> bool | None:
    """``engine.step()`` after a micro-batch's backward. At a gradient-accumulation boundary returns
    whether the optimizer update was applied (False = skipped because the gradients were not
    finite; the same answer on every rank), else None.

    ZeRO-1/2/3 (fp32, bf16 with ``bf16.check_grad_overflow``, the default, and fp16) compute the
    global gradient norm, all-reduced across ranks, and skip the update when it is inf/NaN: no
    optimizer state or parameter changes, the gradients are cleared, the lr schedule does not
    advance, and ``engine.skipped_steps`` counts it. ZeRO stage 0 has no such check, so we drop the
    (already all-reduced) gradients ourselves and the optimizer skips every parameter.
    """
    if not engine.is_gradient_accumulation_boundary():
        engine.step()
        return None
    if engine.zero_optimization_stage() == 0:
        finite = _grads_finite([p for p in engine.module.parameters() if p.requires_grad])
        if not finite:
            engine.zero_grad()  # grads -> None: the optimizer skips these parameters
        engine.step()
        return finite
    before = engine.skipped_steps
    engine.step()
    return engine.skipped_steps == before


def _grads_finite(params: list) -> bool:
    bad = any(p.grad is not None and not torch.isfinite(p.grad).all() for p in params)
    return dist.any_rank(float(bad)) == 0


def full_grad(param) -> torch.Tensor | None:
    """The full (all-reduced, un-partitioned) gradient of ``param`` between the last backward of a
    step and ``engine.step()``."""
    from deepspeed.utils import safe_get_full_grad

    return safe_get_full_grad(param)


@contextlib.contextmanager
def counted_comms():
    """Count DeepSpeed's collectives inside the block with its comms logger: yields a dict that holds, at
    the block's end, ``{op: {"calls": n, "bytes": b}}`` for this rank (``bytes``: the message sizes the
    logger records; for ZeRO-3's all-gathers that is this rank's shard, so world x bytes were gathered).
    For benchmarks and tests: the logger times every op, which synchronises the device."""
    import deepspeed.comm as dscomm

    logger = dscomm.comms_logger
    before = (logger.enabled, logger.prof_all)
    dscomm.configure(enabled=True, prof_all=True)
    logger.reset_data()
    counts: dict[str, dict[str, int]] = {}
    try:
        yield counts
    finally:
        for name, sizes in logger.get_raw_data().items():
            counts[name] = {
                "calls": sum(v[0] for v in sizes.values()),
                "bytes": sum(size * v[0] for size, v in sizes.items()),
            }
        logger.reset_data()
        dscomm.configure(enabled=before[0], prof_all=before[1])


def parameter_bytes(engine) -> int:
    """Bytes of every parameter of the engine's model at its full size (ZeRO-3 partitions counted whole):
    what gathering the whole model once brings together."""
    return sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in unwrap(engine).parameters())
