"""LoRA adapters: peft's LoraConfig of our ``lora`` section (language-model layers only), and adapters on
disk: finding one, starting training from one (``lora.init_from``), and the base
model an adapter records.

    glm-grpo train ... lora.init_from=outputs/run1/final_adapter    # continue from a previous run's adapter

``lora.init_from`` takes a peft adapter directory, or a directory holding one (a checkpoint's
``adapter/``, a run's ``final_adapter/``). Its rank, alpha, target modules and kind must be those of the
``lora`` section: a mismatch is one line naming the key to set (the config stays the one record of what
was trained). The adapter's weights replace the freshly initialised ones before DeepSpeed takes the
model, on every rank alike; the KL reference stays the base model (adapters disabled).

Every adapter the trainer writes (``final_adapter/``, checkpoints' ``adapter/``) records in
``adapter_config.json`` the base model as ``base_model_name_or_path``: the Hub id with the commit as
``revision`` when trained from the Hub, else the absolute AR directory
(``<pipeline>/vision_language_encoder``), which ``peft.AutoPeftModel.from_pretrained`` loads from any
working directory.

policy.py imports this module (never the reverse): it builds the AR and adds the adapters configured here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

from ..config.fields import ConfigError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# peft settings this trainer never uses: an adapter with another value cannot continue here
PLAIN_LORA = {"peft_type": "LORA", "use_dora": False, "use_rslora": False, "bias": "none"}


def lora_target_regex(target_modules: list[str]) -> str:
    """peft ``target_modules`` regex restricted to the language model's decoder layers.

    The vision tower and the VQ model stay frozen and adapter-free.
    """
    names = "|".join(sorted(set(target_modules)))
    return rf"model\.language_model\.layers\.\d+\.(self_attn|mlp)\.({names})"


def layer_linear_names(layer) -> list[str]:
    """The names ``lora.target_modules`` can give in one decoder layer of the language model: its linears' last
    name parts (GLM-Image: q_proj, k_proj, v_proj, o_proj, gate_up_proj, down_proj)."""
    import torch

    return [name.rsplit(".", 1)[-1] for name, m in layer.named_modules() if isinstance(m, torch.nn.Linear)]


def text_layer_linear_names(text_config: dict) -> list[str]:
    """:func:`layer_linear_names` of the AR whose ``config.json`` holds ``text_config`` (one layer built on the meta
    device: no weights, no memory), for the check before any model loads."""
    import torch
    from transformers import GlmImageTextConfig
    from transformers.models.glm_image.modeling_glm_image import GlmImageTextDecoderLayer

    with torch.device("meta"):
        return layer_linear_names(GlmImageTextDecoderLayer(GlmImageTextConfig(**text_config), 0))


def check_target_modules(target_modules: list[str], linear_names: list[str], key: str = "lora.target_modules") -> None:
    """One line unless every name of ``target_modules`` names a linear of the language model's layers: peft adapts
    the names that match and drops the others without a word (``[q_proj, qkv]`` would train q_proj alone)."""
    missing = [name for name in target_modules if name not in linear_names]
    if missing:
        fused = (
            " (gate_proj and up_proj are one fused gate_up_proj here)"
            if {"gate_proj", "up_proj"} & set(missing)
            else ""
        )
        raise ConfigError(
            f"{key}: {', '.join(repr(m) for m in missing)} names no linear layer of the language model's layers, "
            f"which would train without an adapter there; its layers' linears are {', '.join(linear_names)}{fused}"
        )


def peft_lora_config(lora):
    """peft's LoraConfig for our ``LoraConfig`` (language-model layers only)."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora_target_regex(lora.target_modules),
        bias="none",
    )


def find_adapter(path: str | os.PathLike, flag: str = "--adapter") -> Path:
    """An adapter directory, given it or a directory that holds one (``adapter`` / ``final_adapter``)."""
    p = Path(path)
    if not p.exists():  # a typo or a run that never finished: say that, not that the path lacks a file
        raise FileNotFoundError(
            f"{flag} {p} does not exist; give a run's final_adapter/ (or checkpoints/step_N/adapter/) directory"
        )
    for candidate in (p, p / "adapter", p / "final_adapter"):
        if (candidate / ADAPTER_CONFIG).is_file():
            _check_readable(candidate, flag)
            return candidate
    raise FileNotFoundError(
        f"{flag} {p} holds no peft adapter ({ADAPTER_CONFIG}); pass a run's final_adapter/ directory"
    )


def _check_readable(adapter: Path, flag: str) -> None:
    """One line (ConfigError) naming the file when ``adapter``'s config is not a JSON object or its weights are cut
    short (a copy that stopped): safetensors' own error was a traceback, json's named no file."""
    where = f"{flag} {adapter}"
    try:
        saved = json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where}: {ADAPTER_CONFIG} is not valid JSON ({getattr(err, 'msg', err)})") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{where}: {ADAPTER_CONFIG} holds no JSON object; give an adapter saved by peft")
    weights = adapter / ADAPTER_WEIGHTS
    if weights.is_file():
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(weights), framework="pt"):  # reads the header and checks the file covers it
                pass
        except SafetensorError as err:
            raise ConfigError(
                f"{where}: {ADAPTER_WEIGHTS} cannot be read ({err}): it is cut short or not a safetensors file; "
                "copy it again from where it came"
            ) from None


def _target_names(target_modules) -> str:
    """Readable module names of a ``target_modules`` value (our regex -> the names in it)."""
    if isinstance(target_modules, str):
        m = re.fullmatch(r".*\\\.\((?:self_attn\|mlp)\)\\\.\(([\w|]+)\)", target_modules)
        return "[" + ", ".join(m.group(1).split("|")) + "]" if m else repr(target_modules)
    return "[" + ", ".join(sorted(target_modules or [])) + "]"


def check_init_adapter(lora) -> Path | None:
    """The adapter directory of ``lora.init_from`` (None when unset), or one line naming the mismatch
    between it and the ``lora`` section. Reads only JSON: call it before any model loads."""

    if lora is None or not lora.init_from:
        return None
    adapter = find_adapter(lora.init_from, "lora.init_from")
    where = f"lora.init_from {adapter}"
    if not (adapter / ADAPTER_WEIGHTS).is_file():
        raise FileNotFoundError(f"{where} has no {ADAPTER_WEIGHTS}; give an adapter saved by peft (safetensors)")
    saved = json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))  # a JSON object: find_adapter
    for key, value in PLAIN_LORA.items():
        if saved.get(key, value) != value:
            raise ConfigError(
                f"{where}: its {ADAPTER_CONFIG} has {key}={saved.get(key)!r}; this trainer continues plain LoRA "
                f"adapters only ({key}={value!r})"
            )
    if saved.get("rank_pattern") or saved.get("alpha_pattern") or saved.get("modules_to_save"):
        raise ConfigError(
            f"{where}: its rank_pattern / alpha_pattern / modules_to_save are set; this trainer continues "
            "adapters with one rank and alpha on the language model's projections only"
        )
    mine = peft_lora_config(lora)
    if saved.get("r") != mine.r:
        raise ConfigError(f"{where} has r={saved.get('r')} but lora.r={mine.r}: set lora.r={saved.get('r')}")
    if saved.get("lora_alpha") != mine.lora_alpha:
        raise ConfigError(
            f"{where} has lora_alpha={saved.get('lora_alpha')} but lora.alpha={mine.lora_alpha}: "
            f"set lora.alpha={saved.get('lora_alpha')}"
        )
    if saved.get("target_modules") != mine.target_modules:
        raise ConfigError(
            f"{where} adapts the modules {_target_names(saved.get('target_modules'))} but lora.target_modules "
            f"is {_target_names(mine.target_modules)}: set lora.target_modules to the adapter's"
        )
    return adapter


PEFT_PREFIX = "base_model.model."  # peft's key prefix in adapter_model.safetensors


def check_fits(adapter: Path, ar, where: str) -> None:
    """One line (ValueError) when a weight of ``adapter`` does not fit the AR ``ar`` (the model without adapters):
    a module the AR lacks, or a LoRA A / B whose shape is not the module's ``in`` / ``out`` features. Reads the
    shapes from the safetensors header only; call it before peft loads the adapter (whose own error is a
    25-35 line traceback)."""
    from safetensors import safe_open

    weights = adapter / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"{where} {adapter} has no {ADAPTER_WEIGHTS}; give an adapter saved by peft")
    with safe_open(str(weights), framework="pt") as f:
        shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    for key, shape in sorted(shapes.items()):
        found = re.fullmatch(rf"{re.escape(PEFT_PREFIX)}(.+)\.lora_([AB])(?:\.[\w]+)?\.weight", key)
        if found is None:
            continue
        path, kind = found.groups()
        try:
            module = ar.get_submodule(path)
        except AttributeError:
            raise ValueError(
                f"{where} {adapter} does not fit the model: it has {key}, but the model has no module {path}; "
                "use an adapter trained on this base model"
            ) from None
        features = getattr(module, "in_features" if kind == "A" else "out_features", None)
        axis = 1 if kind == "A" else 0
        if features is not None and (len(shape) != 2 or shape[axis] != features):
            want = f"[r, {features}]" if kind == "A" else f"[{features}, r]"
            raise ValueError(
                f"{where} {adapter} does not fit the model: {key} has shape {list(shape)}, the model's "
                f"{path} needs {want}; use an adapter trained on this base model"
            )


def recorded_base(adapter: Path) -> tuple[str | None, str | None]:
    """``(base_model_name_or_path, revision)`` that ``adapter``'s adapter_config.json records."""
    saved = json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    return saved.get("base_model_name_or_path"), saved.get("revision")


def other_base(adapter: Path, base: tuple[str, str | None], what: str = "adapter") -> str | None:
    """A one-line warning when ``adapter`` records another base model than ``base`` (``ModelSource.adapter_base()``
    of the model given: a Hub id and its commit, or the absolute AR directory), else None; ``what`` names the
    adapter in it (``lora.init_from``). A local path compares resolved; a Hub id compares with its commit when both
    record one."""
    name, revision = recorded_base(adapter)
    if not name:
        return None
    want_name, want_revision = base
    if Path(name).is_absolute() or Path(want_name).is_absolute():
        same = Path(name).resolve() == Path(want_name).resolve()
    else:
        same = name == want_name and (revision is None or want_revision is None or revision == want_revision)
    if same:
        return None

    def at(n, r):
        return n + (f" @ {r}" if r else "")

    return (
        f"glm-grpo: warning: {what} {adapter} was trained on {at(name, revision)}, not on the model given "
        f"({at(want_name, want_revision)}); its figures describe it on another base"
    )


def check_adapters(adapters: list[str], ar, base: tuple[str, str | None], where: str = "--adapter") -> list[str]:
    """Every adapter against the AR it is about to be loaded onto: a shape that does not fit is one line
    (:func:`check_fits`); a recorded base other than ``base`` is a warning line, returned (one per adapter,
    None where it matches) for the caller to print and to mark its results."""
    warnings = []
    for path in adapters:
        check_fits(Path(path), ar, where)
        warnings.append(other_base(Path(path), base))
    return warnings


def load_init_adapter(model, adapter: Path) -> None:
    """Copy the weights of ``adapter`` into the peft ``model``'s LoRA parameters (before DeepSpeed takes
    it: the LoRA tensors are still whole on every rank). Every LoRA parameter must come from the file."""
    import torch
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(adapter / ADAPTER_WEIGHTS)
    expected = get_peft_model_state_dict(model)
    missing, extra = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    wrong = [k for k in expected if k in weights and weights[k].shape != expected[k].shape]
    if missing or extra or wrong:
        if missing:
            what = f"lacks {missing[0]}"
        elif extra:
            what = f"has {extra[0]}, which this model lacks"
        else:
            key = wrong[0]
            what = f"has {key} of shape {tuple(weights[key].shape)}, the model {tuple(expected[key].shape)}"
        raise ConfigError(
            f"lora.init_from {adapter} does not fit model.path: the adapter {what}; start from an adapter "
            "trained on this base model"
        )
    with torch.no_grad():
        set_peft_model_state_dict(model, weights)


@contextlib.contextmanager
def adapters_in_base_dtype(model):
    """Inside the block, every LoRA weight of the peft ``model`` whose dtype is not its base layer's is a copy in
    the base layer's dtype; on exit the original tensors are put back (the same objects: bitwise, and the
    optimizer's and DeepSpeed's references stay valid). Yields the number of weights swapped.

    Why: peft upcasts the adapters of a bf16 base to fp32 (``autocast_adapter_dtype``) and ZeRO-3 keeps them
    so, so every adapted linear of every decode step casts its input to fp32, runs two fp32 matmuls and casts
    back. The rollout needs no fp32 master weights; it samples from the adapters rounded to the model dtype
    (``rollout.adapters_in_model_dtype``), and the trainer's passes, which run outside the block, keep fp32.
    The parameters must be materialised (ZeRO-3: inside the rollout's gather); a partitioned ZeRO-3
    parameter (``rollout.gather_parameters: false``) has no data to cast and is left alone.
    """
    import torch
    from peft.tuners.lora import LoraLayer

    swapped: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    try:
        with torch.no_grad():
            for module in model.modules():
                if not isinstance(module, LoraLayer):
                    continue
                dtype = module.get_base_layer().weight.dtype
                for adapter in (*module.lora_A.values(), *module.lora_B.values()):
                    for param in adapter.parameters(recurse=False):
                        if param.dtype != dtype and param.numel() > 0:
                            swapped.append((param, param.data))
                            param.data = param.data.to(dtype)
        yield len(swapped)
    finally:
        for param, original in swapped:
            param.data = original
