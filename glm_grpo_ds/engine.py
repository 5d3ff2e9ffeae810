"""Everything that touches DeepSpeed: process group start, ds_config "auto" filling, engines,
parameter gathering for rollouts, gradient access and adapter saving. Collectives, barriers and
teardown live in glm_grpo_ds/dist.py (the only ``torch.distributed`` caller).

No other module imports deepspeed. On a machine without a GPU, :func:`init_distributed` selects
DeepSpeed's CPU accelerator and the gloo backend, so the same command runs on a laptop::

    deepspeed --num_gpus 2 --module glm_grpo_ds.train --config CFG --deepspeed ds_configs/zero3.json
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path

import torch

from . import dist

# ds_config keys our trainer fills when they say "auto" (DeepSpeed itself does not parse "auto").
AUTO_KEYS = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "bf16.enabled",
    "fp16.enabled",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
}


class DeepSpeedConfigError(ValueError):
    """A problem with a ds_configs JSON; the message names the file and the fix."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(force_collectives: bool = False) -> tuple[int, int, int, torch.device]:
    """Start (or join) the process group; returns (rank, world_size, local_rank, device).

    Works under the ``deepspeed`` launcher (env vars set) and as a plain single process.
    ``force_collectives``: run collectives at world size 1 too (see glm_grpo_ds/dist.py).
    """
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    import deepspeed

    local_rank = int(os.environ["LOCAL_RANK"])
    if on_gpu:
        torch.cuda.set_device(local_rank)
    else:
        # CPU ranks share the machine's cores: without this each rank starts one thread per core
        # and the oversubscribed threads spin, making token-by-token decoding ~30x slower.
        # OMP_NUM_THREADS, when set (by you or `deepspeed --bind_cores_to_rank`), wins.
        if os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
        else:
            local_world = int(os.environ.get("LOCAL_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or 1)
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo", verbose=False)
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    dist.setup(comm_device=device, force=force_collectives)  # NCCL: CUDA tensors; gloo: CPU
    if not on_gpu:
        _unlink_cpu_allreduce_buffer()
    return dist.rank(), dist.world_size(), local_rank, device


def _unlink_cpu_allreduce_buffer() -> None:
    """Remove this rank's ``/dev/shm`` all-reduce buffer name once every rank has mapped it.

    DeepSpeed's CPU backend creates a 64 MiB shared-memory file per rank and never unlinks it, so
    every CPU run leaked 64 MiB per rank of RAM-backed /dev/shm (19 GiB after a day of tests). After
    the barrier all ranks have mmapped every buffer; unlinking only drops the name, and the memory
    is returned when the last process exits — also when it is killed.
    """
    dist.barrier()
    name = (
        f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{os.environ['MASTER_ADDR']}_"
        f"{os.environ['MASTER_PORT']}_{dist.rank()}"
    )
    Path(name).unlink(missing_ok=True)


# ----------------------------------------------------------------------------- ds_config
def read_ds_config(path: str | os.PathLike) -> dict:
    p = Path(path)
    if not p.is_file():
        raise DeepSpeedConfigError(f"DeepSpeed config {p} does not exist; pick one of ds_configs/*.json")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DeepSpeedConfigError(f"{p} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}") from None
    if not isinstance(data, dict):
        raise DeepSpeedConfigError(f"{p} must hold a JSON object")
    return data


def _walk(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _walk(value, dotted + ".")
        else:
            yield dotted, value


def _set(tree: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[last] = value


def fill_ds_config(raw: dict, cfg, world_size: int, hidden_size: int, dtype: torch.dtype, source: str = "ds_config") -> dict:
    """Resolve every "auto" from the TrainConfig; reject "auto" in keys we do not own.

    Also checks combinations DeepSpeed would accept but that would silently not do what the user
    asked (an 8-bit client optimizer with optimizer offload keeps fp32 states on the CPU).
    """
    ds = json.loads(json.dumps(raw))
    micro = cfg.batch.micro_batch_size
    accum = cfg.sequences_per_rank // micro
    values = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "train_batch_size": micro * accum * world_size,
        "gradient_clipping": cfg.optimizer.max_grad_norm,
        "bf16.enabled": dtype == torch.bfloat16,
        "fp16.enabled": dtype == torch.float16,
        "zero_optimization.reduce_bucket_size": hidden_size * hidden_size,
        "zero_optimization.allgather_bucket_size": hidden_size * hidden_size,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
        "zero_optimization.stage3_param_persistence_threshold": 10 * hidden_size,
    }
    for key, value in list(_walk(ds)):
        if value == "auto":
            if key not in AUTO_KEYS:
                raise DeepSpeedConfigError(
                    f"{source}: \"auto\" is not supported for {key}; give a value (auto works for: {', '.join(sorted(AUTO_KEYS))})"
                )
            _set(ds, key, values[key])
    # Batch keys must agree with the trainer's batching even when given explicitly.
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        if key in ds and ds[key] != values[key]:
            raise DeepSpeedConfigError(
                f"{source}: {key}={ds[key]} disagrees with the trainer ({values[key]} from batch.micro_batch_size="
                f"{micro}, batch.prompts_per_rank x grpo.group_size={cfg.sequences_per_rank}, world size {world_size}); set it to \"auto\""
            )
        ds[key] = values[key]
    ds.setdefault("steps_per_print", 10**9)
    ds.setdefault("wall_clock_breakdown", False)
    zero = ds.setdefault("zero_optimization", {"stage": 0})
    offload_opt = zero.get("offload_optimizer", {}).get("device", "none") not in ("none", None)
    if offload_opt and cfg.optimizer.name != "adamw":
        raise DeepSpeedConfigError(
            f"{source}: optimizer.name={cfg.optimizer.name} with zero_optimization.offload_optimizer: DeepSpeed would "
            "keep fp32 optimizer states on the CPU, not 8-bit ones; use optimizer.name=adamw (DeepSpeed CPU Adam) "
            "with offload, or drop offload_optimizer to keep the 8-bit optimizer"
        )
    if offload_opt:
        # DeepSpeed's own CPU Adam runs the offloaded optimizer.
        o = cfg.optimizer
        ds["optimizer"] = {"type": "AdamW", "params": {"lr": o.lr, "betas": list(o.betas), "eps": o.eps, "weight_decay": o.weight_decay}}
    else:
        ds.setdefault("zero_allow_untested_optimizer", True)
    return ds


def zero_stage(ds: dict) -> int:
    return int(ds.get("zero_optimization", {}).get("stage", 0))


@contextlib.contextmanager
def zero3_model_loading(ds: dict):
    """Inside the block, transformers' ``from_pretrained`` builds weights partitioned across ranks
    (``zero.Init``) under ZeRO-3, so a 9B AR never materialises whole on one rank. Load only the
    DeepSpeed-managed models (policy, reference) inside it: the decoder and reward models live
    outside DeepSpeed and must load whole."""
    if zero_stage(ds) != 3:
        yield
        return
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    keep_alive = HfDeepSpeedConfig(ds)
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


def lr_lambda(opt_cfg, max_steps: int):
    """Multiplier of the base lr per optimizer step: linear warmup, then constant/linear/cosine."""
    import math

    warm = opt_cfg.warmup_steps

    def f(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if opt_cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warm) / max(1, max_steps - warm))
        return 1.0 - progress if opt_cfg.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def initialize(model, ds: dict, opt_cfg, total_optimizer_steps: int):
    """Wrap the policy in a DeepSpeed training engine; returns the engine."""
    import deepspeed

    params = [p for p in model.parameters() if p.requires_grad]
    client_opt = None if "optimizer" in ds else build_optimizer(params, opt_cfg)
    schedule = lr_lambda(opt_cfg, total_optimizer_steps)
    scheduler = (lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, schedule)) if client_opt is None else torch.optim.lr_scheduler.LambdaLR(client_opt, schedule)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, optimizer=client_opt, lr_scheduler=scheduler, config=ds)
    return engine


def initialize_reference(model, ds: dict):
    """Frozen reference (full fine-tuning) in its own DeepSpeed engine, sharded like the policy at
    ZeRO-3, without optimizer states."""
    import deepspeed

    ref = {
        "train_micro_batch_size_per_gpu": ds["train_micro_batch_size_per_gpu"],
        "train_batch_size": ds["train_batch_size"],
        "gradient_accumulation_steps": ds["gradient_accumulation_steps"],
        "bf16": ds.get("bf16", {"enabled": False}),
        "fp16": ds.get("fp16", {"enabled": False}),
        "steps_per_print": 10**9,
    }
    stage = zero_stage(ds)
    ref["zero_optimization"] = (
        {k: v for k, v in ds["zero_optimization"].items() if k.startswith("stage3") or k in ("stage", "offload_param")}
        if stage == 3
        else {"stage": 0}
    )
    engine, *_ = deepspeed.initialize(model=model, config=ref)
    engine.eval()
    return engine


@contextlib.contextmanager
def gathered_for_rollout(engine, enabled: bool = True):
    """Under ZeRO-3, gather every parameter of the policy once for the whole rollout and take the
    per-module ZeRO hooks off (they would re-check and re-fetch on every token), then restore
    them. Other stages / disabled: a no-op (parameters stay sharded, hooks fetch per module)."""
    import deepspeed

    if not enabled or engine.zero_optimization_stage() != 3:
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
    try:
        yield
    finally:
        torch.nn.functional.linear = patched


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


def model_state_bytes(engine) -> dict[str, int]:
    """Bytes of the model states this rank holds now, by kind, each storage counted once.

    ``parameters``: the model's parameters as stored here (ZeRO-3: this rank's partitions, plus the
    whole of parameters below the persistence threshold); ``gradients``: DeepSpeed's gradient
    buffers and ``.grad`` tensors (complete just before ``engine.step``); ``master``: fp32 master
    partitions; ``optimizer_states``: the wrapped optimizer's state tensors (Adam moments, 8-bit
    codes and scales). Used to check ``glm_grpo_ds.memory_plan`` against what DeepSpeed allocates.
    """
    seen: set[int] = set()

    def total(tensors) -> int:
        n = 0
        for t in tensors:
            if not torch.is_tensor(t) or t.numel() == 0:
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                n += storage.nbytes()
        return n

    opt = engine.optimizer
    params = list(engine.module.parameters())
    out = {"parameters": total([getattr(p, "ds_tensor", None) for p in params] + [p.data for p in params])}
    if engine.zero_optimization_stage() == 3:
        master = list(opt.fp32_partitioned_groups_flat)
        grads = [opt.grad_partitions_flat_buffer] + [p.grad for p in params]
    else:
        master = list(opt.single_partition_of_fp32_groups)
        grads = [getattr(opt, "grads_in_partition", None)] + [p.grad for p in params]
        grads += [g for g in getattr(opt, "averaged_gradients", {}).values() for g in (g if isinstance(g, list) else [g])]
    out["master"] = total(master)
    out["gradients"] = total(grads)
    out["optimizer_states"] = total(v for st in opt.optimizer.state.values() for v in st.values())
    return out


def save_adapter(engine, out_dir: str | os.PathLike, rank: int) -> None:
    """Write the LoRA adapter in peft format, gathered from ZeRO-3 shards (never empty)."""
    peft_model = engine.module
    params = [p for n, p in peft_model.named_parameters() if "lora_" in n]
    with gathered(params, engine.zero_optimization_stage() == 3):
        if rank == 0:
            from peft import get_peft_model_state_dict

            state = {k: v.detach().clone().cpu() for k, v in get_peft_model_state_dict(peft_model).items()}
            peft_model.save_pretrained(str(out_dir), state_dict=state, safe_serialization=True)
    dist.barrier()


def save_full_model(engine, out_dir: str | os.PathLike, rank: int) -> None:
    """Full fine-tuning: write the AR with ``save_pretrained`` (gathered from ZeRO-3 shards)."""
    model = engine.module
    params = list(model.parameters())
    with gathered(params, engine.zero_optimization_stage() == 3):
        if rank == 0:
            state = {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}
            model.save_pretrained(str(out_dir), state_dict=state, safe_serialization=True)
    dist.barrier()


# ----------------------------------------------------------------------------- checkpoints
DS_TAG = "ds"


def save_ds_checkpoint(engine, directory: str | os.PathLike) -> None:
    """Model, optimizer and scheduler state of every rank (collective: all ranks call it)."""
    engine.save_checkpoint(str(directory), tag=DS_TAG, save_latest=False)


def load_ds_checkpoint(engine, directory: str | os.PathLike) -> None:
    path, _ = engine.load_checkpoint(str(directory), tag=DS_TAG, load_optimizer_states=True, load_lr_scheduler_states=True)
    if path is None:
        raise FileNotFoundError(f"no DeepSpeed state in {directory}/{DS_TAG}")


def consolidated_state_dict(directory: str | os.PathLike) -> dict:
    """fp32 state dict of the trainable parameters, consolidated from a checkpoint's ZeRO shards
    (works offline, on one process, for any stage)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=DS_TAG, exclude_frozen_parameters=True)
