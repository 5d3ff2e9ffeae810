"""Writing and reading what DeepSpeed holds: the LoRA adapter or full model (gathered from ZeRO-3 shards; the full
model one file at a time) and the per-rank DeepSpeed checkpoint state (model, optimizer, scheduler); a checkpoint of
another world size or ZeRO stage through its universal folder (ds/portable.py).

glm_grpo_ds/lifecycle/checkpoint.py decides the checkpoint layout, atomicity and pruning; this module does
the DeepSpeed part of each save and load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..runtime.file_modes import follow_umask
from . import dist, portable
from .engine import SHARD_BYTES, apply_optimizer_config, gathered, is_zero3, shard_groups, unwrap, whole_tensors


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
    """Full fine-tuning: write the AR (collective: all ranks call it), see :func:`write_model`."""
    write_model(unwrap(engine), out_dir, rank, is_zero3(engine))
    dist.barrier()


WEIGHTS, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"  # transformers' names


def write_model(model, out_dir: str | os.PathLike, rank: int, zero3: bool, shard_bytes: int = SHARD_BYTES) -> None:
    """``model`` as ``save_pretrained`` lays it out (its config.json and generation_config.json, written by
    ``save_pretrained`` itself; the weights in ``model.safetensors``, or in ``model-0000i-of-0000n.safetensors`` files
    with ``model.safetensors.index.json`` when they exceed ``shard_bytes``), gathered and written one file at a time
    (collective under ZeRO-3). Rank 0's host holds one file's tensors (at most ``shard_bytes``, a larger parameter
    alone) and no GPU more than one whole parameter: gathering the whole model at once put the AR, about 19 GiB for
    GLM-Image, on every GPU and on rank 0's host at the end of a run."""
    from safetensors.torch import save_file

    out, names = Path(out_dir), [name for name, _ in model.named_parameters()]
    if set(model.state_dict()) != set(names):  # persistent buffers or tied weights: save_pretrained's own handling
        raise RuntimeError(f"{type(model).__name__}'s state dict is not its parameters: write_model cannot save it")
    if rank == 0:
        model.save_pretrained(str(out), state_dict={})  # the configs exactly as transformers writes them, no weights
    groups = shard_groups(model, names, shard_bytes)
    files = (
        [WEIGHTS]
        if len(groups) == 1
        else [f"model-{i:05d}-of-{len(groups):05d}.safetensors" for i in range(1, len(groups) + 1)]
    )
    weight_map, total = {}, 0
    for group, file in zip(groups, files):
        tensors = whole_tensors(model, group, zero3, rank)
        if rank == 0:
            save_file(tensors, str(out / file), metadata={"format": "pt"})
            weight_map |= dict.fromkeys(group, file)
            total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    if rank == 0:
        if len(files) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (out / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        follow_umask(out)


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
