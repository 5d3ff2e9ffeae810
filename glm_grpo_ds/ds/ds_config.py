"""Reading a DeepSpeed JSON (``ds_configs/*.json`` or the user's) and filling its ``"auto"`` values.

DeepSpeed itself does not parse ``"auto"``; Hugging Face-style JSONs carry it in batch, precision,
bucket, ``optimizer.params`` and ``scheduler.params`` keys. :func:`fill_ds_config` resolves each one from
the :class:`~glm_grpo_ds.config.TrainConfig` and the AR's hidden size, refuses concrete values that
contradict the training config (listing each), and refuses combinations DeepSpeed would accept but that
would not do what the training config says.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

# ds_config keys our trainer fills when they say "auto" (DeepSpeed itself does not parse "auto"), beside
# the optimizer.params.* / scheduler.params.* keys of OPTIMIZER_PARAMS / SCHEDULER_PARAMS.
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
# Keys that must agree with the training config when given a concrete value (the JSON would silently win).
MUST_AGREE = {
    "gradient_clipping": "optimizer.max_grad_norm",
    "bf16.enabled": "model.dtype",
    "fp16.enabled": "model.dtype",
}
# optimizer.params.<key> -> the training config's optimizer.<key>
OPTIMIZER_PARAMS = ("lr", "betas", "eps", "weight_decay")
# DeepSpeed optimizer types that are optimizer.name=adamw ("Adam" is AdamW unless adam_w_mode is false).
ADAMW_TYPES = ("adamw", "adam")
# DeepSpeed scheduler type -> the optimizer.schedule it is (warmup from 0, decay to 0 at the last step)
SCHEDULE_OF_TYPE = {"WarmupLR": "constant", "WarmupDecayLR": "linear", "WarmupCosineLR": "cosine"}
# scheduler.params.<key> -> (the training config key it stands for, its value from the optimizer config)
SCHEDULER_PARAMS = {
    "warmup_min_lr": ("0 (warmup starts at lr 0)", lambda o, total: 0),
    "warmup_max_lr": ("optimizer.lr", lambda o, total: o.lr),
    "warmup_num_steps": ("optimizer.warmup_steps", lambda o, total: o.warmup_steps),
    "warmup_type": ("linear (the trainer's warmup)", lambda o, total: "linear"),
    "total_num_steps": ("max_steps x grpo.num_iterations x batch.mini_batches", lambda o, total: total),
    "warmup_min_ratio": ("0 (warmup starts at lr 0)", lambda o, total: 0),
    "cos_min_ratio": ("0 (cosine decays to lr 0)", lambda o, total: 0),
}


class DeepSpeedConfigError(ValueError):
    """A problem with a ds_configs JSON; the message names the file and the fix."""


# sections (dotted) that must be JSON objects when present: our checks and DeepSpeed read keys of them
OBJECT_SECTIONS = (
    "zero_optimization", "zero_optimization.offload_optimizer", "zero_optimization.offload_param", "optimizer",
    "optimizer.params", "scheduler", "scheduler.params", "bf16", "fp16", "activation_checkpointing",
)  # fmt: skip


def read_ds_config(path: str | os.PathLike) -> dict:
    """The JSON object of a DeepSpeed config file, its sections of the right kind; DeepSpeedConfigError naming the
    file and the fix otherwise."""
    p = Path(path)
    if not p.exists():
        raise DeepSpeedConfigError(f"DeepSpeed config {p} does not exist; pick one of ds_configs/*.json")
    # DeepSpeed's own hook: it refuses a key given twice when it reads a file itself; it is handed this dict instead,
    # where a second "stage" silently won
    from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys

    try:
        data = json.loads(p.read_text(encoding="utf-8"), object_pairs_hook=dict_raise_error_on_duplicate_keys)
    except json.JSONDecodeError as err:
        raise DeepSpeedConfigError(
            f"{p} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}"
        ) from None
    except (OSError, UnicodeDecodeError) as err:  # a directory, no permission, not UTF-8
        raise DeepSpeedConfigError(f"DeepSpeed config {p} cannot be read ({type(err).__name__}: {err})") from None
    except ValueError as err:  # the hook's "Duplicate keys in DeepSpeed config: ['stage']"
        raise DeepSpeedConfigError(f"{p}: {err} (JSON keeps the last silently): keep one of each") from None
    if not isinstance(data, dict):
        raise DeepSpeedConfigError(f"{p} must hold a JSON object")
    _check_kinds(data, p)
    _check_zero_section(data, p)
    return data


def _check_zero_section(data: dict, p: Path) -> None:
    """``zero_optimization`` as DeepSpeed's own model of it reads it (its keys, their types), the trainer's ``"auto"``
    keys left out: a misspelled key or a bucket size of ``"big"`` passed every check here, then failed
    ``deepspeed.initialize`` in a traceback, after ``overwrite_output_dir`` had deleted the earlier run."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    zero = {key: value for key, value in data.get("zero_optimization", {}).items() if value != "auto"}
    try:
        DeepSpeedZeroConfig(**zero)
    # pydantic's ValidationError (a ValueError): every problem, each with where and what; AssertionError: DeepSpeed's
    # own checks of a deprecated key given with its replacement (cpu_offload and offload_optimizer)
    except (ValueError, AssertionError) as err:
        found = err.errors() if hasattr(err, "errors") else [{"msg": str(err) or type(err).__name__}]
        problems = [_zero_problem(e) for e in found]
        raise DeepSpeedConfigError(f"{p}: DeepSpeed refuses " + "; ".join(problems)) from None


def _zero_problem(error: dict) -> str:
    """One of pydantic's errors on ``zero_optimization`` as a phrase naming the key and the fix."""
    where = ".".join(["zero_optimization", *map(str, error.get("loc", ()))])
    if error.get("type") == "extra_forbidden":
        return f"{where}: not a key DeepSpeed knows (misspelled? remove it)"
    got = f" (got {json.dumps(error['input'], default=str)})" if "input" in error else ""
    return f"{where}: {error['msg']}{got}"


SILENT_SECTIONS = ("zero_optimization", "bf16", "fp16")  # ignored when misspelled: ZeRO-0, or another precision


def _check_section_names(data: dict, p: Path) -> None:
    """A top-level key that is a misspelling of a section DeepSpeed would then ignore (``"zero_optimisation"``: the run
    trains at ZeRO-0, every parameter whole on every GPU, and runs out of memory after the job queued)."""
    import difflib

    for key in data:
        if key not in SILENT_SECTIONS and key != "bfloat16":  # DeepSpeed's older name of bf16
            close = difflib.get_close_matches(key, SILENT_SECTIONS, n=1, cutoff=0.8)
            if close:
                raise DeepSpeedConfigError(
                    f'{p}: "{key}" is not a key DeepSpeed knows; did you mean "{close[0]}"? (DeepSpeed ignores keys '
                    "it does not know: the section would not apply); rename it"
                )


def _check_kinds(data: dict, p: Path) -> None:
    """Sections that are objects, a ZeRO stage that is a number: DeepSpeed takes ``"stage": "3"`` as 3, our checks of
    what ZeRO-3 cannot run would compare the text with 3 and pass it."""
    _check_section_names(data, p)
    for dotted in OBJECT_SECTIONS:
        *parents, last = dotted.split(".")
        node = data
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node and not isinstance(node[last], dict):
            example = ' like {"device": "cpu"}' if last.startswith("offload") else ""
            raise DeepSpeedConfigError(f"{p}: {dotted} must be a JSON object{example}, got {json.dumps(node[last])}")
    stage = data.get("zero_optimization", {}).get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise DeepSpeedConfigError(
            f"{p}: zero_optimization.stage must be the number 0, 1, 2 or 3, got {json.dumps(stage)}"
        )


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


def _same(a, b) -> bool:
    """JSON value == config value (numbers compared as floats, lists item by item)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def _optimizer_problems(filled: dict, cfg) -> list[str]:
    """Fill "auto" in ``optimizer.params``; one line per way the JSON's optimizer contradicts ``optimizer.*``."""
    section = filled.get("optimizer")
    if section is None:
        return []
    o, problems = cfg.optimizer, []
    kind = str(section.get("type", ""))
    params = section.setdefault("params", {})
    if o.name != "adamw":
        problems.append(
            f"optimizer.type={kind} but optimizer.name={o.name} (a bitsandbytes client optimizer the JSON would "
            "replace): remove the JSON's optimizer section, or set optimizer.name=adamw"
        )
    elif kind.lower() not in ADAMW_TYPES or (kind.lower() == "adam" and params.get("adam_w_mode") is False):
        problems.append(
            f"optimizer.type={kind or '(missing)'} but optimizer.name=adamw: use type AdamW, or remove the "
            "JSON's optimizer section"
        )
    for key in OPTIMIZER_PARAMS:
        ours = list(getattr(o, key)) if key == "betas" else getattr(o, key)
        if params.get(key) == "auto":
            params[key] = ours
        elif key in params and not _same(params[key], ours):
            problems.append(f"optimizer.params.{key}={json.dumps(params[key])} but optimizer.{key}={json.dumps(ours)}")
    for key, value in params.items():
        if value == "auto" and key not in OPTIMIZER_PARAMS:
            problems.append(
                f'optimizer.params.{key}="auto" is not supported (auto works for: {", ".join(OPTIMIZER_PARAMS)})'
            )
    return problems


def _scheduler_problems(filled: dict, cfg) -> list[str]:
    """One line per way the JSON's scheduler contradicts ``optimizer.schedule`` / ``warmup_steps`` / ``lr``;
    the section is then dropped: the trainer's own schedule (ds/optimizer.build_scheduler) runs, and
    DeepSpeed would otherwise build the JSON's in its place."""
    section = filled.pop("scheduler", None)
    if section is None:
        return []
    o, problems = cfg.optimizer, []
    kind = str(section.get("type", ""))
    if SCHEDULE_OF_TYPE.get(kind) != o.schedule:
        known = ", ".join(f"{t} ({s})" for t, s in SCHEDULE_OF_TYPE.items())
        problems.append(
            f"scheduler.type={kind or '(missing)'} but optimizer.schedule={o.schedule}: the trainer runs the "
            f"config's schedule; remove the JSON's scheduler section (types that match a schedule: {known})"
        )
    total = cfg.total_optimizer_steps
    for key, value in (section.get("params") or {}).items():
        if key not in SCHEDULER_PARAMS:
            problems.append(f"scheduler.params.{key}={json.dumps(value)} has no counterpart in the training config")
            continue
        stands_for, ours = SCHEDULER_PARAMS[key][0], SCHEDULER_PARAMS[key][1](o, total)
        if value != "auto" and not _same(value, ours):
            problems.append(f"scheduler.params.{key}={json.dumps(value)} but {stands_for} = {json.dumps(ours)}")
    return problems


def fill_ds_config(
    raw: dict, cfg, world_size: int, hidden_size: int, dtype: torch.dtype, source: str = "ds_config"
) -> dict:
    """Resolve every "auto" from the TrainConfig; reject "auto" in keys we do not own.

    A concrete value that contradicts the training config (optimizer lr / betas / eps / weight_decay,
    an optimizer type other than optimizer.name, a scheduler other than optimizer.schedule, gradient
    clipping, precision) is an error listing each one: DeepSpeed would silently use the JSON's while
    the run's summary and config.json show the config's. Also checks combinations DeepSpeed would
    accept but that would silently not do what the user asked (an 8-bit client optimizer with
    optimizer offload keeps fp32 states on the CPU).
    """
    filled = json.loads(json.dumps(raw))
    values = _trainer_values(cfg, world_size, hidden_size, dtype)
    zero = filled.get("zero_optimization", {})
    offload_opt = offloads(zero, "offload_optimizer")
    _check_combinations(zero, offload_opt, cfg, source)
    problems = _fill_auto(filled, values, source)
    problems += _optimizer_problems(filled, cfg) + _scheduler_problems(filled, cfg)
    if problems:
        raise DeepSpeedConfigError(
            f"{source} contradicts the training config (DeepSpeed would silently use the JSON's values); set these "
            'to "auto", remove them, or change the training config:\n' + "\n".join(problems)
        )
    # Batch keys must agree with the trainer's batching even when given explicitly.
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        if key in filled and filled[key] != values[key]:
            raise DeepSpeedConfigError(
                f"{source}: {key}={json.dumps(filled[key])} disagrees with the trainer ({values[key]} from "
                f"batch.micro_batch_size="
                f"{cfg.batch.micro_batch_size}, batch.prompts_per_rank x grpo.group_size={cfg.sequences_per_rank}, "
                f"batch.mini_batches={cfg.batch.mini_batches}, "
                f'world size {world_size}); set it to "auto"'
            )
        filled[key] = values[key]
    _set_defaults(filled, cfg, offload_opt, source)
    return filled


def _trainer_values(cfg, world_size: int, hidden_size: int, dtype: torch.dtype) -> dict:
    """The value of every :data:`AUTO_KEYS` key for this run: the batching, clipping and precision of the
    training config, the bucket sizes from the AR's hidden size."""
    micro = cfg.batch.micro_batch_size
    accum = cfg.sequences_per_rank // cfg.batch.mini_batches // micro  # the micro-batches of one optimizer step
    return {
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


def _check_combinations(zero: dict, offload_opt: bool, cfg, source: str) -> None:
    """Refuse what DeepSpeed would accept but that would not do what the training config says."""
    if offload_opt and cfg.optimizer.name != "adamw":
        raise DeepSpeedConfigError(
            f"{source}: optimizer.name={cfg.optimizer.name} with zero_optimization.offload_optimizer: DeepSpeed would "
            "keep fp32 optimizer states on the CPU, not 8-bit ones; use optimizer.name=adamw (DeepSpeed CPU Adam) "
            "with offload, or drop offload_optimizer to keep the 8-bit optimizer"
        )
    zero3 = zero.get("stage", 0) == 3
    if zero3 and cfg.rollout.one_step_off:
        # the rollout's parameter gathers are collectives: from a second thread, beside the main thread's gather of
        # the rewards, the ranks could issue them in different orders (a hang)
        raise DeepSpeedConfigError(
            f"{source}: rollout.one_step_off=true with ZeRO-3: the background rollout's parameter gathers would race "
            "the rewards' gather on the main thread; use a ZeRO-1/2 config (ds_configs/zero2.json) or "
            "rollout.one_step_off=false"
        )
    sharded_rollout = zero3 and not cfg.rollout.gather_parameters
    why = {  # what a rollout with ZeRO-3's per-module parameter fetches cannot do
        "compile": "fetches each module's parameters in hooks that torch.compile cannot trace",
        "cuda_graph": "fetches each module's parameters in hooks, with host work a CUDA graph cannot capture",
        "merge_lora": "holds only this rank's shard of each base weight, with nothing to merge into",
        "fuse_lora": "holds only this rank's shard of each adapter, with nothing to concatenate",
    }
    for key, reason in why.items():
        if sharded_rollout and getattr(cfg.rollout, key):
            raise DeepSpeedConfigError(
                f"{source}: rollout.{key}=true with ZeRO-3 needs rollout.gather_parameters=true (a sharded rollout "
                f"{reason}); set one of them"
            )


def _fill_auto(filled: dict, values: dict, source: str) -> list[str]:
    """Every "auto" outside the optimizer / scheduler params set from ``values`` (one we do not own is refused);
    one line per :data:`MUST_AGREE` key whose concrete value contradicts the training config."""
    owned = ("optimizer.params.", "scheduler.params.")  # filled (or checked) by their own sections
    problems = []
    for key, value in list(_walk(filled)):
        if value == "auto" and not key.startswith(owned):
            if key not in AUTO_KEYS:
                supported = (
                    sorted(AUTO_KEYS) + [f"optimizer.params.{k}" for k in OPTIMIZER_PARAMS] + ["scheduler.params.*"]
                )
                raise DeepSpeedConfigError(
                    f'{source}: "auto" is not supported for {key}; give a value '
                    f"(auto works for: {', '.join(supported)})"
                )
            _set(filled, key, values[key])
        elif key in MUST_AGREE and not _same(value, values[key]):
            problems.append(f"{key}={json.dumps(value)} but {MUST_AGREE[key]} gives {json.dumps(values[key])}")
    return problems


def _set_defaults(filled: dict, cfg, offload_opt: bool, source: str) -> None:
    """What the trainer sets when the JSON does not: no step prints, no breakdown, ZeRO stage 0, and the
    optimizer: DeepSpeed's own CPU Adam runs an offloaded one, else ours (an untested one to DeepSpeed)."""
    filled.setdefault("steps_per_print", 10**9)
    filled.setdefault("wall_clock_breakdown", False)
    filled.setdefault("zero_optimization", {"stage": 0})
    if offload_opt:
        # DeepSpeed's own CPU Adam runs the offloaded optimizer.
        o = cfg.optimizer
        filled["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": o.lr, "betas": list(o.betas), "eps": o.eps, "weight_decay": o.weight_decay},
        }
    else:
        # DeepSpeed asserts inside initialize when ZeRO meets an optimizer outside its tested list (bitsandbytes')
        # and this key is false: a traceback after the job queued, which the check and the start refuse in one line
        untested = cfg.optimizer.name != "adamw" and zero_stage(filled) > 0
        if untested and filled.get("zero_allow_untested_optimizer", True) is not True:
            raise DeepSpeedConfigError(
                f"{source}: zero_allow_untested_optimizer={json.dumps(filled['zero_allow_untested_optimizer'])} "
                f"refuses optimizer.name={cfg.optimizer.name} (bitsandbytes', outside DeepSpeed's tested list) at "
                "ZeRO; remove the key (the trainer sets it to true) or use optimizer.name=adamw"
            )
        filled.setdefault("zero_allow_untested_optimizer", True)


def zero_stage(ds_config: dict) -> int:
    return int(ds_config.get("zero_optimization", {}).get("stage", 0))


def offloads(zero: dict, what: str) -> bool:
    """True when the ``zero_optimization`` section ``zero`` offloads ``what`` (``offload_optimizer`` /
    ``offload_param``) to a device, cpu or nvme."""
    return zero.get(what, {}).get("device", "none") not in ("none", None)
