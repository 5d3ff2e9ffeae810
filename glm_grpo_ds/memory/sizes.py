"""Parameter counts of one GLM-Image pipeline for the memory plan (glm_grpo_ds/memory/plan.py), from the
model configs alone: ``model.path`` when it is a pipeline directory or a Hub id the Hugging Face cache holds
(never downloaded here), else the real GLM-Image sizes below. The models are built on the ``meta`` device,
so the counts (and the per-tensor ZeRO-3 partitioning) are exact and cost no memory; the trainable set is
made by the trainer's own :func:`glm_grpo_ds.model.policy.make_trainable`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch  # imported where counted: FULL_AR_TEXT and the built-in sizes are read without torch

# Real GLM-Image sizes where the pipeline directory is not at hand. AR: transformers' defaults; its language model
# as :attr:`Sizes.text` holds it (GlmImageConfig()'s text_config, counted by :func:`model_sizes`: the tests hold the
# two equal), for what reads the full-size AR without building it (glm_grpo_ds/memory/step_time.py's decode step).
FULL_AR_TEXT = dict(layers=40, hidden=4096, intermediate=13696, heads=32, kv_heads=2, head_dim=128, vision_vocab=16512)
# DiT: GlmImageTransformer2DModel, 30 layers x 32 heads x 128 (hidden 4096), as in zai-org/GLM-Image
# (diffusers' own defaults describe a smaller model). VAE: 16-channel AutoencoderKL. Glyph encoder:
# the ByT5-small encoder (d_model 1472 = the DiT's text_embed_dim).
BUILTIN_DIT = dict(num_layers=30, attention_head_dim=128, num_attention_heads=32, text_embed_dim=1472)
BUILTIN_VAE = dict(
    latent_channels=16,
    block_out_channels=[128, 256, 512, 512],
    layers_per_block=2,
    down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4,
)
BUILTIN_GLYPH = dict(
    vocab_size=384,
    d_model=1472,
    d_kv=64,
    d_ff=3584,
    num_layers=12,
    num_heads=6,
    feed_forward_proj="gated-gelu",
    is_encoder_decoder=False,
)


@dataclass
class Sizes:
    """Parameter counts of one pipeline, per tensor where ZeRO-3 partitioning needs them."""

    ar_base: list[int]  # every AR tensor except the LoRA adapters
    lora: list[int]  # LoRA adapter tensors (empty for full fine-tuning)
    trainable: int
    largest_trainable: int  # elements of the largest trainable tensor
    decoder: int  # DiT + VAE + glyph encoder
    dit_hidden: int
    text: dict  # the AR language model's config (layers, heads, sizes)
    source: str
    checkpoint_dtype: torch.dtype | None = None  # the AR checkpoint's dtype (its config.json), None = unknown
    largest_decoder_tensor: int = 0  # elements
    vae_full_res_channels: int = 256  # channels of the VAE decoder's widest full-resolution map (GLM-Image: 256)
    # the base weights of the LoRA-adapted linears (peft's ``<module>.base_layer.weight``), what
    # rollout.merge_lora copies once per run (glm_grpo_ds/rollout/merged_lora.py ``adapted_linear_bytes``)
    adapted_base: list[int] = field(default_factory=list)
    # the DiT linears decoder.fp8 stores as float8 (glm_grpo_ds/decoder/fp8.py ``fp8_targets``): their weight
    # elements and output rows (one fp32 scale each)
    dit_fp8_weights: int = 0
    dit_fp8_rows: int = 0
    dit_fp8_largest: int = 0  # elements of the largest such weight (its conversion's scratch)
    dit_heads: int = 32  # the DiT's attention heads (decoder.attention=sdpa_math holds their scores)


def _as_dtype(value) -> torch.dtype | None:
    """A config's ``dtype`` (a torch.dtype, a name such as "bfloat16", or None)."""
    import torch

    if isinstance(value, str):
        value = getattr(torch, value, None)
    return value if isinstance(value, torch.dtype) else None


def _meta_numels(build) -> list[int]:
    import torch

    with torch.device("meta"):
        return [p.numel() for p in build().parameters()]


def _configs(cfg) -> tuple:
    """``(ar, dit, vae, glyph, source, local)``: the four models' configs of ``cfg.model.path`` when it is a pipeline
    directory (or a Hub id the Hugging Face cache holds: the planner never downloads), else the built-in ones."""
    from diffusers import AutoencoderKL, GlmImageTransformer2DModel
    from transformers import GlmImageConfig, T5Config

    from ..model.glm_image import AR_DIR
    from ..model.source import cached_model_dir

    root = cached_model_dir(cfg.model.path, cfg.model.revision) if cfg.model.path else None
    if root is not None and (root / AR_DIR / "config.json").is_file():
        ar_cfg = GlmImageConfig.from_pretrained(root / AR_DIR)
        dit_cfg = GlmImageTransformer2DModel.load_config(root / "transformer")
        vae_cfg = AutoencoderKL.load_config(root / "vae")
        return ar_cfg, dit_cfg, vae_cfg, T5Config.from_pretrained(root / "text_encoder"), f"configs in {root}", True
    source = "built-in GLM-Image configs (model.path: no pipeline directory here or in the Hugging Face cache)"
    return GlmImageConfig(), BUILTIN_DIT, BUILTIN_VAE, T5Config(**BUILTIN_GLYPH), source, False


def text_sizes(t) -> dict:
    """The AR language model's sizes :attr:`Sizes.text` holds, from its ``text_config`` ``t``."""
    return dict(
        layers=t.num_hidden_layers,
        hidden=t.hidden_size,
        intermediate=t.intermediate_size,
        heads=t.num_attention_heads,
        kv_heads=t.num_key_value_heads or t.num_attention_heads,
        head_dim=getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
        vision_vocab=t.vision_vocab_size,
    )


def model_sizes(cfg) -> Sizes:
    """Counts for ``cfg.model.path`` (a pipeline directory) or the built-in GLM-Image configs."""
    import torch
    from diffusers import AutoencoderKL, GlmImageTransformer2DModel
    from transformers import GlmImageForConditionalGeneration, T5EncoderModel

    from ..decoder.fp8 import fp8_targets
    from ..model.policy import make_trainable

    ar_cfg, dit_cfg, vae_cfg, glyph_cfg, source, local = _configs(cfg)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' deprecation notes about checkpointing flags
        ar = make_trainable(GlmImageForConditionalGeneration(ar_cfg), cfg.lora, gradient_checkpointing=False)
    named = list(ar.named_parameters())
    with torch.device("meta"):
        dit = GlmImageTransformer2DModel.from_config(dit_cfg)
    fp8 = [linear for _, linear in fp8_targets(dit)]
    decoder = (
        [p.numel() for p in dit.parameters()]
        + _meta_numels(lambda: AutoencoderKL.from_config(vae_cfg))
        + _meta_numels(lambda: T5EncoderModel(glyph_cfg))
    )
    return Sizes(
        ar_base=[p.numel() for n, p in named if "lora_" not in n],
        lora=[p.numel() for n, p in named if "lora_" in n],
        adapted_base=[p.numel() for n, p in named if n.endswith(".base_layer.weight")],
        trainable=sum(p.numel() for _, p in named if p.requires_grad),
        largest_trainable=max((p.numel() for _, p in named if p.requires_grad), default=0),
        decoder=sum(decoder),
        dit_hidden=int(dit_cfg["num_attention_heads"] * dit_cfg["attention_head_dim"]),
        dit_heads=int(dit_cfg["num_attention_heads"]),
        text=text_sizes(ar_cfg.text_config),
        source=source,
        checkpoint_dtype=_as_dtype(getattr(ar_cfg, "dtype", None)) if local else None,
        largest_decoder_tensor=max(decoder),
        dit_fp8_weights=sum(linear.weight.numel() for linear in fp8),
        dit_fp8_rows=sum(linear.out_features for linear in fp8),
        dit_fp8_largest=max((linear.weight.numel() for linear in fp8), default=0),
        # the decoder's last up block gets its input, at full resolution, from the block before it:
        # block_out_channels[1] channels (reversed order), wider than its own output
        vae_full_res_channels=int(vae_cfg["block_out_channels"][min(1, len(vae_cfg["block_out_channels"]) - 1)]),
    )
