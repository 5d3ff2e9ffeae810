"""The startup summary rank 0 prints (world size, ZeRO stage, trainable parameters, batch, sampling) and
the run's memory plan (made by glm_grpo_ds/memory/startup.py), written to ``output_dir/memory_plan.json``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..ds.ds_config import zero_stage
from ..runtime import log
from ..runtime.threads import launcher_nodes

GIB = 2**30


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


def _updates_note(cfg) -> str:
    """Said after the micro-batch when a step makes more than one optimizer step (batch.mini_batches x
    grpo.num_iterations): the lr schedule and the off-policy share follow from it."""
    if cfg.updates_per_step == 1:
        return ""
    parts = [f"{cfg.batch.mini_batches} mini-batches"] if cfg.batch.mini_batches > 1 else []
    parts += [f"{cfg.grpo.num_iterations} iterations"] if cfg.grpo.num_iterations > 1 else []
    return f", {cfg.updates_per_step} optimizer steps per rollout ({' x '.join(parts)})"


def _cut_note(sampling, codebook_size: int | None) -> str:
    """Said beside the sampling knobs when top-k / top-p cut the draw: the tokens come from another distribution than
    the one trained (docs/training.md#which-distribution-the-ratio-is-taken-under). A top-k of the whole codebook or
    more (the tiny model's 16 ids under top_k 50) cuts nothing."""
    cuts_k = sampling.top_k and (codebook_size is None or sampling.top_k < codebook_size)
    if not (cuts_k or (sampling.top_p is not None and sampling.top_p < 1)):
        return ""
    return " (the cut draws off-policy, by the policy mass it leaves out; top_k 0, top_p 1.0 draw on-policy)"


def _ranks_on(device) -> str:
    """Where the ranks run, said in the first line: a node without a usable GPU runs CPU ranks (gloo) unasked."""
    return "GPU ranks, NCCL" if device.type == "cuda" else "CPU ranks, gloo"


def print_startup_summary(
    cfg, model, ds_config, world, device, dtype, attn, out: Path, planned: dict, codebook_size: int | None = None
) -> None:
    """``planned``: the memory plan of this run (glm_grpo_ds/memory/startup.py ``startup_plan``), written to
    ``out/memory_plan.json``; ``codebook_size``: the visual ids the sampler draws from (whether top-k cuts)."""
    total = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    trainable = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters() if p.requires_grad)
    c = cfg
    nodes = launcher_nodes()
    log.info(
        f"glm-grpo: world size {world} ({nodes} node(s), {_ranks_on(device)}), ZeRO stage {zero_stage(ds_config)}, "
        f"{'LoRA r=' + str(c.lora.r) if c.lora else 'full fine-tuning'}, "
        f"trainable {trainable:,} / {total:,} params, "
        f"optimizer {c.optimizer.name}, dtype {dtype}, attention {attn}\n"
        f"          effective batch {world * c.batch.prompts_per_rank} prompts x G={c.grpo.group_size} = "
        f"{world * c.sequences_per_rank} sequences/step, micro-batch {c.batch.micro_batch_size}"
        f"{_updates_note(c)}, "
        f"{c.rollout.height}x{c.rollout.width}, sampling temperature {c.grpo.sampling.temperature} "
        f"top_k {c.grpo.sampling.top_k} top_p {c.grpo.sampling.top_p}{_cut_note(c.grpo.sampling, codebook_size)}"
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
