"""The AR policy: loading GLM-Image's ``GlmImageForConditionalGeneration`` and reaching its parts.

A GLM-Image pipeline directory holds the AR in ``vision_language_encoder/`` and the processor in
``processor/``. Rollout and log-prob code call :func:`ar_parts` to get the transformer body and
``lm_head`` whether the model is plain, wrapped by peft, or wrapped by a DeepSpeed engine.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from . import log
from .adapters import check_init_adapter, load_init_adapter, peft_lora_config
from .config.fields import ConfigError

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


def check_pipeline_dir(path: str | os.PathLike, flag: str | None = None) -> Path:
    """Fail with one clear line unless ``path`` is a GLM-Image pipeline directory (``flag``: the
    option or config key that gave it, for the message). Hub ids are resolved to a directory first by
    glm_grpo_ds/model_source.py."""
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
        model_cfg = GenerationConfig.from_pretrained(ar_dir) if has_file else GenerationConfig()
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
