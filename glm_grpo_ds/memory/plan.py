"""Per-GPU memory plan of a GRPO run, before launch, from parameter counts (no weights needed).
Used by ``glm-grpo estimate-memory`` (glm_grpo_ds/commands/estimate_memory.py) and the trainer's startup summary.

    glm-grpo estimate-memory --config launch/configs/glm_image_lora_zero3.yaml \
        --deepspeed ds_configs/zero3.json --num-gpus 8 [--num-nodes 1] [--gpu-memory-gb 80] [--json]

Parameter counts come from the model configs (glm_grpo_ds/memory/sizes.py: ``model.path``'s pipeline
directory or the real GLM-Image sizes), exact per tensor, so ZeRO-3's partitions are too.

Model states (ZeRO paper, Rajbhandari et al. 2020: (2 + 2 + K)·Ψ/N for mixed-precision Adam),
with Ψ = AR parameters, Ψt = trainable ones (LoRA or the language model), N = data-parallel ranks,
b = bytes per model-dtype element (2 for bf16):

    weights     b·Ψ (ZeRO-1/2)  |  Σ ceil(ψ/N)·b per tensor, + b·ψ for tensors below the
                stage3_param_persistence_threshold, which ZeRO-3 keeps whole (ZeRO-3); LoRA adapters at
                4 bytes under ZeRO-3 (peft's fp32 adapters, which ZeRO-3 keeps: :func:`lora_bytes`)
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
    reference   0 with LoRA (adapters disabled) or beta = 0; else a frozen copy sharded like the weights
    merge copy  rollout.merge_lora: b·Σ in·out over the LoRA-adapted linears (their base weights, copied once to
                restore them after each rollout; 15.2 GiB for GLM-Image with all six projections of its 40
                layers adapted): on the GPU, or in pinned host RAM (rollout.merge_copy; auto: the GPU when the
                plan with it fits, :func:`merge_copy_placement`); none under ZeRO-3 at N > 1

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
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from .host import GIB, host_per_node
from .reward_models import reward_models
from .sizes import Sizes, model_sizes

RUNTIME_OVERHEAD = 2 * GIB  # CUDA context + NCCL buffers + allocator slack, per GPU (typical)
BNB_BLOCK = 256  # bitsandbytes 8-bit optimizer block size (one fp32 scale per block)
BNB_QMAPS = 2 * 256 * 4  # two fp32 code maps of 256 entries


@dataclass
class EstimateConfig:
    """What the plan is for: the cluster shape and the planner's own assumptions (the defaults of
    ``glm-grpo estimate-memory``)."""

    num_gpus: int = 8  # GPUs per node
    num_nodes: int = 1
    gpu_memory_gb: float = 80.0  # GiB per GPU to plan against
    prompt_tokens: int = 128  # longest prompt in tokens (chat template included); sizes the KV cache
    device: str = "cuda"  # cuda: model.dtype auto = bf16; cpu: auto = fp32 (to compare with CPU runs)


def grid_tokens(height: int, width: int) -> int:
    """Generated tokens per image: the target grid (H/32 x W/32) plus the preview grid, whose
    sides GlmImageProcessor sets to 16·sqrt(aspect ratio) and 16/sqrt(aspect ratio)."""
    ratio = height / width
    return (height // 32) * (width // 32) + int(math.sqrt(ratio) * 16) * int(math.sqrt(1 / ratio) * 16)


def _zero3_bytes(numels: list[int], n: int, persist_below: int, b: int) -> int:
    """Per-rank bytes of ZeRO-3 parameters: each tensor's partition, plus the whole of tensors below
    the persistence threshold (DeepSpeed keeps those gathered after their first use)."""
    return sum(math.ceil(k / n) * b + (k * b if k < persist_below else 0) for k in numels)


def _zero3_placed(numels: list[int], n: int, persist_below: int, b: int, offload_param: bool) -> tuple[int, int]:
    """``(device, host)`` bytes of ZeRO-3 parameters. With ``offload_param`` DeepSpeed puts a partition on its
    remote device, the host, unless the tensor is persistent (below the threshold: zero/partition_parameters.py
    ``_partition_param``, ``device = self.local_device if param.ds_persist else self.remote_device``), so only the
    persistent tensors (partition and whole) stay on the device."""
    if not offload_param:
        return _zero3_bytes(numels, n, persist_below, b), 0
    kept = [k for k in numels if k < persist_below]
    return _zero3_bytes(kept, n, persist_below, b), _zero3_bytes([k for k in numels if k >= persist_below], n, 0, b)


def lora_bytes(stage: int, b: int) -> int:
    """Bytes per LoRA adapter element on the GPU, after ``deepspeed.initialize``.

    peft upcasts the adapters of a bf16/fp16 base to fp32: ``get_peft_model``'s ``autocast_adapter_dtype=True``
    (peft/peft_model.py, ``PeftModel.__init__`` -> ``base_model._cast_adapter_dtype`` ->
    peft/tuners/tuners_utils.py ``cast_adapter_dtype``: float16 / bfloat16 -> float32); checked on the tiny
    model after our make_trainable in tests/unit/test_memory_plan.py. What DeepSpeed 0.19.8 then does
    (deepspeed/runtime/engine.py ``_configure_distributed_model``): it casts every parameter to the bf16/fp16
    dtype (``_cast_module_mixed_precision``) unless the model was built by ``zero.Init``. Under ZeRO-3 ours is
    (glm_grpo_ds/ds/engine.py ``zero3_model_loading``), and the adapters, added afterwards, are partitioned
    as they are (zero/parameter_offload.py ``_convert_to_zero_parameters``: no cast): fp32. ZeRO-0/1/2:
    bf16, like the base. Either way the optimizer keeps its own fp32 master (stage3.py makes no copy only
    when the partition's device equals ``self.device``, a string it compares with a torch.device: never)
    and the gradient partitions are in the engine's dtype (``grad_accum_dtype`` defaults to it).
    tests/integration/test_memory_plan_deepspeed.py measures both cases."""
    return 4 if stage == 3 else b


def _merge_copy_placement(
    cfg, stage: int, world: int, on_gpu: bool, copy: int, without_copy: int, gpu: int
) -> tuple[str | None, str]:
    """Where rollout.merge_lora's copy of the base weights lives, and why: ``rollout.merge_copy`` as set, or for
    ``auto`` the GPU when the plan plus the copy fits ``gpu`` bytes (the "fits" test of the plan), else the host."""
    if not cfg.rollout.merge_lora or cfg.lora is None:
        return None, "rollout.merge_lora is off"
    if stage == 3 and world > 1:
        return None, f"ZeRO-3 on {world} ranks discards the rollout's gathered weights: nothing to restore"
    if not on_gpu:
        return ("host" if cfg.rollout.merge_copy == "host" else "device"), "CPU ranks: host and device are one memory"
    if cfg.rollout.merge_copy != "auto":
        return cfg.rollout.merge_copy, f"rollout.merge_copy={cfg.rollout.merge_copy}"
    need = f"{(without_copy + copy) / GIB:.2f} GiB"
    if without_copy + copy <= gpu:
        return "device", f"merge_copy=auto: the plan with it, {need}, fits {gpu / GIB:.0f} GiB"
    return "host", f"merge_copy=auto: the plan with it on the GPU, {need}, exceeds {gpu / GIB:.0f} GiB"


def merge_copy_placement(cfg, ds_raw: dict, est, sizes: Sizes | None = None) -> str | None:
    """Where the run keeps rollout.merge_lora's copy of the adapted base weights: ``"device"``, ``"host"``, or None
    (no merge, or ZeRO-3 on several ranks). ``rollout.merge_copy=auto`` resolved by the plan (:func:`plan`)."""
    return plan(cfg, ds_raw, est, sizes)["merge_copy"]["placement"]


def plan(cfg, ds_raw: dict, est, sizes: Sizes | None = None) -> dict:
    """The memory plan as ``{"components": {name: bytes}, "phases": ..., "host": ..., ...}``.

    ``cfg`` = TrainConfig, ``ds_raw`` = the ds_configs JSON as read, ``est`` = EstimateConfig.
    """
    from ..ds.ds_config import fill_ds_config, offloads
    from ..model.glm_image import resolve_dtype

    sizes = sizes or model_sizes(cfg)
    world = est.num_gpus * est.num_nodes
    on_gpu = est.device == "cuda"  # else CPU ranks: a CPU run's own plan, to compare with it
    dtype = resolve_dtype(cfg.model.dtype, on_gpu=on_gpu)
    dcfg = fill_ds_config(ds_raw, cfg, world, sizes.text["hidden"], dtype)
    zero = dcfg.get("zero_optimization", {})
    stage = int(zero.get("stage", 0))
    b = torch.empty(0, dtype=dtype).element_size()
    grad_b = b  # DeepSpeed accumulates gradients in the model dtype unless data_types says otherwise
    if dcfg.get("data_types", {}).get("grad_accum_dtype") == "fp32":
        grad_b = 4
    offload_opt = offloads(zero, "offload_optimizer")
    # offload_param is a ZeRO-3 setting (DeepSpeed reads it at stage 3 only); cpu and nvme alike leave the GPU
    offload_param = stage == 3 and offloads(zero, "offload_param")
    persist = int(zero.get("stage3_param_persistence_threshold", 0)) if stage == 3 else 0
    psi_t = sizes.trainable
    lora_b = lora_bytes(stage, b)
    trainable_b = lora_b if sizes.lora else b  # autograd's gradient has the parameter's dtype
    shard = lambda k: math.ceil(k / world)  # noqa: E731 - ZeRO partition of k elements

    host: dict[str, int] = {}  # what ZeRO offloads to the host, per rank

    def weights(numels, nbytes=b, kind="parameters"):
        if stage != 3:
            return sum(numels) * nbytes
        device, on_host = _zero3_placed(numels, world, persist, nbytes, offload_param)
        if on_host:
            host[kind] = host.get(kind, 0) + on_host
        return device

    comp: dict[str, int] = {}
    notes: dict[str, str] = {}
    comp["ar_weights"] = weights(sizes.ar_base)
    notes["ar_weights"] = f"{sum(sizes.ar_base) / 1e9:.2f}B params, {dtype}".replace("torch.", "") + (
        (
            f", ZeRO-3 partitions /{world} on the host (offload_param); here the tensors below the threshold"
            if offload_param
            else f", ZeRO-3 sharded /{world}"
        )
        if stage == 3
        else ", whole on every GPU"
    )
    comp["lora_weights"] = weights(sizes.lora, lora_b)
    notes["lora_weights"] = (
        f"{sum(sizes.lora) / 1e6:.1f}M params, "
        + (
            "fp32"
            if b == 4
            else "fp32 (peft upcasts them; ZeRO-3 keeps them)"
            if lora_b == 4
            else f"{dtype} (DeepSpeed casts peft's fp32 adapters)".replace("torch.", "")
        )
        if sizes.lora
        else "full fine-tuning: none"
    )
    comp["gradients"] = (shard(psi_t) if stage >= 2 else psi_t) * grad_b
    notes["gradients"] = f"{psi_t / 1e6:.1f}M trainable" + (f" /{world}" if stage >= 2 else "")
    if stage == 3 and offload_opt:
        # stage3.py: the gradient partitions live on ``self.device``, the host when the optimizer is offloaded
        host["gradients"] = comp["gradients"]
        comp["gradients"] = 0
        notes["gradients"] += " (on the host: offload_optimizer)"
    grad_partition = comp["gradients"]
    if stage == 2 and world > 1:
        # ZeRO-2 keeps the whole gradient of a tensor that straddles a partition edge: worst rank
        comp["gradients"] += sizes.largest_trainable * grad_b
        notes["gradients"] += " + the largest trainable tensor (worst rank)"
    master = 4 * shard(psi_t) if stage >= 1 else 4 * psi_t
    if cfg.optimizer.name == "adamw" or offload_opt:
        states = 8 * shard(psi_t) + 4  # + torch AdamW's fp32 step counter of the flat group
        notes["optimizer_states"] = "AdamW fp32 moments, 8 bytes/param"
    else:
        states = 2 * shard(psi_t) + 2 * 4 * math.ceil(shard(psi_t) / BNB_BLOCK) + BNB_QMAPS
        notes["optimizer_states"] = "8-bit AdamW, ~2 bytes/param"
    if offload_opt:
        # + the fp32 gradient partition that DeepSpeed's CPU Adam steps on, allocated once and kept (pinned):
        # stage_1_and_2.py / stage3.py initialize_optimizer_states
        host |= {"master_weights": master, "optimizer_states": states, "fp32_gradients": 4 * shard(psi_t)}
        master = states = 0
        notes["optimizer_states"] += " (offloaded to host)"
    comp["master_weights"] = master
    notes["master_weights"] = "fp32 copy of the trainable partition"
    # At optimizer.step DeepSpeed converts the gradient partition to fp32 for the fp32 master
    # (ZeRO-1/2: the whole partition at once; ZeRO-3: one sub-group at a time). A ZeRO-3 sub-group holds
    # whole parameter partitions: up to sub_group_size elements, or one partition larger than that (the
    # 168 064 x 4096 embedding of full fine-tuning: 688 M elements / N, whatever sub_group_size says).
    sub_group = min(shard(psi_t), max(int(zero.get("sub_group_size", 1e9)), shard(sizes.largest_trainable)))
    if stage == 0 or offload_opt:
        comp["fp32_grad_step"] = 0
        notes["fp32_grad_step"] = (
            "stage 0: the optimizer steps on the gradients" if stage == 0 else "offloaded: on the host"
        )
    elif stage == 3:
        comp["fp32_grad_step"] = 4 * sub_group
        notes["fp32_grad_step"] = "fp32 gradients of one ZeRO-3 sub-group at optimizer.step"
    else:
        comp["fp32_grad_step"] = 4 * shard(psi_t)
        notes["fp32_grad_step"] = "fp32 copy of the gradient partition at optimizer.step"
    comp["optimizer_states"] = states
    # What the step allocates beside the fp32 gradients. Measured on a CPU (docs/real-width.md): bitsandbytes
    # has no in-place CPU kernel for its 8-bit AdamW; the step dequantizes both moments and computes in fp32
    # temporaries, 5 x the fp32 elements it steps (bitsandbytes 0.50.2); torch's AdamW (one tensor at a time
    # on a CPU) 2 x. On a GPU torch's AdamW runs its foreach path (torch/optim/adam.py defaults to foreach for
    # CUDA tensors), which allocates one fp32 temporary of the stepped elements (``_foreach_sqrt`` of the second
    # moment): the full fine-tuning slice's step on an H200 (memory/measured.py) needs it. bitsandbytes' GPU
    # kernel and DeepSpeed's CPU Adam of an offloaded optimizer update in place. ZeRO-3 steps one sub-group
    # at a time.
    stepped = sub_group if stage == 3 else shard(psi_t)
    torch_adamw = cfg.optimizer.name == "adamw"
    if offload_opt or (on_gpu and not torch_adamw):
        comp["optimizer_step_temporaries"] = 0
        notes["optimizer_step_temporaries"] = "the optimizer updates in place"
    elif on_gpu:
        comp["optimizer_step_temporaries"] = 4 * stepped
        notes["optimizer_step_temporaries"] = "GPU: torch AdamW's foreach step, one fp32 temporary"
    else:
        comp["optimizer_step_temporaries"] = (2 if torch_adamw else 5) * 4 * stepped
        notes["optimizer_step_temporaries"] = (
            f"CPU: {'torch AdamW' if torch_adamw else 'bitsandbytes 8-bit AdamW'}'s fp32 temporaries"
        )
    # DeepSpeed makes the fp32 gradient by flattening the model-dtype gradient partition into a new tensor and
    # converting that (stage3.py _prepare_fp32_grad_for_sub_group, stage_1_and_2.py step: ``flatten(...).to(fp32)``):
    # for a moment the flat model-dtype copy and the fp32 result exist together, before the optimizer runs.
    flattens = stage >= 1 and not offload_opt and grad_b < 4
    comp["grad_flatten"] = grad_b * stepped if flattens else 0
    notes["grad_flatten"] = (
        "the flat model-dtype gradient DeepSpeed converts to fp32 (beside it, before the optimizer step)"
        if flattens
        else "no flat copy"
    )
    needs_ref = cfg.needs_reference_model
    comp["reference"] = weights(sizes.ar_base, kind="reference") if needs_ref else 0
    notes["reference"] = (
        "frozen copy (full fine-tuning, beta > 0)" + (", its partitions on the host" if offload_param else "")
        if needs_ref
        else ("LoRA: adapters disabled, no copy" if cfg.lora is not None else "beta = 0: no reference")
    )
    dec_b = torch.empty(0, dtype=resolve_dtype(cfg.decoder.dtype, on_gpu=on_gpu)).element_size()
    decoder = sizes.decoder * dec_b
    comp["decoder"] = 0 if cfg.decoder.offload else decoder
    notes["decoder"] = f"DiT + VAE + glyph encoder, {sizes.decoder / 1e9:.2f}B params" + (
        " (offloaded: on the GPU only while decoding)" if cfg.decoder.offload else ""
    )
    rewards = reward_models(cfg.rewards)
    on_gpu_rewards = [r for r in rewards if r.where == "gpu"]
    offloaded_rewards = [r for r in rewards if r.where == "offload"]
    comp["reward_models"] = sum(r.bytes for r in on_gpu_rewards)
    notes["reward_models"] = (
        f"whole on every GPU: {', '.join(r.name for r in on_gpu_rewards)} (list below)"
        if on_gpu_rewards
        else "none on the GPU (list below)"
    )
    bucket = int(zero.get("reduce_bucket_size", 5e8)) if stage >= 1 else 0
    comp["zero_buffers"] = bucket * grad_b
    notes["zero_buffers"] = "gradient reduce bucket"
    # rollout.merge_lora: one copy of the adapted linears' base weights (model dtype), placed below
    merging = cfg.rollout.merge_lora and bool(sizes.adapted_base)
    merge_bytes = sum(sizes.adapted_base) * b if merging and not (stage == 3 and world > 1) else 0
    comp["lora_merge_copy"] = 0  # its placement needs the rest of the plan

    # ---- transients, one phase at a time
    t = sizes.text
    n_gen = grid_tokens(cfg.rollout.height, cfg.rollout.width)
    seq = est.prompt_tokens + n_gen
    rows = cfg.sequences_per_rank
    mb = cfg.batch.micro_batch_size
    comp["rollout_kv_cache"] = rows * seq * t["layers"] * 2 * t["kv_heads"] * t["head_dim"] * b
    notes["rollout_kv_cache"] = f"{rows} sequences x {seq} tokens ({est.prompt_tokens} prompt + {n_gen} generated)"
    full_ar = sum(sizes.ar_base) * b + sum(sizes.lora) * lora_b
    # one ZeRO-3 rank holds whole tensors already: DeepSpeed's gather then only points at them, unless they are
    # offloaded (partition_parameters.py NoGatherHandle: ``ds_tensor.to(device)``, a copy of the host partition)
    copies = world > 1 or offload_param
    gather = stage == 3 and copies and cfg.rollout.gather_parameters
    comp["rollout_gather"] = full_ar if gather else 0
    notes["rollout_gather"] = "ZeRO-3: whole AR gathered once per rollout" if gather else "no full gather"
    # The merge (merged_lora.py) writes W + s·B·A one linear at a time, before the KV cache exists: the fp32
    # delta, W in fp32 and their fp32 sum (12 bytes per element of the largest adapted linear; a fp32 W is
    # its own .float(): 8)
    comp["rollout_merge"] = (12 if b < 4 else 8) * max(sizes.adapted_base) if merging else 0
    notes["rollout_merge"] = (
        "rollout.merge_lora: fp32 temporaries of merging the largest adapted linear" if merging else "no merge"
    )
    # rollout.fuse_lora (fused_lora.py): per layer, the q/k/v adapters' A's concatenated and their s*B as a
    # block-diagonal matrix, made for the rollout (alongside the KV cache), in the adapters' dtype
    shared = [m for m in ("q_proj", "k_proj", "v_proj") if cfg.lora is not None and m in cfg.lora.target_modules]
    fusing = cfg.rollout.fuse_lora and len(shared) > 1
    qkv_out = {"q_proj": t["heads"] * t["head_dim"], "k_proj": t["kv_heads"] * t["head_dim"]}
    qkv_out["v_proj"] = qkv_out["k_proj"]
    r = cfg.lora.r if cfg.lora is not None else 0
    per_layer_fused = len(shared) * r * (t["hidden"] + sum(qkv_out[m] for m in shared))
    comp["rollout_fused_lora"] = t["layers"] * per_layer_fused * lora_b if fusing else 0
    notes["rollout_fused_lora"] = (
        f"rollout.fuse_lora: {'/'.join(m[0] for m in shared)} A's concatenated and block-diagonal s*B, per layer"
        if fusing
        else "no fused LoRA copies"
    )
    comp["logits"] = (
        mb * n_gen * t["vision_vocab"] * b + 3 * mb * min(cfg.grpo.logprob_chunk_size, n_gen) * t["vision_vocab"] * 4
    )
    notes["logits"] = f"micro-batch {mb}: {dtype} logits kept for backward + one fp32 chunk".replace("torch.", "")
    h, kv, inter = t["hidden"], t["kv_heads"] * t["head_dim"], t["intermediate"]
    per_layer = 8 * h + 2 * kv + 4 * inter  # elements saved per token by one decoder layer
    # The reference (LoRA) and old log-probs run in the rollout's gather, after sampling (the KV cache is
    # gone): no-grad forwards of a micro-batch, one layer's tensors at a time and one fp32 logits chunk.
    chunk = min(cfg.grpo.logprob_chunk_size, n_gen)
    comp["rollout_logprobs"] = (
        mb * seq * per_layer * b + 3 * mb * chunk * t["vision_vocab"] * 4 if cfg.logprobs_in_rollout else 0
    )
    notes["rollout_logprobs"] = (
        f"reference / old log-probs in the rollout's gather, micro-batch {mb}, no grad"
        if cfg.logprobs_in_rollout
        else "none (no reference / old pass)"
    )
    if cfg.model.gradient_checkpointing:
        comp["activations"] = mb * seq * (t["layers"] * h + per_layer) * b
        notes["activations"] = f"micro-batch {mb} x {seq} tokens, checkpointed (layer inputs + one layer)"
    else:
        comp["activations"] = mb * seq * t["layers"] * per_layer * b
        notes["activations"] = f"micro-batch {mb} x {seq} tokens, every layer's saved tensors"
    # ZeRO-3 keeps up to stage3_max_live_parameters gathered (checkpointing reuses each layer
    # soon, so they are not released early) plus one prefetch bucket.
    live = min(int(zero.get("stage3_max_live_parameters", 1e9)), sum(sizes.ar_base) + sum(sizes.lora))
    gathered = (live + int(zero.get("stage3_prefetch_bucket_size", 0))) * b
    gathered = gathered if copies else 0  # one rank, nothing offloaded: the gathered parameters are the weights
    # Plus the whole gradient of the largest trainable tensor, which exists before its reduce-scatter.
    comp["zero3_update_gather"] = gathered + sizes.largest_trainable * max(grad_b, trainable_b) if stage == 3 else 0
    notes["zero3_update_gather"] = (
        "ZeRO-3 live parameters + prefetch bucket + the largest tensor's full gradient" if stage == 3 else "-"
    )
    # Measured on the real-width slice (docs/real-width.md): torch's gloo backend (CPU ranks) all-gathers
    # into a temporary of the output's full size and then copies it out, so a ZeRO-3 gather holds its
    # largest tensor (the 168 064 x 4096 embedding) twice for a moment; NCCL writes the output in place.
    staged = stage == 3 and world > 1 and not on_gpu
    comp["gather_staging"] = max(sizes.ar_base) * b if staged else 0
    notes["gather_staging"] = (
        "CPU ranks (gloo): the largest gathered tensor staged once more" if staged else "NCCL gathers in place"
    )
    # One DiT batch holds the rows of one prompt (decoder.py); GlmImagePipeline runs the CFG pass as a
    # second forward, not a doubled batch. The DiT's and the VAE's activations are never alive together.
    # VAE: its last up block holds its input, the norm and the activation of it: 3 full-resolution maps
    # of vae_full_res_channels on a CPU (measured on the real-width slice at 1024x1024: 3.0 GiB for 2 bf16
    # images), 4 on a GPU (measured on an H200, memory/measured.py: 4.03 GiB for the same 2 images; GLM-Image at
    # full size, 8 images: the decode peak 3.9 GiB above the 3-map plan), the convolution's extra output map.
    images = min(cfg.decoder.batch_size, cfg.grpo.group_size)
    latent_tokens = (cfg.rollout.height // 16) * (cfg.rollout.width // 16)
    dit = images * latent_tokens * sizes.dit_hidden * dec_b * 12
    vae_maps = 4 if on_gpu else 3
    vae = images * sizes.vae_full_res_channels * cfg.rollout.height * cfg.rollout.width * dec_b * vae_maps
    comp["decode_activations"] = max(dit, vae) + (decoder if cfg.decoder.offload else 0)
    notes["decode_activations"] = f"{images} images per DiT forward and VAE decode, the larger of the two"
    # an offloaded reward model visits the GPU for its own call only (FrozenModel.on), one at a time;
    # scoring activations (a 224-px CLIP batch) are small beside it and not counted
    comp["reward_offloaded"] = max((r.bytes for r in offloaded_rewards), default=0)
    notes["reward_offloaded"] = (
        "largest offloaded reward model, on the GPU while it scores" if offloaded_rewards else "no offloaded reward"
    )
    comp["runtime_overhead"] = RUNTIME_OVERHEAD if on_gpu else 0
    notes["runtime_overhead"] = (
        "CUDA context, NCCL, allocator slack (typical)" if on_gpu else "CPU: Python and libraries not counted"
    )

    persistent = [
        "ar_weights",
        "lora_weights",
        "gradients",
        "master_weights",
        "optimizer_states",
        "reference",
        "decoder",
        "reward_models",
        "zero_buffers",
        "runtime_overhead",
    ]
    phases = {
        "rollout": max(comp["rollout_kv_cache"], comp["rollout_logprobs"], comp["rollout_merge"])
        + comp["rollout_gather"]
        + comp["rollout_fused_lora"]
        + comp["gather_staging"],
        "decode": comp["decode_activations"],
        "update": comp["logits"] + comp["activations"] + comp["zero3_update_gather"] + comp["gather_staging"],
        # activations are freed by then; the flat copy is gone before the optimizer allocates its temporaries
        "step": comp["fp32_grad_step"] + max(comp["grad_flatten"], comp["optimizer_step_temporaries"]),
        "reward": comp["reward_offloaded"],
    }
    gpu = int(est.gpu_memory_gb * GIB)
    without_copy = sum(comp[k] for k in persistent) + max(phases.values())
    placement, why = _merge_copy_placement(cfg, stage, world, on_gpu, merge_bytes, without_copy, gpu)
    counted = placement == "device" or (placement == "host" and not on_gpu)  # a CPU rank: one memory
    comp["lora_merge_copy"] = merge_bytes if counted else 0
    where = {"device": "on the GPU" if on_gpu else "in the rank's memory", "host": "in pinned host memory"}
    notes["lora_merge_copy"] = (
        f"LoRA merge copy (rollout.merge_lora): base weights of {len(sizes.adapted_base)} adapted linears, "
        f"{str(dtype).replace('torch.', '')}, {where[placement]} ({why})"
        if placement
        else f"LoRA merge copy (rollout.merge_lora): none ({why})"
    )
    persistent.append("lora_merge_copy")
    total = without_copy + comp["lora_merge_copy"]
    host_node = host_per_node(
        est.num_gpus,
        host,
        decoder if cfg.decoder.offload else 0,
        sizes,
        dtype,
        stage,
        rewards,
        on_gpu,
        merge_copy=merge_bytes if placement == "host" and on_gpu else 0,
    )
    return {
        "components": comp,
        "notes": notes,
        "persistent": persistent,
        "phases": phases,
        "peak_phase": max(phases, key=phases.get),
        "total_bytes": total,
        "gpu_memory_bytes": gpu,
        "headroom_bytes": gpu - total,
        "host_bytes": host,
        "host_node": host_node,
        "rewards": [dataclasses.asdict(r) for r in rewards],
        # rollout.merge_lora's copy: "device" (counted above), "host" (pinned host RAM, in host_node) or None
        "merge_copy": {"placement": placement, "bytes": merge_bytes, "requested": cfg.rollout.merge_copy, "why": why},
        # optimizer state that torch's AdamW and bitsandbytes create at their first step (DeepSpeed's
        # initialize_optimizer_states makes none): the phases of a run's first step before its optimizer step
        # do not hold it (:func:`phase_totals` with ``first_step=True``)
        "created_at_first_step": comp["optimizer_states"],
        "model_states": {  # what glm_grpo_ds.testing.model_state.model_state_bytes measures
            "parameters": comp["ar_weights"] + comp["lora_weights"],
            "gradients": comp["gradients"],
            "gradients_min": grad_partition,  # ranks whose partition edges cut no tensor
            "master": comp["master_weights"],
            "optimizer_states": comp["optimizer_states"],
            "fp32_grad_step": comp["fp32_grad_step"],
        },
        "setup": dict(
            world_size=world,
            nodes=est.num_nodes,
            zero_stage=stage,
            dtype=str(dtype).replace("torch.", ""),
            lora=cfg.lora is not None,
            optimizer=cfg.optimizer.name,
            offload_optimizer=offload_opt,
            offload_param=offload_param,
            sequences_per_gpu=rows,
            micro_batch=mb,
            size=f"{cfg.rollout.height}x{cfg.rollout.width}",
            sizes_from=sizes.source,
        ),
    }


# measured phase (metrics.jsonl ``memory/<phase>_peak_mb``) -> the plan's transient phases it contains
MEASURED_PHASES = {"rollout": ("rollout",), "decode": ("decode",), "reward": ("reward",), "update": ("update", "step")}


def phase_totals(planned: dict, first_step: bool = False) -> dict[str, int]:
    """Bytes per measured phase (:data:`MEASURED_PHASES`): the persistent components + the largest transient
    the phase contains. ``first_step``: the phases of a run's first step, whose rollout, decode and reward come
    before the optimizer's first step has created its state (``created_at_first_step``); its update makes it."""
    persistent = sum(planned["components"][k] for k in planned["persistent"])
    lazy = planned.get("created_at_first_step", 0) if first_step else 0
    return {
        name: persistent + max(planned["phases"][p] for p in inner) - (0 if name == "update" else lazy)
        for name, inner in MEASURED_PHASES.items()
    }
