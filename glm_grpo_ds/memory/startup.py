"""The memory plan of the run being started, against this GPU's memory, and what the plan decides for it: the
placement of rollout.merge_lora's copy of the base weights when ``rollout.merge_copy`` is ``auto``.

The trainer decides the placement once, at build (:func:`base_copy_placement`), makes the one
:class:`~glm_grpo_ds.rollout.merged_lora.BaseCopy` there and hands it to its samplers; the config stays as it was
loaded, and ``config.json`` records the placement the run took (:func:`recorded_config`)."""

from __future__ import annotations

import torch

from ..config import to_dict
from .plan import GIB, EstimateConfig, plan


def startup_plan(cfg, ds_config_raw: dict, world: int, device: torch.device) -> dict:
    """The planner's figure for this very run, against this GPU's memory (CPU ranks: the planner's default)."""
    est = EstimateConfig(num_gpus=world, num_nodes=1, device=device.type)
    if device.type == "cuda":
        est.gpu_memory_gb = torch.cuda.get_device_properties(device).total_memory / GIB
    return plan(cfg, ds_config_raw, est)


def base_copy_placement(cfg, planned: dict | None) -> str | None:
    """Where this run keeps rollout.merge_lora's copy of the base weights: ``"device"`` or ``"host"``, as
    ``rollout.merge_copy`` says, or for ``auto`` as the memory plan ``planned`` places it (None: the run keeps no
    copy: no merge, or ZeRO-3 on several ranks). ``planned`` is needed only for ``auto`` with the merge on."""
    r = cfg.rollout
    if not r.merge_lora:
        return None
    if r.merge_copy != "auto":
        return r.merge_copy
    return planned["merge_copy"]["placement"]


def recorded_config(cfg, placement: str | None) -> dict:
    """``config.json``'s ``train``: the config, with ``rollout.merge_copy=auto`` written as the ``placement`` the run
    took when it keeps a copy (what a reader of the run, e.g. step_time.py, sees as its setting)."""
    record = to_dict(cfg)
    if cfg.rollout.merge_copy == "auto" and placement is not None:
        record["rollout"]["merge_copy"] = placement
    return record
