"""The startup summary rank 0 prints (world size, ZeRO stage, trainable parameters, batch, sampling) and
the memory plan of the run, written to ``output_dir/memory_plan.json``; the plan also places
rollout.merge_lora's copy of the base weights when ``rollout.merge_copy`` is ``auto`` (:func:`resolve_merge_copy`)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch

from ..ds.ds_config import zero_stage
from ..memory.plan import GIB, EstimateConfig, plan
from ..runtime import log


def startup_plan(cfg, ds_config_raw: dict, world: int, device: torch.device) -> dict:
    """The planner's figure for this very run, against this GPU's memory (CPU ranks: the planner's default)."""
    est = EstimateConfig(num_gpus=world, num_nodes=1, device=device.type)
    if device.type == "cuda":
        est.gpu_memory_gb = torch.cuda.get_device_properties(device).total_memory / GIB
    return plan(cfg, ds_config_raw, est)


def resolve_merge_copy(cfg, planned: dict) -> None:
    """``rollout.merge_copy=auto`` becomes the plan's placement ("device" or "host"), in ``cfg`` itself, before the
    first rollout makes the copy (experience.py reads it); unchanged when the run keeps no copy."""
    placement = planned["merge_copy"]["placement"]
    if cfg.rollout.merge_copy == "auto" and placement is not None:
        cfg.rollout = dataclasses.replace(cfg.rollout, merge_copy=placement)


def merge_copy_line(cfg, planned: dict, on_gpu: bool) -> str | None:
    """The summary's line about rollout.merge_lora (None without it)."""
    if not cfg.rollout.merge_lora:
        return None
    m = planned["merge_copy"]
    size = f"{m['bytes'] / GIB:.1f} GiB" if m["bytes"] >= GIB / 10 else f"{m['bytes'] / 2**20:.1f} MiB"
    where = {
        "device": f"base copy on the {'GPU' if on_gpu else 'rank'} ({size}; {m['why']})",
        "host": f"base copy in pinned host memory ({size}; {m['why']})",
        None: f"no base copy ({m['why']})",
    }
    return f"rollout: LoRA merged for sampling, {where[m['placement']]}"


def grpo_options_line(grpo) -> str | None:
    """The ``grpo.*`` settings that differ from their defaults (the ones echoed above excepted), one line: the loss
    a run trains with is visible in its log, not only in config.json. None when every one is the default."""
    skip = {"group_size", "sampling"}  # in the lines above
    default, now = dataclasses.asdict(type(grpo)()), dataclasses.asdict(grpo)
    changed = [f"{key}={json.dumps(now[key])}" for key in now if key not in skip and now[key] != default.get(key)]
    return "grpo options (not the defaults): " + ", ".join(changed) if changed else None


def print_startup_summary(cfg, model, ds_config, world, device, dtype, attn, out: Path, planned: dict) -> None:
    """``planned``: :func:`startup_plan` of this run, written to ``out/memory_plan.json``."""
    total = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    trainable = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters() if p.requires_grad)
    c = cfg
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", os.environ.get("CROSS_SIZE", "1")))
    log.info(
        f"glm-grpo: world size {world} ({nodes} node(s)), ZeRO stage {zero_stage(ds_config)}, "
        f"{'LoRA r=' + str(c.lora.r) if c.lora else 'full fine-tuning'}, "
        f"trainable {trainable:,} / {total:,} params, "
        f"optimizer {c.optimizer.name}, dtype {dtype}, attention {attn}\n"
        f"          effective batch {world * c.batch.prompts_per_rank} prompts x G={c.grpo.group_size} = "
        f"{world * c.sequences_per_rank} sequences/step, micro-batch {c.batch.micro_batch_size}, "
        f"{c.rollout.height}x{c.rollout.width}, sampling temperature {c.grpo.sampling.temperature} "
        f"top_k {c.grpo.sampling.top_k} top_p {c.grpo.sampling.top_p}"
        f"{' (collectives forced on)' if c.force_collectives else ''}"
    )
    # The planner's peak for this very setup (exact model-state bytes; activations estimated),
    # so the log of a run that runs out of memory says what was expected.
    (out / "memory_plan.json").write_text(json.dumps(planned, indent=1, default=str))
    log.info(
        f"          memory plan: {planned['total_bytes'] / 2**30:.2f} GiB per "
        f"{'GPU' if device.type == 'cuda' else 'rank'} "
        f"at peak ({planned['peak_phase']} phase); `glm-grpo estimate-memory` prints the breakdown"
    )
    merge = merge_copy_line(cfg, planned, device.type == "cuda")
    if merge:
        log.info(f"          {merge}")
    options = grpo_options_line(cfg.grpo)
    if options:
        log.info(f"          {options}")
