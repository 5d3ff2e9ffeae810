"""Host RAM per node of a GRPO run, at startup and steady (part of the memory plan, glm_grpo_ds/memory/plan.py,
which calls :func:`host_per_node`; ``glm-grpo estimate-memory`` prints it and ``launch/slurm.sbatch`` asks
for the default LoRA config's figure).

    glm-grpo estimate-memory --config launch/configs/glm_image_lora.yaml --deepspeed ds_configs/zero2.json
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..ds.gathering import SHARD_BYTES
from ..model.random_weights import is_random

if TYPE_CHECKING:  # the plan's resolved run; basis.py does not import this module, the annotation needs no import
    from .basis import Basis

GIB = 2**30
# Host RAM of one GPU rank besides what the plan counts: Python, torch / DeepSpeed / diffusers /
# transformers, the CUDA runtime's host side (assumed; a tiny CPU rank measures ~0.6 GiB here).
HOST_PER_RANK = 3 * GIB
HOST_REWARDS_PER_RANK = 1 * GIB  # CPU-side reward state (OCR's onnxruntime sessions, CLIP preprocessing; assumed)
HOST_MARGIN = 1.25  # what a scheduler request adds to the planned peak


def host_per_node(s: Basis, offloaded: dict, merge_copy: int = 0) -> dict:
    """Host RAM of one node's ranks (``s.est.num_gpus``) of the run ``s``: steady state and the peak while the models
    load; ``offloaded``: what ZeRO offloads to the host per rank (:func:`glm_grpo_ds.memory.components.host_offloads`).

    Steady, per rank: the process itself (:data:`HOST_PER_RANK`, on a GPU), CPU-side reward state, the
    optimizer state ZeRO offloads to the host (pinned: the pinned buffers are that state), the decoder when
    ``decoder.offload`` keeps it there, offloaded reward models, and ``merge_copy`` bytes: rollout.merge_lora's
    copy of the adapted base weights when it lives in pinned host memory (``rollout.merge_copy``).

    Startup adds, per rank, what the Trainer holds on the host before it reaches the GPU (train.py's order):
    * reward models: ``build_rewards`` builds them on the host first, and they stay there until their first
      score moves them to the GPU (FrozenModel.on). A CLIP checkpoint loads memory-mapped (its page cache,
      shared by the ranks, is listed below); the aesthetic head and LPIPS are copies, per rank;
    * the AR: under ZeRO-3 ``from_pretrained`` builds it partitioned on the GPU (``zero.Init``) and rank 0
      alone reads the checkpoint, layer by layer into gathered GPU parameters (transformers'
      ``_load_state_dict_into_zero3_model``): nothing per rank. Under ZeRO-0/1/2 every rank loads it whole on
      the host (policy.load_ar has no device_map) until ``deepspeed.initialize`` moves it: when the checkpoint
      dtype is the model dtype, transformers leaves the tensors on the memory-mapped safetensors file (shared
      page cache, measured: a fp32 AR loaded as fp32 points into the file's mapping, as bf16 into anonymous
      memory), else (or when the checkpoint dtype is unknown) a whole cast copy per rank. A full
      fine-tuning reference loads the same way;
    * one decoder tensor at a time, cast (up to fp32): the decoder goes to the GPU as it is read
      (glm_grpo_ds/decoder/image_decoder.py); the adapters are made on the host (small); an offloaded decoder
      with decoder.fp8 converts on the host, holding its block linears in its dtype until then
      (``decoder_converting``);
    * rank 0 alone, under ZeRO-3: one AR tensor, cast (up to fp32), on its way to the gathered parameter
      (counted once per node).
    The safetensors files are memory-mapped: page cache that the node's ranks share and the kernel can
    drop, listed but not added.

    The end of a full fine-tuning adds rank 0's one file of ``final_model/`` over the steady state (ds/io.py
    ``write_model``: at most :data:`SHARD_BYTES`, a larger AR tensor alone); the request covers the larger of the
    two peaks."""
    ranks, sizes, dtype, stage, rewards, on_gpu = s.est.num_gpus, s.sizes, s.dtype, s.stage, s.rewards, s.on_gpu
    decoder_on_host = s.decoder_bytes if s.cfg.decoder.offload else 0
    decoder_converting = s.decoder_converting_bytes if s.cfg.decoder.offload else 0  # fp8 converts on the host
    per_rank = {
        "process": HOST_PER_RANK if on_gpu else 0,
        "rewards": HOST_REWARDS_PER_RANK,
        **{f"offload_{k}": v for k, v in offloaded.items()},
        "decoder_offloaded": decoder_on_host,
        "reward_models_offloaded": sum(r.bytes for r in rewards if r.where == "offload"),
        "lora_merge_copy": merge_copy,
    }
    b = torch.empty(0, dtype=dtype).element_size()
    ar_whole = on_gpu and stage < 3 and sizes.checkpoint_dtype != dtype  # on a CPU run the plan counts it
    loading = {
        "reward_models": sum(r.bytes - r.mapped for r in rewards if r.where == "gpu") if on_gpu else 0,
        "ar_whole": sum(sizes.ar_base) * b if ar_whole else 0,
        "largest_tensor": max(sizes.largest_decoder_tensor, *sizes.lora, 0) * 4,
        "decoder_fp8_conversion": decoder_converting,
    }
    rank0 = max(sizes.ar_base, default=0) * 4 if stage == 3 else 0
    writing = (
        max(min(SHARD_BYTES, sum(sizes.ar_base) * b), max(sizes.ar_base, default=0) * b) if s.cfg.lora is None else 0
    )
    steady = ranks * sum(per_rank.values())
    peak = steady + ranks * sum(loading.values()) + rank0
    request = math.ceil(max(peak, steady + writing) * HOST_MARGIN / (16 * GIB)) * 16 * GIB
    return {
        "ranks": ranks,
        "per_rank": per_rank,
        "loading_per_rank": loading,
        "loading_rank0_bytes": rank0,
        "ar_whole_basis": _ar_whole_basis(s, ar_whole),
        "steady_bytes": steady,
        "loading_peak_bytes": peak,
        "writing_rank0_bytes": writing,
        # a random: model's weights are built in memory, from no file
        "page_cache_bytes": (0 if is_random(s.cfg.model.path) else (sum(sizes.ar_base) + sizes.decoder) * b)
        + sum(r.mapped for r in rewards),
        "request_bytes": request,
    }


def _ar_whole_basis(s: Basis, ar_whole: bool) -> str:
    """Why :func:`host_per_node` counts a whole copy of the AR per rank while it loads, or not, in words."""
    if s.stage == 3:
        return "ZeRO-3: the AR loads partitioned"
    if not s.on_gpu:
        return "CPU run: the plan counts the AR"
    if not ar_whole:
        return "checkpoint in the model dtype: the memory-mapped file, not added"
    if s.sizes.checkpoint_dtype is None:
        return "checkpoint dtype unknown (no pipeline directory): a whole cast copy per rank assumed"
    return f"checkpoint {s.sizes.checkpoint_dtype} cast to {s.dtype}: a whole copy per rank".replace("torch.", "")
