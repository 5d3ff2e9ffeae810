"""Per-GPU memory plan of a GRPO run, before launch, from parameter counts (no weights needed).
Used by ``glm-grpo estimate-memory`` (glm_grpo_ds/commands/estimate_memory.py) and the trainer's startup summary.

    glm-grpo estimate-memory --config launch/configs/glm_image_lora.yaml \
        --deepspeed ds_configs/zero2.json --num-gpus 8 [--num-nodes 1] [--gpu-memory-gb 80] [--json]

Parameter counts come from the model configs (glm_grpo_ds/memory/sizes.py: ``model.path``'s pipeline
directory or the real GLM-Image sizes), exact per tensor, so ZeRO-3's partitions are too.

Model states (ZeRO paper, Rajbhandari et al. 2020: (2 + 2 + K)·Ψ/N for mixed-precision Adam),
with Ψ = AR parameters, Ψt = trainable ones (LoRA or the language model), N = data-parallel ranks,
b = bytes per model-dtype element (2 for bf16):

    weights     b·Ψ (ZeRO-1/2)  |  Σ ceil(ψ/N)·b per tensor, + b·ψ for tensors below the
                stage3_param_persistence_threshold, which ZeRO-3 keeps whole (ZeRO-3); LoRA adapters at
                4 bytes under ZeRO-3 (peft's fp32 adapters, which ZeRO-3 keeps: basis.py :func:`lora_bytes`)
    gradients   b·Ψt (ZeRO-1)   |  b·Ψt/N (ZeRO-3)          (DeepSpeed accumulates in the model dtype)
                ZeRO-2: b·Ψt/N + b·(largest trainable tensor): DeepSpeed keeps the whole gradient of a
                tensor that straddles a partition edge (the worst rank holds one)
                ZeRO-3 with offload_param: the partitions on the host, only the tensors below the threshold
                (partition and whole) on the GPU; the gradient partitions on the host with offload_optimizer
    fp32 master 4·Ψt/N                                     (0 on the GPU with offload_optimizer)
    fp32 grads  4·Ψt/N at optimizer.step (ZeRO-1/2), 4·(one sub-group: sub_group_size, or the largest
                tensor's partition when larger) (ZeRO-3, one sub-group at a time): a phase of its own,
                after the activations are freed
    optimizer   K·Ψt/N: AdamW K=8 (two fp32 moments); 8-bit AdamW K=2 + 8/256 (two uint8 codes and
                one fp32 scale per 256-block each) + 2 KiB of code maps; offloaded: on the host
    reference   0 with LoRA (adapters disabled) or beta = 0; else a frozen copy sharded like the weights; LoRA with
                grpo.ref_sync_steps: the last reset's copy of the adapters, whole, in their dtype
    lora_ema    lora.ema_decay: the adapter's moving average, whole, fp32: 4·Ψt
    merge copy  rollout.merge_lora: b·Σ in·out over the LoRA-adapted linears (their base weights, copied once to
                restore them after each rollout; 15.2 GiB for GLM-Image with all six projections of its 40
                layers adapted): on the GPU, or in pinned host RAM (rollout.merge_copy; auto: the GPU when the
                plan with it fits: ``plan(...)["merge_copy"]["placement"]``); none under ZeRO-3 at N > 1

Everything else is an activation-type estimate, labelled as such in the output: rollout KV cache
(B·T·layers·2·kv_heads·head_dim·b), the transient full gather of the AR during ZeRO-3 rollouts (at N = 1
too with offload_param: the gathered weights are then device copies of host partitions),
the model-dtype logits kept for backward plus one fp32 chunk, per-micro-batch activations
(with checkpointing: each layer's input + one layer recomputed; without: every layer's saved
tensors, 8h + 2·kv + 4·I elements per token for a GLM decoder layer), the frozen decoder (DiT + VAE
+ glyph encoder) and its decode activations, ZeRO buffers, and a fixed runtime allowance (CUDA
context, NCCL, allocator). Planned for CPU ranks (``--device cpu``, to compare with a CPU run) also: the
gloo staging copy of a ZeRO-3 gather and the optimizer step's fp32 temporaries. Peak = persistent +
the largest of the rollout / decode / update / step / reward phases (a merge_lora rollout first holds
the fp32 temporaries of merging its largest adapted linear).
Reward models (glm_grpo_ds/memory/reward_models.py): the config's ``rewards`` that hold a torch model (CLIP,
preference, aesthetic, LPIPS) sit whole on every GPU after their first score, or visit it while scoring
with ``offload: true``; OCR runs on the CPU, ``remote`` on its server; plugins are not counted.

Host RAM per node (glm_grpo_ds/memory/host.py): every rank's process, CPU-side reward state, ZeRO-offloaded
optimizer state, parameter and gradient partitions, an offloaded decoder and offloaded reward models, a merge_lora
copy kept there, plus at startup the reward models built on the host first (a CLIP checkpoint as shared page
cache), the whole AR under ZeRO-0/1/2 when cast, one decoder tensor per rank and rank 0's AR tensor under ZeRO-3;
``launch/slurm.sbatch`` asks for the default LoRA config's figure.

Layout: memory/basis.py resolves the run (dtype, ZeRO stage, offloads, token counts); memory/components.py has one
function per resident component and memory/transients.py one per transient, each returning ``(bytes, note)``;
memory/phases.py says which transients a phase holds at once; :func:`plan` composes them.
"""

from __future__ import annotations

import dataclasses

from .basis import Basis, EstimateConfig, grid_tokens, lora_bytes, resolve
from .components import (
    ar_weights,
    decoder,
    gradients,
    gradients_on_gpu,
    host_offloads,
    lora_ema,
    lora_merge_copy,
    lora_weights,
    master_weights,
    merge_copy_bytes,
    optimizer_states,
    place_merge_copy,
    reference,
    reward_models,
    runtime_overhead,
    zero_buffers,
)
from .disk import disk_plan
from .host import GIB, host_per_node
from .phases import MEASURED_PHASES, RESIDENT, phase_totals, transient_phases
from .sizes import Sizes, model_sizes
from .transients import (
    activations,
    decode_activations,
    decoder_fp8_load,
    fp32_grad_step,
    gather_staging,
    grad_flatten,
    logits,
    optimizer_step_temporaries,
    reward_offloaded,
    reward_scoring,
    rollout_fused_lora,
    rollout_gather,
    rollout_kv_cache,
    rollout_logprobs,
    rollout_merge,
    zero3_update_gather,
)

__all__ = [
    "GIB",
    "MEASURED_PHASES",
    "EstimateConfig",
    "grid_tokens",
    "lora_bytes",
    "phase_totals",
    "plan",
]

# Every component, each a function of the run's Basis returning (bytes, note), in the order the plan lists them
# (estimate-memory's table and --json, memory_plan.json). The merge copy, listed with the resident components, is
# placed last: where it goes depends on the rest of the plan.
COMPONENTS = (
    ar_weights,
    lora_weights,
    gradients,
    master_weights,
    fp32_grad_step,
    optimizer_states,
    optimizer_step_temporaries,
    grad_flatten,
    reference,
    lora_ema,
    decoder,
    reward_models,
    zero_buffers,
    lora_merge_copy,
    rollout_kv_cache,
    rollout_gather,
    rollout_merge,
    rollout_fused_lora,
    logits,
    rollout_logprobs,
    activations,
    zero3_update_gather,
    gather_staging,
    decode_activations,
    reward_offloaded,
    reward_scoring,
    decoder_fp8_load,
    runtime_overhead,
)


def plan(cfg, ds_raw: dict, est, sizes: Sizes | None = None) -> dict:
    """The memory plan as ``{"components": {name: bytes}, "phases": ..., "host_bytes": ..., "host_node": ..., ...}``.

    ``cfg`` = TrainConfig, ``ds_raw`` = the ds_configs JSON as read, ``est`` = EstimateConfig.
    """
    s = resolve(cfg, ds_raw, est, sizes or model_sizes(cfg))
    # the merge copy keeps its place in the list; its bytes wait for the plan without it
    parts = {part.__name__: (0, "") if part is lora_merge_copy else part(s) for part in COMPONENTS}
    comp = {name: nbytes for name, (nbytes, _) in parts.items()}
    phases = transient_phases(comp, cfg.rollout.one_step_off)
    gpu = int(est.gpu_memory_gb * GIB)
    resident = sum(comp[k] for k in RESIDENT)
    in_steps = {k: v for k, v in phases.items() if k != "load"}  # a training step's phases (not the decoder's load)
    without_copy = resident + max(in_steps.values())
    placement, why = place_merge_copy(s, without_copy, gpu)
    parts["lora_merge_copy"] = lora_merge_copy(s, placement, why)
    comp["lora_merge_copy"] = parts["lora_merge_copy"][0]
    # the decoder's load comes before the merge copy is made and the optimizer's first step creates its state
    at_load = resident - comp["optimizer_states"] + phases["load"]
    in_a_step = without_copy + comp["lora_merge_copy"]
    total = max(in_a_step, at_load)
    return {
        "components": comp,
        "notes": _notes(parts),
        "persistent": [*RESIDENT, "lora_merge_copy"],
        "phases": phases,
        "peak_phase": "load" if at_load > in_a_step else max(in_steps, key=in_steps.get),
        "total_bytes": total,
        "gpu_memory_bytes": gpu,
        "headroom_bytes": gpu - total,
        **_host_side(s, placement, why),
        # optimizer state that torch's AdamW and bitsandbytes create at their first step (DeepSpeed's
        # initialize_optimizer_states makes none): the phases of a run's first step before its optimizer step
        # do not hold it (:func:`phase_totals` with ``first_step=True``)
        "created_at_first_step": comp["optimizer_states"],
        "model_states": {  # what glm_grpo_ds.testing.model_state.model_state_bytes measures
            "parameters": comp["ar_weights"] + comp["lora_weights"],
            "gradients": comp["gradients"],
            "gradients_min": gradients_on_gpu(s),  # ranks whose partition edges cut no tensor
            "master": comp["master_weights"],
            "optimizer_states": comp["optimizer_states"],
            "fp32_grad_step": comp["fp32_grad_step"],
        },
        "setup": _setup(s),
        "disk": disk_plan(s),  # what output_dir holds: a checkpoint, the final weights, the run at most (disk.py)
    }


def _notes(parts: dict[str, tuple[int, str]]) -> dict[str, str]:
    """The components' notes, in the order memory_plan.json has always written them: the listed order, but the
    optimizer states' before the master weights' and the merge copy's last."""
    order = [name for name in parts if name not in ("optimizer_states", "lora_merge_copy")]
    order.insert(order.index("master_weights"), "optimizer_states")
    return {name: parts[name][1] for name in [*order, "lora_merge_copy"]}


def _host_side(s: Basis, placement: str | None, why: str) -> dict:
    """The host side of the plan: what ZeRO offloads per rank, host RAM per node, the reward models, and
    rollout.merge_lora's copy: "device" (counted on the GPU), "host" (pinned host RAM, in host_node) or None."""
    host = host_offloads(s)
    pinned = placement == "host" and s.on_gpu  # rollout/merged_lora.py pins a host copy of CUDA weights only
    merge_bytes = merge_copy_bytes(s, pinned=pinned)
    host_node = host_per_node(s, host, merge_copy=merge_bytes if pinned else 0)
    return {
        "host_bytes": host,
        "host_node": host_node,
        "rewards": [dataclasses.asdict(r) for r in s.rewards],
        "merge_copy": {"placement": placement, "bytes": merge_bytes, "requested": s.cfg.rollout.merge_copy, "why": why},
    }


def _setup(s: Basis) -> dict:
    """What the plan is of, as estimate-memory's header line prints it."""
    cfg = s.cfg
    return dict(
        world_size=s.world,
        nodes=s.est.num_nodes,
        zero_stage=s.stage,
        dtype=s.dtype_name,
        lora=cfg.lora is not None,
        optimizer=cfg.optimizer.name,
        offload_optimizer=s.offload_opt,
        offload_param=s.offload_param,
        sequences_per_gpu=cfg.sequences_per_rank,
        micro_batch=cfg.batch.micro_batch_size,
        size=f"{cfg.rollout.height}x{cfg.rollout.width}",
        sizes_from=s.sizes.source,
    )
