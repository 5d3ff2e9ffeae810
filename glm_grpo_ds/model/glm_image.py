"""GLM-Image's layout and the choices made before its AR loads: what a pipeline directory holds, how to reach
the AR inside peft / DeepSpeed wrappers, and the resolution of the ``auto`` / unset model options (dtype,
attention implementation, sampling knobs) against the machine and the model's own generation config.

Nothing here loads weights: glm_grpo_ds/model/policy.py loads the policy and the reference,
glm_grpo_ds/decoder/image_decoder.py the DiT, both from the directory checked here. Tested in
tests/unit/test_attention.py and through every loader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..config.fields import ConfigError
from ..runtime import log

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


AR_DIR = "vision_language_encoder"  # the AR's subfolder of a GlmImagePipeline directory
PIPELINE_PARTS = ("model_index.json", AR_DIR, "processor")


def read_ar_config(model_dir: str | os.PathLike) -> dict:
    """The AR's ``config.json`` of a pipeline directory, as a dict (no weights read, no transformers import)."""
    return json.loads((Path(model_dir) / AR_DIR / "config.json").read_text())


def check_pipeline_dir(path: str | os.PathLike, flag: str | None = None) -> Path:
    """Fail with one clear line unless ``path`` is a GLM-Image pipeline directory (``flag``: the
    option or config key that gave it, for the message). Hub ids are resolved to a directory first by
    glm_grpo_ds/model/source.py."""
    p = Path(path)
    missing = [sub for sub in PIPELINE_PARTS if not (p / sub).exists()]
    if missing:
        what = "it does not exist" if not p.exists() else f"missing {', '.join(missing)}"
        raise FileNotFoundError(
            f"{flag + ' ' if flag else ''}{p} is not a GLM-Image pipeline directory ({what}); give the path of a "
            "GlmImagePipeline directory (e.g. one written by `glm-grpo tiny-model OUT_DIR`) or a Hugging Face Hub "
            "id such as zai-org/GLM-Image"
        )
    return p


def load_processor(path: str | os.PathLike):
    from transformers import GlmImageProcessor

    return GlmImageProcessor.from_pretrained(check_pipeline_dir(path) / "processor")


def resolve_sampling(sampling, source):
    """``sampling`` with every None field taken from what the model samples with by itself: its
    generation config (``vision_language_encoder/generation_config.json``; ``source`` is a pipeline
    directory or a loaded / wrapped AR), and transformers' ``generate()`` defaults for what that
    leaves unset. GLM-Image's sets temperature 0.9 and top_p 0.75 and leaves top_k unset, so
    ``generate()`` - and therefore the released pipeline - samples with top_k 50."""
    import dataclasses

    from transformers import GenerationConfig

    if sampling.resolved:
        return sampling
    if isinstance(source, (str, os.PathLike)):
        ar_dir = check_pipeline_dir(source) / AR_DIR
        has_file = (ar_dir / "generation_config.json").is_file()
        try:
            model_cfg = GenerationConfig.from_pretrained(ar_dir) if has_file else GenerationConfig()
        except (OSError, ValueError) as err:  # not JSON, or values transformers refuses: the run's line, not a trace
            raise ConfigError(
                f"model.path: {ar_dir / 'generation_config.json'} cannot be read ({' '.join(str(err).split())}); fix "
                "it, or remove it (the sampling settings are then grpo.sampling's and transformers' defaults)"
            ) from None
    else:
        model_cfg = getattr(unwrap_ar(source), "generation_config", None) or GenerationConfig()
    generate_defaults = GenerationConfig._get_default_generation_params()  # what generate() fills in
    picked = {}
    for name in ("temperature", "top_k", "top_p"):
        mine, theirs = getattr(sampling, name), getattr(model_cfg, name, None)
        picked[name] = mine if mine is not None else (theirs if theirs is not None else generate_defaults[name])
    out = dataclasses.replace(sampling, **picked)
    out.validate()
    return out


def resolve_dtype(name: str, on_gpu: bool) -> torch.dtype:
    """``auto`` = bf16 on a GPU, fp32 on CPU; else the named dtype."""
    if name == "auto":
        return torch.bfloat16 if on_gpu else torch.float32
    return DTYPES[name]


FLASH = "flash_attention_2"
# What a broken flash-attn raises on import: a missing or mismatched CUDA/torch symbol (ImportError,
# OSError from the shared library loader) or a version check inside the package (RuntimeError).
FLASH_IMPORT_ERRORS = (ImportError, OSError, RuntimeError)


def probe_flash_attn() -> tuple[bool, str]:
    """``(True, "")`` when ``import flash_attn`` works, else ``(False, reason)``: "not installed", or the
    first line of what the import raised (an install built for another torch / CUDA fails here, not
    only when the first attention runs)."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        return False, "not installed"
    try:
        importlib.import_module("flash_attn")
    except FLASH_IMPORT_ERRORS as err:
        first = (str(err).strip().splitlines() or [""])[0]
        return False, f"{type(err).__name__}: {first}" if first else type(err).__name__
    return True, ""


def flash_attn_fix(reason: str) -> str:
    """How to get a flash-attn that imports: one built for the torch and CUDA this process runs."""
    cuda = torch.version.cuda or "none (CPU-only build)"
    verb, flags = ("install", "") if reason == "not installed" else ("reinstall", " --force-reinstall")
    return (
        f"{verb} flash-attn built for this torch {torch.__version__.split('+')[0]} and CUDA {cuda} "
        f"(pip install{flags} --no-build-isolation flash-attn)"
    )


class AttentionError(ConfigError):
    """model.attn_implementation=flash_attention_2 asked for, but flash-attn cannot be imported (an
    input error: the run stops with exit 2 before any model loads)."""


def resolve_attn(name: str, on_gpu: bool, dtype: torch.dtype) -> str:
    """``auto`` = flash_attention_2 when it imports, with a GPU and bf16/fp16, else sdpa; an installed
    but broken flash-attn then gives one warning naming the cause. Asked for explicitly, a flash-attn
    that does not import is an :class:`AttentionError` (one line: the cause and the fix)."""
    if name == FLASH:
        ok, reason = probe_flash_attn()
        if not ok:
            raise AttentionError(
                f"model.attn_implementation={FLASH} but flash-attn cannot be imported ({reason}); "
                f"{flash_attn_fix(reason)}, or set model.attn_implementation=sdpa (or auto)"
            )
        return name
    if name != "auto":
        return name
    if on_gpu and dtype in (torch.bfloat16, torch.float16):
        ok, reason = probe_flash_attn()
        if ok:
            return FLASH
        if reason != "not installed":  # installed but broken: say so once, train with sdpa
            log.warning_once(
                "flash-attn-broken",
                f"glm-grpo: warning: flash-attn is installed but cannot be imported ({reason}); using sdpa "
                f"attention; {flash_attn_fix(reason)} to use it",
            )
    return "sdpa"
