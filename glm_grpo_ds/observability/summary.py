"""The startup summary rank 0 prints (world size, ZeRO stage, trainable parameters, batch, sampling) and
the memory plan of the run, written to ``output_dir/memory_plan.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .. import log
from ..ds.ds_config import zero_stage
from ..memory.plan import EstimateConfig, plan


def print_startup_summary(cfg, model, ds_config, ds_config_raw, world, device, dtype, attn, out: Path) -> None:
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
    est = EstimateConfig(num_gpus=world, num_nodes=1, device=device.type)
    planned = plan(c, ds_config_raw, est)
    (out / "memory_plan.json").write_text(json.dumps(planned, indent=1, default=str))
    log.info(
        f"          memory plan: {planned['total_bytes'] / 2**30:.2f} GiB per "
        f"{'GPU' if device.type == 'cuda' else 'rank'} "
        f"at peak ({planned['peak_phase']} phase); `glm-grpo estimate-memory` prints the breakdown"
    )
