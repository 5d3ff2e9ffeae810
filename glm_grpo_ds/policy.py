"""The AR policy: loading GLM-Image's ``GlmImageForConditionalGeneration`` and reaching its parts.

A GLM-Image pipeline directory holds the AR in ``vision_language_encoder/`` and the processor in
``processor/``. Rollout and log-prob code call :func:`ar_parts` to get the transformer body and
``lm_head`` whether the model is plain, wrapped by peft, or wrapped by a DeepSpeed engine.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def unwrap_ar(model):
    """The ``GlmImageForConditionalGeneration`` inside a DeepSpeed engine and/or peft wrapper.

    peft injects LoRA layers in place, so the unwrapped module still runs the adapters (and
    respects ``disable_adapter()``).
    """
    model = getattr(model, "module", model)  # DeepSpeed engine
    if hasattr(model, "get_base_model"):  # peft
        model = model.get_base_model()
    if not hasattr(model, "lm_head") or not hasattr(model, "model"):
        raise TypeError(f"expected a GlmImageForConditionalGeneration, got {type(model).__name__}")
    return model


def ar_parts(model):
    """``(body, lm_head, codebook_size)``: the GlmImageModel, the vision-vocab head, and the
    number of visual codebook ids (the only ids the sampler may emit)."""
    ar = unwrap_ar(model)
    return ar.model, ar.lm_head, int(ar.config.vq_config.num_embeddings)


def check_pipeline_dir(path: str | os.PathLike) -> Path:
    """Fail with one clear line unless ``path`` is a GLM-Image pipeline directory."""
    p = Path(path)
    missing = [sub for sub in ("model_index.json", "vision_language_encoder", "processor") if not (p / sub).exists()]
    if missing:
        raise FileNotFoundError(
            f"{p} is not a GLM-Image pipeline directory (missing {', '.join(missing)}); "
            "give the path of a GlmImagePipeline directory, e.g. one written by `glm-grpo tiny-model OUT_DIR`"
        )
    return p


def load_processor(path: str | os.PathLike):
    from transformers import GlmImageProcessor

    return GlmImageProcessor.from_pretrained(check_pipeline_dir(path) / "processor")


def load_ar(path: str | os.PathLike, dtype: str = "fp32", attn_implementation: str = "sdpa"):
    """Load the AR from a pipeline directory in eval mode."""
    from transformers import GlmImageForConditionalGeneration

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    model = GlmImageForConditionalGeneration.from_pretrained(
        check_pipeline_dir(path) / "vision_language_encoder", dtype=DTYPES[dtype], attn_implementation=attn_implementation
    )
    return model.eval()
