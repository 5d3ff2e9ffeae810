"""Loading GLM-Image's AR (``GlmImageForConditionalGeneration``): the trainable policy (LoRA or full fine-tuning),
the frozen reference of full fine-tuning, and a plain model for the tools that only sample.

Where the AR sits in a pipeline directory, how to reach it inside wrappers and how the ``auto`` options
resolve are glm_grpo_ds/glm_image.py's; this module is the one place that calls ``from_pretrained`` on the AR.
"""

from __future__ import annotations

import os

import torch

from .adapters import check_init_adapter, load_init_adapter, peft_lora_config
from .glm_image import AR_DIR, DTYPES, check_pipeline_dir


def load_ar(
    path: str | os.PathLike,
    dtype: str | torch.dtype = "fp32",
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
):
    """Load the AR of a pipeline directory, in eval mode (the one place that calls from_pretrained)."""
    from transformers import GlmImageForConditionalGeneration

    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        dtype = DTYPES[dtype]
    model = GlmImageForConditionalGeneration.from_pretrained(
        check_pipeline_dir(path) / AR_DIR,
        dtype=dtype,
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )
    return model.eval()


def load_policy(
    path,
    dtype: torch.dtype,
    attn_implementation: str,
    lora,
    gradient_checkpointing: bool,
    trust_remote_code: bool = False,
    seed: int = 0,
    adapter_base: tuple[str, str | None] | None = None,
):
    """The trainable AR: LoRA adapters (``lora`` = our LoraConfig) or full fine-tuning (``None``).

    Under ZeRO-3 call this while a transformers ``HfDeepSpeedConfig`` is alive (see
    :func:`glm_grpo_ds.ds.engine.zero3_model_loading`): ``from_pretrained`` then builds the weights
    partitioned (``zero.Init``), so a 9B model never materialises whole on one rank.

    The LoRA weights are drawn from ``seed`` alone: how much randomness loading consumed (it
    differs with the world size under ZeRO-3) must not change the initial adapter. ``lora.init_from``
    replaces them with a saved adapter's (glm_grpo_ds/adapters.py). ``adapter_base``: the
    ``(base_model_name_or_path, revision)`` every adapter saved from this model records
    (:meth:`glm_grpo_ds.model_source.ModelSource.adapter_base`).
    """
    model = make_trainable(
        load_ar(path, dtype, attn_implementation, trust_remote_code), lora, gradient_checkpointing, seed
    )
    if lora is not None:
        if lora.init_from:
            load_init_adapter(model, check_init_adapter(lora))
        if adapter_base is not None:
            for peft_config in model.peft_config.values():
                peft_config.base_model_name_or_path, peft_config.revision = adapter_base
    return model


def make_trainable(model, lora, gradient_checkpointing: bool, seed: int = 0):
    """Freeze what stays frozen and add the LoRA adapters (``lora`` = our LoraConfig) or unfreeze
    the language model (``None``). Also applied to a meta-device model by the memory planner, so
    its trainable-parameter count is the trainer's."""
    model.config.use_cache = False
    model.requires_grad_(False)
    if gradient_checkpointing:
        # non-reentrant: works with peft + ZeRO-3 (DeepSpeed >= 0.19.3) and needs no input grads
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if lora is None:
        # full fine-tuning of the language model and head; vision tower and VQ model stay frozen
        model.model.language_model.requires_grad_(True)
        model.lm_head.requires_grad_(True)
        return model
    from peft import get_peft_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, peft_lora_config(lora))


def load_reference(path, dtype: torch.dtype, attn_implementation: str, trust_remote_code: bool = False):
    """A frozen copy of the AR for the KL term of full fine-tuning (LoRA disables its adapters instead)."""
    return load_ar(path, dtype, attn_implementation, trust_remote_code).requires_grad_(False)
