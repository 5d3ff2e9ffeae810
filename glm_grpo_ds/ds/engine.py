"""DeepSpeed engines and the process group: everything the training loop asks of DeepSpeed.

Process group start (:func:`init_distributed`: NCCL on GPUs, DeepSpeed's CPU accelerator and gloo
otherwise, so the same command runs on a laptop), engine construction with the client optimizer and
lr schedule, ZeRO-3 partitioned loading, the micro-batch backward / step / gradient norm / lr, and the
parameter gathering of rollouts. The rest of the package calls these functions, never the engine's
own API, so a DeepSpeed upgrade is read here::

    deepspeed --num_gpus 2 --module glm_grpo_ds.train --config CFG --deepspeed ds_configs/zero3.json
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from pathlib import Path

import torch

from ..runtime import cuda_check, log, run_log, threads
from ..runtime.ports import free_port
from . import dist
from .ds_config import zero_stage


def init_distributed(
    force_collectives: bool = False, timeout_minutes: float = 60.0
) -> tuple[int, int, int, torch.device]:
    """Start (or join) the process group; returns (rank, world_size, local_rank, device).

    Works under the ``deepspeed`` launcher (env vars set) and as a plain single process.
    ``force_collectives``: run collectives at world size 1 too (see glm_grpo_ds/ds/dist.py).
    ``timeout_minutes``: how long a collective waits for a late rank (``dist_timeout_minutes``); passed
    explicitly, so DeepSpeed's default (10 min, or ``DEEPSPEED_TIMEOUT``) does not apply.
    """
    cuda_check.check_rank()  # GPUs here (or asked for) that torch cannot use: stop, never train on the CPU
    # DS_ACCELERATOR=cpu is a CPU run even where CUDA works (the tests and the demo on a GPU machine)
    on_gpu = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu"
    if not on_gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    # DeepSpeed's import installs its logger's own stdout handler, and its process-group start print()s
    # (e.g. "deepspeed_shm_comm_op built successfully"): both belong in the run's log, not the console.
    with run_log.prints_to_log("DeepSpeed"):
        import deepspeed
    run_log.adopt_library_loggers()

    local_rank = int(os.environ["LOCAL_RANK"])
    if on_gpu:
        torch.cuda.set_device(local_rank)
    # The ranks of a node share its cores (GPU runs too): without this each rank starts one thread per
    # core and the oversubscribed threads spin (CPU ranks: token-by-token decoding ~30x slower).
    threads.limit_torch_threads()
    if not on_gpu and cpu_comm_op_needs_build():  # else the console says nothing for ~40 s
        log.info("glm-grpo: building DeepSpeed's CPU communication op (deepspeed_shm_comm), once per install: ~40 s")
    with run_log.prints_to_log("DeepSpeed"), this_environments_ninja():
        deepspeed.init_distributed(
            dist_backend="nccl" if on_gpu else "gloo",
            verbose=False,
            timeout=datetime.timedelta(minutes=timeout_minutes),
        )
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    dist.setup(comm_device=device, force=force_collectives)  # NCCL: CUDA tensors; gloo: CPU
    if not on_gpu:
        _unlink_cpu_allreduce_buffer()
    return dist.rank(), dist.world_size(), local_rank, device


@contextlib.contextmanager
def this_environments_ninja():
    """PATH with this interpreter's bin directory first, while DeepSpeed's CPU op may build, when that directory
    has a ``ninja`` (the pip package torch's JIT builds use): else torch runs whichever ``ninja`` PATH finds first.

    One extensions directory serves every process of a user, and ninja records each build with a hash of its
    command whose algorithm changed between versions (ninja 1.11 vs 1.13 here: the log format v7 reads another
    version's hashes as different commands). A process started with the environment's bin on PATH (an activated
    virtualenv, launch/train.sh) and one without (``.venv/bin/python -m ...``) then rebuilt the op in turn, ~40 s
    each: 9 times in one run of the test suite on 2 cores."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "ninja").is_file():
        yield
        return
    before = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join([str(bin_dir), *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def cpu_comm_op_needs_build() -> bool:
    """Whether starting a CPU process group will first compile DeepSpeed's shared-memory all-reduce op
    (torch's JIT extension build, ~40 s on 2 cores): its library is missing from the extensions directory
    (``TORCH_EXTENSIONS_DIR``, default ~/.cache/torch_extensions/...), or was built from another
    install's sources (one directory serves every virtual environment of a user, so they rebuild in turn)."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from torch.utils.cpp_extension import _get_build_directory

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return False  # DeepSpeed runs without it (torch's gloo all-reduce): nothing to build
    build = Path(_get_build_directory(builder.name, verbose=False))
    ninja = build / "build.ninja"
    if not (build / f"{builder.name}.so").is_file() or not ninja.is_file():
        return True
    recipe = ninja.read_text()
    return any(os.path.abspath(builder.deepspeed_src_path(src)) not in recipe for src in builder.sources())


def _unlink_cpu_allreduce_buffer() -> None:
    """Remove this rank's ``/dev/shm`` all-reduce buffer name once every rank has mapped it.

    DeepSpeed's CPU backend creates a 64 MiB shared-memory file per rank and never unlinks it, so
    RAM-backed /dev/shm would grow by 64 MiB per rank with every CPU run. After the barrier all ranks
    have mmapped every buffer; unlinking only drops the name, and the memory is returned when the
    last process exits - also when it is killed.
    """
    dist.barrier()
    name = (
        f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{os.environ['MASTER_ADDR']}_"
        f"{os.environ['MASTER_PORT']}_{dist.rank()}"
    )
    Path(name).unlink(missing_ok=True)


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


# ----------------------------------------------------------------------------- engines
def build_optimizer(params: list, opt_cfg):
    """Client optimizer: torch AdamW or bitsandbytes (Paged)AdamW8bit."""
    kwargs = dict(lr=opt_cfg.lr, betas=tuple(opt_cfg.betas), eps=opt_cfg.eps, weight_decay=opt_cfg.weight_decay)
    if opt_cfg.name == "adamw":
        return torch.optim.AdamW(params, **kwargs)
    import bitsandbytes as bnb

    cls = {"adamw_8bit": bnb.optim.AdamW8bit, "paged_adamw_8bit": bnb.optim.PagedAdamW8bit}[opt_cfg.name]
    return cls(params, **kwargs)


# optimizer.schedule -> transformers scheduler name (linear warmup over optimizer.warmup_steps first)
SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def build_scheduler(optimizer, opt_cfg, total_optimizer_steps: int):
    """The lr schedule of ``optimizer`` (one ``scheduler.step()`` per optimizer step), from
    ``transformers.get_scheduler``: linear warmup from 0 over ``optimizer.warmup_steps``, then
    constant, linear decay to 0 or half-cosine decay to 0 at ``total_optimizer_steps``."""
    from transformers import get_scheduler

    return get_scheduler(
        SCHEDULES[opt_cfg.schedule],
        optimizer,
        num_warmup_steps=opt_cfg.warmup_steps,
        num_training_steps=total_optimizer_steps,
    )


def apply_optimizer_settings(param_groups: list[dict], scheduler, opt_cfg) -> float:
    """Put the config's optimizer settings over what a checkpoint's load restored; the lr the next optimizer step
    takes.

    DeepSpeed's ``load_checkpoint`` restores the optimizer's param groups (``lr``, ``betas``, ``eps``,
    ``weight_decay``, ``initial_lr``: torch's ``Optimizer.load_state_dict`` takes them from the checkpoint) and the
    scheduler's state (``base_lrs``, ``last_epoch``, ``_last_lr``), so a resume with another ``optimizer.lr`` kept
    the old one. The schedule's shape is already this launch's (``build_scheduler``'s ``functools.partial`` lambdas
    hold no state to restore: ``optimizer.schedule``, ``warmup_steps`` and the total of optimizer steps are the
    config's); its position, ``last_epoch`` (the optimizer updates applied, skipped ones not counted), is the
    checkpoint's and is kept. Here: betas, eps and weight decay set on every group; ``base_lrs`` and each group's
    ``initial_lr`` = ``optimizer.lr``; each group's lr recomputed as ``LambdaLR`` does, ``base_lr *
    lambda(last_epoch)``, so the first resumed step already runs with it (an unchanged config sets every value to
    the one it had: the resume stays bitwise exact)."""
    base = float(opt_cfg.lr)
    for group in param_groups:
        group.update(betas=tuple(opt_cfg.betas), eps=opt_cfg.eps, weight_decay=opt_cfg.weight_decay, initial_lr=base)
    scheduler.base_lrs = [base] * len(param_groups)
    lrs = [b * fn(scheduler.last_epoch) for fn, b in zip(scheduler.lr_lambdas, scheduler.base_lrs, strict=True)]
    for group, lr in zip(param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = list(lrs)  # what get_last_lr() reports until the next step
    return lrs[0]


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
    """
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as ZeroInit

    original = getattr(ZeroInit, "linear_bk", None)
    patched = torch.nn.functional.linear
    if original is None or patched is original:
        yield
        return
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


def unwrap(engine):
    """The model inside a DeepSpeed engine (the peft model under LoRA): for train/eval mode, the
    rollout's forwards (no ZeRO hooks needed once gathered), adapter toggling and saving."""
    return engine.module


def is_zero3(engine) -> bool:
    return engine.zero_optimization_stage() == 3


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
def gathered(params: list, enabled: bool):
    """Full copies of ``params`` on every rank inside the block (ZeRO-3), else a no-op."""
    if not enabled:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params):
        yield


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
