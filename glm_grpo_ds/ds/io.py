"""Writing and reading what DeepSpeed holds: the LoRA adapter or full model (gathered from ZeRO-3
shards) and the per-rank DeepSpeed checkpoint state (model, optimizer, scheduler); a checkpoint of another world size or
ZeRO stage through its universal folder (ds/portable.py).

glm_grpo_ds/lifecycle/checkpoint.py decides the checkpoint layout, atomicity and pruning; this module does
the DeepSpeed part of each save and load.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..runtime.file_modes import follow_umask
from . import dist, portable
from .engine import apply_optimizer_config, gathered, is_zero3, unwrap


def save_adapter(engine, out_dir: str | os.PathLike, rank: int) -> None:
    """Write the LoRA adapter in peft format, gathered from ZeRO-3 shards (never empty)."""
    peft_model = unwrap(engine)
    params = [p for n, p in peft_model.named_parameters() if "lora_" in n]
    with gathered(params, is_zero3(engine)):
        if rank == 0:
            from peft import get_peft_model_state_dict

            state = {k: v.detach().clone().cpu() for k, v in get_peft_model_state_dict(peft_model).items()}
            peft_model.save_pretrained(str(out_dir), state_dict=state, safe_serialization=True)
            follow_umask(out_dir)  # safetensors writes 0600: teammates on shared storage could not read it
    dist.barrier()


def save_full_model(engine, out_dir: str | os.PathLike, rank: int) -> None:
    """Full fine-tuning: write the AR with ``save_pretrained`` (gathered from ZeRO-3 shards)."""
    model = unwrap(engine)
    params = list(model.parameters())
    with gathered(params, is_zero3(engine)):
        if rank == 0:
            state = {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}
            model.save_pretrained(str(out_dir), state_dict=state, safe_serialization=True)
            follow_umask(out_dir)
    dist.barrier()


DS_TAG = "ds"


def save_ds_checkpoint(engine, directory: str | os.PathLike) -> None:
    """Model, optimizer and scheduler state of every rank (collective: all ranks call it).

    Frozen parameters are left out: under LoRA that is the whole base model (about 20 GB of bf16
    fragments per checkpoint of the 10B AR under ZeRO-3, against ~1.2 GB of r=64 adapter state), under
    full fine-tuning the vision tower and the VQ model. They never change, so a resume takes them from
    ``model.path`` as every start does: resume with the model that wrote the checkpoint.
    """
    engine.save_checkpoint(str(directory), tag=DS_TAG, save_latest=False, exclude_frozen_parameters=True)


def _load_module(src: dict, dst) -> None:
    """DeepSpeed's module load, strict about everything except the frozen parameters a checkpoint of
    :func:`save_ds_checkpoint` leaves out (older checkpoints that hold them still load, unchanged)."""
    result = dst.load_state_dict(src, strict=False)
    frozen = {name for name, p in dst.named_parameters(remove_duplicate=False) if not p.requires_grad}
    missing = sorted(set(result.missing_keys) - frozen)
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"the checkpoint's module state does not match the model: {len(missing)} trainable parameters missing "
            f"({', '.join(missing[:3])}), {len(result.unexpected_keys)} unexpected "
            f"({', '.join(result.unexpected_keys[:3])}); resume with the model and LoRA settings that wrote it"
        )


def load_ds_checkpoint(engine, directory: str | os.PathLike, opt_cfg) -> float:
    """Restore the model, optimizer and scheduler state of ``directory`` (collective), then put ``opt_cfg`` (this
    launch's ``optimizer`` section) over the optimizer hyper-parameters and base lr the load brought back
    (engine.apply_optimizer_config): a resume with another lr, betas, weight decay or schedule runs with them
    from its first step. The lr of that step."""
    path, _ = engine.load_checkpoint(
        str(directory),
        tag=DS_TAG,
        load_optimizer_states=True,
        load_lr_scheduler_states=True,
        custom_load_fn=_load_module,
    )
    if path is None:
        raise FileNotFoundError(f"no DeepSpeed state in {directory}/{DS_TAG}")
    return apply_optimizer_config(engine, opt_cfg)


def load_universal_checkpoint(engine, directory: str | os.PathLike, opt_cfg) -> float:
    """:func:`load_ds_checkpoint` for a checkpoint written on another world size or ZeRO stage: its universal folder
    (ds/portable.py, converted beforehand by rank 0) into an engine built with ``portable.universal_config``."""
    portable.load(engine, Path(directory))
    return apply_optimizer_config(engine, opt_cfg)


def consolidated_state_dict(directory: str | os.PathLike) -> dict:
    """fp32 state dict of the trainable parameters, consolidated from a checkpoint's ZeRO shards
    (works offline, on one process, for any stage)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=DS_TAG, exclude_frozen_parameters=True)
