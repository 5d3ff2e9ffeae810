"""Reading a DeepSpeed JSON (``ds_configs/*.json`` or the user's) and filling its ``"auto"`` values.

DeepSpeed itself does not parse ``"auto"``; Hugging Face-style JSONs carry it in batch, precision
and bucket keys. :func:`fill_ds_config` resolves each one from the :class:`~glm_grpo_ds.config.TrainConfig`
and the AR's hidden size, and refuses combinations DeepSpeed would accept but that would not do what
the training config says.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

# ds_config keys our trainer fills when they say "auto" (DeepSpeed itself does not parse "auto").
AUTO_KEYS = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "bf16.enabled",
    "fp16.enabled",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
}


class DeepSpeedConfigError(ValueError):
    """A problem with a ds_configs JSON; the message names the file and the fix."""


def read_ds_config(path: str | os.PathLike) -> dict:
    p = Path(path)
    if not p.is_file():
        raise DeepSpeedConfigError(f"DeepSpeed config {p} does not exist; pick one of ds_configs/*.json")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DeepSpeedConfigError(
            f"{p} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}"
        ) from None
    if not isinstance(data, dict):
        raise DeepSpeedConfigError(f"{p} must hold a JSON object")
    return data


def _walk(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _walk(value, dotted + ".")
        else:
            yield dotted, value


def _set(tree: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[last] = value


def fill_ds_config(
    raw: dict, cfg, world_size: int, hidden_size: int, dtype: torch.dtype, source: str = "ds_config"
) -> dict:
    """Resolve every "auto" from the TrainConfig; reject "auto" in keys we do not own.

    Also checks combinations DeepSpeed would accept but that would silently not do what the user
    asked (an 8-bit client optimizer with optimizer offload keeps fp32 states on the CPU).
    """
    filled = json.loads(json.dumps(raw))
    micro = cfg.batch.micro_batch_size
    accum = cfg.sequences_per_rank // micro
    values = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "train_batch_size": micro * accum * world_size,
        "gradient_clipping": cfg.optimizer.max_grad_norm,
        "bf16.enabled": dtype == torch.bfloat16,
        "fp16.enabled": dtype == torch.float16,
        "zero_optimization.reduce_bucket_size": hidden_size * hidden_size,
        "zero_optimization.allgather_bucket_size": hidden_size * hidden_size,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
        "zero_optimization.stage3_param_persistence_threshold": 10 * hidden_size,
    }
    for key, value in list(_walk(filled)):
        if value == "auto":
            if key not in AUTO_KEYS:
                raise DeepSpeedConfigError(
                    f'{source}: "auto" is not supported for {key}; give a value '
                    f"(auto works for: {', '.join(sorted(AUTO_KEYS))})"
                )
            _set(filled, key, values[key])
    # Batch keys must agree with the trainer's batching even when given explicitly.
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        if key in filled and filled[key] != values[key]:
            raise DeepSpeedConfigError(
                f"{source}: {key}={filled[key]} disagrees with the trainer ({values[key]} from batch.micro_batch_size="
                f"{micro}, batch.prompts_per_rank x grpo.group_size={cfg.sequences_per_rank}, "
                f'world size {world_size}); set it to "auto"'
            )
        filled[key] = values[key]
    filled.setdefault("steps_per_print", 10**9)
    filled.setdefault("wall_clock_breakdown", False)
    zero = filled.setdefault("zero_optimization", {"stage": 0})
    offload_opt = zero.get("offload_optimizer", {}).get("device", "none") not in ("none", None)
    if offload_opt and cfg.optimizer.name != "adamw":
        raise DeepSpeedConfigError(
            f"{source}: optimizer.name={cfg.optimizer.name} with zero_optimization.offload_optimizer: DeepSpeed would "
            "keep fp32 optimizer states on the CPU, not 8-bit ones; use optimizer.name=adamw (DeepSpeed CPU Adam) "
            "with offload, or drop offload_optimizer to keep the 8-bit optimizer"
        )
    if offload_opt:
        # DeepSpeed's own CPU Adam runs the offloaded optimizer.
        o = cfg.optimizer
        filled["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": o.lr, "betas": list(o.betas), "eps": o.eps, "weight_decay": o.weight_decay},
        }
    else:
        filled.setdefault("zero_allow_untested_optimizer", True)
    return filled


def zero_stage(ds_config: dict) -> int:
    return int(ds_config.get("zero_optimization", {}).get("stage", 0))
