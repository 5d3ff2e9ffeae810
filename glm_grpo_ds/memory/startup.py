"""The memory plan of the run being started, against this GPU's memory, and what the plan decides for it: the
placement of rollout.merge_lora's copy of the base weights when ``rollout.merge_copy`` is ``auto``.

The trainer decides the placement once, at build (:func:`base_copy_placement`), makes the one
:class:`~glm_grpo_ds.rollout.merged_lora.BaseCopy` there and hands it to its samplers; the config stays as it was
loaded, and ``config.json`` records the placement the run took (:func:`recorded_config`)."""

from __future__ import annotations

import torch

from ..config import to_dict
from ..runtime.threads import local_ranks
from .plan import GIB, EstimateConfig, plan


def launched_shape(world: int, device: str) -> EstimateConfig:
    """The cluster of the run being started: ``world`` ranks, this node's (the launcher's ``LOCAL_SIZE``; all of
    them without a launcher) sizing the host RAM per node."""
    local = local_ranks(world)
    return EstimateConfig(num_gpus=local, num_nodes=-(-world // local), device=device, ranks=world)


def startup_plan(cfg, ds_config_raw: dict, world: int, device: torch.device, sizes=None) -> dict:
    """The planner's figure for this very run, against this GPU's memory (CPU ranks: the planner's default).
    ``sizes``: the models' parameter counts when known (memory/sizes.py ``model_sizes``; else read again)."""
    est = launched_shape(world, device.type)
    if device.type == "cuda":
        est.gpu_memory_gb = torch.cuda.get_device_properties(device).total_memory / GIB
    return plan(cfg, ds_config_raw, est, sizes)


def base_copy_placement(planned: dict | None) -> str | None:
    """Where this run keeps rollout.merge_lora's copy of the base weights, as the memory plan ``planned`` places it
    (memory/components.py ``place_merge_copy``, the one owner of the rule): ``"device"`` or ``"host"``
    (``rollout.merge_copy`` as set, or for ``auto`` where it fits), None when the run keeps no copy (no merge, or
    ZeRO-3 on several ranks, whose gathered weights are discarded). ``planned`` None: no merge, no plan made."""
    return planned["merge_copy"]["placement"] if planned is not None else None


def recorded_config(cfg, placement: str | None) -> dict:
    """``config.json``'s ``train``: the config, with ``rollout.merge_copy=auto`` written as the ``placement`` the run
    took when it keeps a copy. Only config.json records the placement; a checkpoint records the config as loaded
    (``auto``), so a resume compares like with like."""
    record = to_dict(cfg)
    if cfg.rollout.merge_copy == "auto" and placement is not None:
        record["rollout"]["merge_copy"] = placement
    return record
