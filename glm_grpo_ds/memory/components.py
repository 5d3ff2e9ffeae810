"""The resident components of the memory plan (glm_grpo_ds/memory/plan.py): what a GPU holds for the whole step
(the ZeRO model states, the reference, the decoder, reward models, ZeRO buffers, the runtime), one function each
returning ``(bytes, note)``, and :func:`host_offloads`, what ZeRO keeps on the host instead. The formulas and
their sources are in plan.py's docstring; the transients of one phase are in memory/transients.py.
"""

from __future__ import annotations

import math

from .basis import Basis
from .host import GIB

RUNTIME_OVERHEAD = 2 * GIB  # CUDA context + NCCL buffers + allocator slack, per GPU (typical)
BNB_BLOCK = 256  # bitsandbytes 8-bit optimizer block size (one fp32 scale per block)
BNB_QMAPS = 2 * 256 * 4  # two fp32 code maps of 256 entries


def ar_weights(s: Basis) -> tuple[int, str]:
    if s.stage != 3:
        where = ", whole on every GPU"
    elif s.offload_param:
        where = f", ZeRO-3 partitions /{s.world} on the host (offload_param); here the tensors below the threshold"
    else:
        where = f", ZeRO-3 sharded /{s.world}"
    return s.placed(s.sizes.ar_base)[0], f"{sum(s.sizes.ar_base) / 1e9:.2f}B params, {s.dtype_name}{where}"


def lora_weights(s: Basis) -> tuple[int, str]:
    if not s.sizes.lora:
        note = "full fine-tuning: none"
    elif s.b == 4:
        note = "fp32"
    elif s.lora_b == 4:
        note = "fp32 (peft upcasts them; ZeRO-3 keeps them)"
    else:
        note = f"{s.dtype_name} (DeepSpeed casts peft's fp32 adapters)"
    if s.sizes.lora:
        note = f"{sum(s.sizes.lora) / 1e6:.1f}M params, {note}"
    return s.placed(s.sizes.lora, s.lora_b)[0], note


def gradient_partition(s: Basis) -> int:
    """Bytes of one rank's gradient partition, wherever it lives: ZeRO-2/3 partition the gradients, ZeRO-0/1 not."""
    return (s.shard(s.psi_t) if s.stage >= 2 else s.psi_t) * s.grad_b


def gradients_on_gpu(s: Basis) -> int:
    """The gradient partition on the GPU: stage3.py keeps it on ``self.device``, the host when the optimizer is
    offloaded."""
    return 0 if s.stage == 3 and s.offload_opt else gradient_partition(s)


def gradients(s: Basis) -> tuple[int, str]:
    nbytes = gradients_on_gpu(s)
    note = f"{s.psi_t / 1e6:.1f}M trainable" + (f" /{s.world}" if s.stage >= 2 else "")
    if s.stage == 3 and s.offload_opt:
        note += " (on the host: offload_optimizer)"
    if s.stage == 2 and s.world > 1:
        # ZeRO-2 keeps the whole gradient of a tensor that straddles a partition edge: worst rank
        nbytes += s.sizes.largest_trainable * s.grad_b
        note += " + the largest trainable tensor (worst rank)"
    return nbytes, note


def master_bytes(s: Basis) -> int:
    """The optimizer's fp32 master of the trainable partition (ZeRO-0: of every trainable parameter)."""
    return 4 * s.shard(s.psi_t) if s.stage >= 1 else 4 * s.psi_t


def master_weights(s: Basis) -> tuple[int, str]:
    return 0 if s.offload_opt else master_bytes(s), "fp32 copy of the trainable partition"


def adamw_states(s: Basis) -> bool:
    """Whether the optimizer keeps two fp32 moments: torch's AdamW, or DeepSpeed's CPU Adam when offloaded."""
    return s.cfg.optimizer.name == "adamw" or s.offload_opt


def state_bytes(s: Basis) -> int:
    """AdamW: two fp32 moments + the flat group's fp32 step counter; 8-bit AdamW: two uint8 codes and one fp32 scale
    per 256-block each + the code maps."""
    shard = s.shard(s.psi_t)
    if adamw_states(s):
        return 8 * shard + 4
    return 2 * shard + 2 * 4 * math.ceil(shard / BNB_BLOCK) + BNB_QMAPS


def optimizer_states(s: Basis) -> tuple[int, str]:
    note = "AdamW fp32 moments, 8 bytes/param" if adamw_states(s) else "8-bit AdamW, ~2 bytes/param"
    if s.offload_opt:
        return 0, note + " (offloaded to host)"
    return state_bytes(s), note


def reference(s: Basis) -> tuple[int, str]:
    if s.cfg.needs_reference_model:
        return s.placed(s.sizes.ar_base)[0], "frozen copy (full fine-tuning, beta > 0)" + (
            ", its partitions on the host" if s.offload_param else ""
        )
    if s.cfg.lora is not None and s.cfg.grpo.beta > 0 and s.cfg.grpo.ref_sync_steps:  # model/reference.py
        copy = sum(s.sizes.lora) * s.lora_b
        return copy, "LoRA: adapters disabled + the last reset's copy of them, whole (grpo.ref_sync_steps)"
    return 0, "LoRA: adapters disabled, no copy" if s.cfg.lora is not None else "beta = 0: no reference"


def lora_ema(s: Basis) -> tuple[int, str]:
    if s.cfg.lora is None or s.cfg.lora.ema_decay is None:
        return 0, "lora.ema_decay unset: none"
    return sum(s.sizes.lora) * 4, "lora.ema_decay: the adapter's moving average, whole on every GPU, fp32"


def decoder(s: Basis) -> tuple[int, str]:
    offload = s.cfg.decoder.offload
    note = f"DiT + VAE + glyph encoder, {s.sizes.decoder / 1e9:.2f}B params"
    if s.cfg.decoder.fp8:
        note += f" ({s.sizes.dit_fp8_weights / 1e9:.2f}B of them in fp8: decoder.fp8)"
    return 0 if offload else s.decoder_bytes, note + (" (offloaded: on the GPU only while decoding)" if offload else "")


def reward_models(s: Basis) -> tuple[int, str]:
    """The reward models held whole on every GPU (the component named ``reward_models``; where each reward model
    lives and its bytes are memory/reward_models.py's :func:`~glm_grpo_ds.memory.reward_models.reward_models`)."""
    on_gpu = [r for r in s.rewards if r.where == "gpu"]
    if on_gpu:
        return sum(r.bytes for r in on_gpu), f"whole on every GPU: {', '.join(r.name for r in on_gpu)} (list below)"
    return 0, "none on the GPU (list below)"


def zero_buffers(s: Basis) -> tuple[int, str]:
    return s.bucket * s.grad_b, "gradient reduce bucket"


def runtime_overhead(s: Basis) -> tuple[int, str]:
    if s.on_gpu:
        return RUNTIME_OVERHEAD, "CUDA context, NCCL, allocator slack (typical)"
    return 0, "CPU: Python and libraries not counted"


def host_offloads(s: Basis) -> dict[str, int]:
    """What ZeRO keeps on the host instead of the GPU, per rank: with offload_param the parameter partitions (and a
    frozen reference's); with offload_optimizer the fp32 master, the optimizer states and the fp32 gradient
    partition DeepSpeed's CPU Adam steps on, allocated once and kept (pinned: stage_1_and_2.py / stage3.py
    initialize_optimizer_states), and under ZeRO-3 the gradient partitions too."""
    host: dict[str, int] = {}
    parameters = s.placed(s.sizes.ar_base)[1] + s.placed(s.sizes.lora, s.lora_b)[1]
    if parameters:
        host["parameters"] = parameters
    if s.stage == 3 and s.offload_opt:
        host["gradients"] = gradient_partition(s)
    if s.offload_opt:
        host |= {"master_weights": master_bytes(s), "optimizer_states": state_bytes(s)}
        host["fp32_gradients"] = 4 * s.shard(s.psi_t)
    reference_on_host = s.placed(s.sizes.ar_base)[1] if s.cfg.needs_reference_model else 0
    if reference_on_host:
        host["reference"] = reference_on_host
    return host


def pinned_bytes(nbytes: int) -> int:
    """What torch's pinned host allocator takes for one ``nbytes`` request: the next power of two (its
    CachingHostAllocator rounds every request up, to reuse blocks by size class)."""
    return 1 << (nbytes - 1).bit_length() if nbytes > 0 else 0


def merge_copy_bytes(s: Basis, pinned: bool = False) -> int:
    """rollout.merge_lora's one copy of the adapted linears' base weights (model dtype); none under ZeRO-3 at N > 1,
    whose rollout discards its gathered weights. ``pinned``: in pinned host memory, each weight its own block of
    :func:`pinned_bytes` (GLM-Image's gate_up, 224 MB, takes 256 MiB: ~16 % over the weights)."""
    if not s.merging or (s.stage == 3 and s.world > 1):
        return 0
    if pinned:
        return sum(pinned_bytes(n * s.b) for n in s.sizes.adapted_base)
    return sum(s.sizes.adapted_base) * s.b


def place_merge_copy(s: Basis, without_copy: int, gpu: int) -> tuple[str | None, str]:
    """Where rollout.merge_lora's copy of the base weights lives, and why: ``rollout.merge_copy`` as set, or for
    ``auto`` the GPU when the plan (``without_copy`` bytes) plus the copy fits ``gpu`` bytes (the "fits" test of the
    plan), else the host."""
    cfg = s.cfg
    if not cfg.rollout.merge_lora or cfg.lora is None:
        return None, "rollout.merge_lora is off"
    if s.stage == 3 and s.world > 1:
        return None, f"ZeRO-3 on {s.world} ranks discards the rollout's gathered weights: nothing to restore"
    if not s.on_gpu:
        return ("host" if cfg.rollout.merge_copy == "host" else "device"), "CPU ranks: host and device are one memory"
    if cfg.rollout.merge_copy != "auto":
        return cfg.rollout.merge_copy, f"rollout.merge_copy={cfg.rollout.merge_copy}"
    copy = merge_copy_bytes(s)
    need = f"{(without_copy + copy) / GIB:.2f} GiB"
    if without_copy + copy <= gpu:
        return "device", f"merge_copy=auto: the plan with it, {need}, fits {gpu / GIB:.0f} GiB"
    return "host", f"merge_copy=auto: the plan with it on the GPU, {need}, exceeds {gpu / GIB:.0f} GiB"


def lora_merge_copy(s: Basis, placement: str | None, why: str) -> tuple[int, str]:
    """The merge copy on the GPU: counted where it is placed on the device, or anywhere on a CPU rank (one memory)."""
    counted = placement == "device" or (placement == "host" and not s.on_gpu)
    if not placement:
        return 0, f"LoRA merge copy (rollout.merge_lora): none ({why})"
    where = {"device": "on the GPU" if s.on_gpu else "in the rank's memory", "host": "in pinned host memory"}
    note = (
        f"LoRA merge copy (rollout.merge_lora): base weights of {len(s.sizes.adapted_base)} adapted linears, "
        f"{s.dtype_name}, {where[placement]} ({why})"
    )
    return merge_copy_bytes(s) if counted else 0, note
