"""What every component of the memory plan reads (glm_grpo_ds/memory/plan.py): the cluster the plan is for
(:class:`EstimateConfig`), and the run resolved once into the quantities the formulas use (:class:`Basis`: the
DeepSpeed config as the trainer fills it, the ZeRO stage and its offloads, bytes per element of the weights, the
gradients and the LoRA adapters, the token counts of one rollout), with the ZeRO-3 placement of a list of tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..decoder.fp8 import QUANTIZE_BYTES
from .reward_models import RewardModel, reward_models
from .sizes import Sizes


@dataclass
class EstimateConfig:
    """What the plan is for: the cluster shape and the planner's own assumptions (the defaults of
    ``glm-grpo estimate-memory``)."""

    num_gpus: int = 8  # GPUs per node
    num_nodes: int = 1
    gpu_memory_gb: float = 80.0  # GiB per GPU to plan against
    prompt_tokens: int = 128  # longest prompt in tokens (chat template included); sizes the KV cache
    device: str = "cuda"  # cuda: model.dtype auto = bf16; cpu: auto = fp32 (to compare with CPU runs)
    # the world size when the nodes differ (a hostfile's slots, summed; num_gpus is then the largest node's, which
    # sizes the host RAM per node); None = num_gpus x num_nodes
    ranks: int | None = None

    @property
    def world(self) -> int:
        """The ranks of the job: what ZeRO shards over and the DeepSpeed config is filled for."""
        return self.ranks or self.num_gpus * self.num_nodes


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


@dataclass
class Basis:
    """One run on one cluster, resolved: ``cfg`` = TrainConfig, ``est`` = :class:`EstimateConfig`; the ZeRO settings
    are the filled DeepSpeed config's. Made by :func:`resolve`."""

    cfg: object
    est: EstimateConfig
    sizes: Sizes
    world: int  # data-parallel ranks
    on_gpu: bool  # else CPU ranks: a CPU run's own plan, to compare with it
    dtype: torch.dtype  # the AR's
    stage: int
    b: int  # bytes per model-dtype element
    grad_b: int  # bytes per gradient element (DeepSpeed accumulates in the model dtype unless told otherwise)
    lora_b: int  # bytes per LoRA adapter element (:func:`lora_bytes`)
    dec_b: int  # bytes per decoder element
    offload_opt: bool
    offload_param: bool  # ZeRO-3's partitions on the host
    # from the zero config, read as ints: ZeRO-3 keeps tensors below ``persist`` elements whole; its optimizer steps
    # sub-groups of ``sub_group_size`` elements; ``bucket``: the gradient reduce bucket (elements, ZeRO-1/2/3);
    # ZeRO-3 keeps up to ``max_live`` parameters gathered, plus a prefetch bucket of ``prefetch``
    persist: int
    sub_group_size: int
    bucket: int
    max_live: int
    prefetch: int
    rewards: list[RewardModel]

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).replace("torch.", "")

    @property
    def psi_t(self) -> int:
        """Trainable parameters: the LoRA adapters or the language model."""
        return self.sizes.trainable

    @property
    def trainable_b(self) -> int:
        """Bytes per element of a trainable tensor's autograd gradient (the parameter's dtype)."""
        return self.lora_b if self.sizes.lora else self.b

    def shard(self, k: int) -> int:
        """ZeRO partition of ``k`` elements."""
        return math.ceil(k / self.world)

    def placed(self, numels: list[int], nbytes: int | None = None) -> tuple[int, int]:
        """``(device, host)`` bytes of parameters of ``nbytes`` per element (default: the model dtype's): whole on
        every rank below ZeRO-3, partitioned (and with offload_param mostly on the host) under it."""
        nbytes = self.b if nbytes is None else nbytes
        if self.stage != 3:
            return sum(numels) * nbytes, 0
        return _zero3_placed(numels, self.world, self.persist, nbytes, self.offload_param)

    @property
    def copies(self) -> bool:
        """Whether a ZeRO-3 gather makes device copies. One rank holds whole tensors already: DeepSpeed's gather
        then only points at them, unless they are offloaded (partition_parameters.py NoGatherHandle:
        ``ds_tensor.to(device)``, a copy of the host partition)."""
        return self.world > 1 or self.offload_param

    @property
    def sub_group(self) -> int:
        """Elements of the largest ZeRO-3 optimizer sub-group. A sub-group holds whole parameter partitions: up to
        sub_group_size elements, or one partition larger than that (the 168 064 x 4096 embedding of full
        fine-tuning: 688 M elements / N, whatever sub_group_size says)."""
        return min(self.shard(self.psi_t), max(self.sub_group_size, self.shard(self.sizes.largest_trainable)))

    @property
    def stepped(self) -> int:
        """Elements the optimizer steps at once: ZeRO-3 one sub-group at a time, else the whole partition."""
        return self.sub_group if self.stage == 3 else self.shard(self.psi_t)

    @property
    def merging(self) -> bool:
        """rollout.merge_lora with adapted linears to merge."""
        return self.cfg.rollout.merge_lora and bool(self.sizes.adapted_base)

    @property
    def decoder_bytes(self) -> int:
        """The whole decoder (DiT + VAE + glyph encoder) in its dtype; with decoder.fp8 the DiT's block linears
        in one byte per weight and an fp32 scale per output row instead (glm_grpo_ds/decoder/fp8.py)."""
        if not self.cfg.decoder.fp8:
            return self.sizes.decoder * self.dec_b
        fp8 = self.sizes.dit_fp8_weights
        return (self.sizes.decoder - fp8) * self.dec_b + fp8 + 4 * self.sizes.dit_fp8_rows

    @property
    def decoder_converting_bytes(self) -> int:
        """What converting the DiT to FP8 at load holds above the converted decoder (decoder.fp8): the block linears
        still in the decoder's dtype, and one weight's scratch (its fp32 copy and e4m3 result, decoder/fp8.py)."""
        if not self.cfg.decoder.fp8:
            return 0
        return self.sizes.decoder * self.dec_b - self.decoder_bytes + QUANTIZE_BYTES * self.sizes.dit_fp8_largest

    @property
    def n_gen(self) -> int:
        """Generated tokens per image."""
        return grid_tokens(self.cfg.rollout.height, self.cfg.rollout.width)

    @property
    def seq(self) -> int:
        """Tokens of one sequence: the longest prompt + the generated tokens."""
        return self.est.prompt_tokens + self.n_gen

    @property
    def per_layer(self) -> int:
        """Elements saved per token by one GLM decoder layer: 8h + 2·kv + 4·I."""
        t = self.sizes.text
        return 8 * t["hidden"] + 2 * t["kv_heads"] * t["head_dim"] + 4 * t["intermediate"]


def resolve(cfg, ds_raw: dict, est: EstimateConfig, sizes: Sizes) -> Basis:
    """The run's :class:`Basis`: the DeepSpeed config filled as the trainer fills it for ``est``'s world size."""
    from ..ds.ds_config import fill_ds_config, offloads
    from ..model.glm_image import resolve_dtype

    world = est.world
    on_gpu = est.device == "cuda"
    dtype = resolve_dtype(cfg.model.dtype, on_gpu=on_gpu)
    dcfg = fill_ds_config(ds_raw, cfg, world, sizes.text["hidden"], dtype)
    zero = dcfg.get("zero_optimization", {})
    stage = int(zero.get("stage", 0))
    b = torch.empty(0, dtype=dtype).element_size()
    return Basis(
        cfg=cfg,
        est=est,
        sizes=sizes,
        world=world,
        on_gpu=on_gpu,
        dtype=dtype,
        stage=stage,
        b=b,
        grad_b=4 if dcfg.get("data_types", {}).get("grad_accum_dtype") == "fp32" else b,
        offload_opt=offloads(zero, "offload_optimizer"),
        # offload_param is a ZeRO-3 setting (DeepSpeed reads it at stage 3 only); cpu and nvme alike leave the GPU
        offload_param=stage == 3 and offloads(zero, "offload_param"),
        persist=int(zero.get("stage3_param_persistence_threshold", 0)) if stage == 3 else 0,
        lora_b=lora_bytes(stage, b),
        sub_group_size=int(zero.get("sub_group_size", 1e9)),
        dec_b=torch.empty(0, dtype=resolve_dtype(cfg.decoder.dtype, on_gpu=on_gpu)).element_size(),
        rewards=reward_models(
            cfg.rewards, max(cfg.rollout.height, cfg.rollout.width), cfg.grpo.diversity_features, cfg.sequences_per_rank
        ),
        bucket=int(zero.get("reduce_bucket_size", 5e8)) if stage >= 1 else 0,
        max_live=int(zero.get("stage3_max_live_parameters", 1e9)),
        prefetch=int(zero.get("stage3_prefetch_bucket_size", 0)),
    )
