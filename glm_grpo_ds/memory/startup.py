"""The memory plan of the run being started, against this GPU's memory, and what the plan decides for it: the
placement of rollout.merge_lora's copy of the base weights when ``rollout.merge_copy`` is ``auto``."""

from __future__ import annotations

import dataclasses

import torch

from .plan import GIB, EstimateConfig, plan


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
