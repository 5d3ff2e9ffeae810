"""Loading GLM-Image's AR (``GlmImageForConditionalGeneration``): the trainable policy (LoRA or full fine-tuning),
the frozen reference of full fine-tuning, and a plain model for the tools that only sample.

Where the AR sits in a pipeline directory, how to reach it inside wrappers and how the ``auto`` options
resolve are glm_grpo_ds/model/glm_image.py's; this module is the one place that calls ``from_pretrained`` on the AR.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import ConfigError
from ..runtime import log
from ..runtime.loading_info import refusal, unread_weights
from .adapters import (
    ADAPTER_CONFIG,
    check_adapters,
    check_init_adapter,
    check_target_modules,
    find_adapter,
    layer_linear_names,
    load_init_adapter,
    other_base,
    peft_lora_config,
)
from .glm_image import AR_DIR, DTYPES, check_pipeline_dir, load_processor, resolve_attn, resolve_dtype, resolve_sampling
from .random_weights import build_ar, spec_of
from .source import resolve_model
from .weight_sets import WeightSets


def is_ar_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an AR's own directory (``save_pretrained`` of the AR: config.json and safetensors), not
    a pipeline's."""
    p = Path(path)
    return (p / "config.json").is_file() and any(p.glob("*.safetensors")) and not (p / "model_index.json").exists()


def find_adapter_or_model(path: str | os.PathLike, flag: str = "--adapter") -> Path:
    """What a tool compares with the base: a LoRA adapter (``find_adapter``: the directory, or one holding
    ``adapter/`` or ``final_adapter/``), or a full fine-tuning's AR (the directory, or a run's ``final_model/``)."""
    p = Path(path)
    for candidate in (p, p / "final_model"):
        if is_ar_dir(candidate):
            return candidate
    try:
        return find_adapter(p, flag)
    except FileNotFoundError:
        if not p.exists():
            raise
        raise FileNotFoundError(
            f"{flag} {p} holds neither a peft adapter ({ADAPTER_CONFIG}) nor a full fine-tuning's AR (config.json "
            "and *.safetensors); pass a run's final_adapter/ or final_model/ directory"
        ) from None


def load_ar(
    path: str | os.PathLike,
    dtype: str | torch.dtype = "fp32",
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
):
    """Load the AR of a pipeline directory, in eval mode (the one place that calls from_pretrained); an AR's own
    directory (a full fine-tuning run's ``final_model/``: its ``config.json`` and weights, no pipeline) is read as
    it is. A ``random:`` model's configs directory: built with random weights instead, on this process's GPU when
    there is one (glm_grpo_ds/model/random_weights.py)."""
    from transformers import GlmImageForConditionalGeneration

    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        dtype = DTYPES[dtype]
    if is_ar_dir(path):
        root, ar_dir = Path(path), Path(path)
    else:
        root = check_pipeline_dir(path)
        ar_dir = root / AR_DIR
    spec = spec_of(root)
    if spec is not None:
        return build_ar(root, spec, dtype, attn_implementation)
    model, info = GlmImageForConditionalGeneration.from_pretrained(
        ar_dir,
        dtype=dtype,
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
        output_loading_info=True,
    )
    problem = unread_weights(info)
    if problem:
        raise ConfigError(refusal(ar_dir, problem))
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
    replaces them with a saved adapter's (glm_grpo_ds/model/adapters.py). ``adapter_base``: the
    ``(base_model_name_or_path, revision)`` every adapter saved from this model records
    (:meth:`glm_grpo_ds.model.source.ModelSource.adapter_base`).
    """
    model = make_trainable(
        load_ar(path, dtype, attn_implementation, trust_remote_code), lora, gradient_checkpointing, seed
    )
    if lora is not None:
        if lora.init_from:
            adapter = check_init_adapter(lora)
            warning = None if adapter_base is None else other_base(adapter, adapter_base, "lora.init_from")
            if warning:  # same shapes (load_init_adapter checks those), another recorded base: said, not refused
                log.warning(warning)
            load_init_adapter(model, adapter)
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

    check_target_modules(lora.target_modules, layer_linear_names(model.model.language_model.layers[0]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, peft_lora_config(lora))


def load_reference(path, dtype: torch.dtype, attn_implementation: str, trust_remote_code: bool = False):
    """A frozen copy of the AR for the KL term of full fine-tuning (LoRA disables its adapters instead)."""
    return load_ar(path, dtype, attn_implementation, trust_remote_code).requires_grad_(False)


def with_adapters(ar, adapters: dict[str, str]):
    """``ar`` with every adapter directory of ``adapters`` (name: directory, in order) loaded side by side under its
    name (the first one active); no adapters: the AR itself."""
    if not adapters:
        return ar
    from peft import PeftModel

    (first, path), *rest = adapters.items()
    model = PeftModel.from_pretrained(ar, path, adapter_name=first)
    for name, path in rest:
        model.load_adapter(path, adapter_name=name)
    return model.eval()


@dataclass
class ForSampling:
    """What a tool samples with (:func:`load_for_sampling`)."""

    model: torch.nn.Module  # the AR, or a peft model holding the adapters over it
    adapter_names: list[str]  # adapter_0, ... in the order given ([] without adapters)
    processor: object
    sampling: object  # the SamplingConfig with the model's own values filled in (glm_image.resolve_sampling)
    model_dir: Path  # the local pipeline directory (a Hub id resolved through the cache)
    dtype: torch.dtype
    # per adapter: the one-line warning when it records another base model than this one, else None
    adapter_warnings: list[str | None] = field(default_factory=list)
    attn: str = ""  # the AR's attention kernel, ``auto`` resolved on this node (flash_attention_2 or sdpa)
    weight_sets: WeightSets | None = None  # the full fine-tunings' weights among the "adapters", else None


def load_for_sampling(
    path: str,
    revision: str | None,
    dtype: str,
    attn_implementation: str,
    sampling,
    device: torch.device,
    adapters: list[str] = (),
    trust_remote_code: bool = False,
    flags: tuple[str, str] = ("model.path", "model.revision"),
) -> ForSampling:
    """The tools' one loading sequence (``glm-grpo evaluate``, ``decode-agreement``, ``verify-logprobs``): the
    pipeline directory of ``path`` (a Hub id through the cache, glm_grpo_ds/model/source.py; ``flags`` name the
    options for its errors), ``dtype`` / ``attn_implementation`` resolved for ``device`` (``auto`` included),
    the AR with ``adapters`` on ``device`` in eval mode, its processor and ``sampling`` resolved against the
    model. An "adapter" that is a full fine-tuning's AR (:func:`is_ar_dir`) is held as a set of weights to swap in
    (model/weight_sets.py). The trainer loads its policy with :func:`load_policy` instead (LoRA to train, DeepSpeed)."""
    source = resolve_model(path, revision, flag=flags[0], revision_flag=flags[1])
    model_dir = source.path
    on_gpu = device.type == "cuda"
    torch_dtype = resolve_dtype(dtype, on_gpu)
    attn = resolve_attn(attn_implementation, on_gpu, torch_dtype)
    ar = load_ar(model_dir, torch_dtype, attn, trust_remote_code)
    named = {f"adapter_{i}": path for i, path in enumerate(adapters)}
    full = {name: path for name, path in named.items() if is_ar_dir(path)}
    lora = {name: path for name, path in named.items() if name not in full}
    # a shape that does not fit: one line; another base: a warning (a full fine-tuning's AR replaces the base's)
    found = dict(zip(lora, check_adapters(list(lora.values()), ar, source.adapter_base())))
    warnings = [found.get(name) for name in named]
    for warning in filter(None, warnings):
        log.warning(warning)
    sets = WeightSets(ar) if full else None
    for name, path in full.items():
        sets.add(name, load_ar(path, torch_dtype, attn, trust_remote_code), f"--adapter {path}")
    model = with_adapters(ar, lora).to(device)
    sampling = resolve_sampling(sampling, model_dir)
    processor = load_processor(model_dir)
    return ForSampling(model, list(named), processor, sampling, Path(model_dir), torch_dtype, warnings, attn, sets)
