"""What ``glm-grpo estimate-memory`` says when a plan does not fit, and a run when a GPU ran out of memory
(:mod:`.oom`): each setting of the run that would plan less, with its saving, planned again with that one change
(the DeepSpeed configs are :mod:`.stages`' line).

    changes = candidate_changes(cfg, plan)            # [(overrides, why)] that apply to this run (space-separated)
    saved = replanned(cfg, plan, plan_config)         # each planned again: plan_config(cfg with the change)
    lever_text(plan, saved)                           # "decoder.offload=true -13.5 GiB (fits alone), ..."
    lever_text(plan, saved, phase="decode")           # the same, by what each saves on that phase's peak

Only changes that apply are offered (a config already on LoRA is not told to use LoRA; a decoder already offloaded
is not told to offload it), so each figure is one the user can have by setting that key.
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import ConfigError, with_overrides
from ..ds.ds_config import DeepSpeedConfigError
from .phases import phase_totals
from .plan import GIB

# a change must save at least this much to be named (a rounding-size saving is not advice)
MIN_SAVING = 0.05 * GIB
NO_LEVER = "no setting of this run plans less; more GPUs with ZeRO-3 or GPUs with more memory"


def candidate_changes(cfg, given: dict) -> list[tuple[str, str]]:
    """``[(key=value override, what it does)]``: the run's settings whose change plans less GPU memory, among those
    this run has not made yet."""
    out = []
    if not cfg.decoder.offload:
        out.append(("decoder.offload=true", "the DiT on the host between decodes"))
    if cfg.decoder.batch_size > 1:
        out.append((f"decoder.batch_size={cfg.decoder.batch_size // 2}", "fewer images per DiT forward"))
    micro, group, prompts = cfg.batch.micro_batch_size, cfg.grpo.group_size, cfg.batch.prompts_per_rank
    minis = cfg.batch.mini_batches  # a micro-batch divides a mini-batch's sequences
    if micro > 1:  # the largest micro-batch below this one that still divides a mini-batch's sequences
        out.append((f"batch.micro_batch_size={_divisor_below(prompts * group // minis, micro)}", "smaller update "
                    "activations"))  # fmt: skip
    if prompts > 1 and (prompts // 2 * group) % minis == 0:
        fewer, change = prompts // 2, f"batch.prompts_per_rank={prompts // 2}"
        if (fewer * group // minis) % micro:  # the micro-batch must divide the fewer sequences too
            change += f" batch.micro_batch_size={_divisor_below(fewer * group // minis, micro + 1)}"
        out.append((change, "fewer sequences per GPU per step"))
    if not cfg.model.gradient_checkpointing:
        out.append(("model.gradient_checkpointing=true", "activations recomputed in the backward"))
    if cfg.rollout.one_step_off:
        out.append(("rollout.one_step_off=false", "no rollout beside the decode: serial steps"))
    if not cfg.decoder.fp8:
        out.append(("decoder.fp8=true", "the DiT's linears in FP8; changes the images: glm-grpo decode-agreement"))
    for i, reward in enumerate(given.get("rewards", [])):
        if reward["where"] == "gpu":
            out.append((f"rewards[{i}].args.offload=true", f"the {reward['name']} model on the host between scores"))
    return out


def _divisor_below(n: int, limit: int) -> int:
    """The largest divisor of ``n`` below ``limit`` (1 at least)."""
    return max(d for d in range(1, max(limit, 2)) if n % d == 0)


def replanned(cfg, given: dict, plan_config: Callable[[object], dict]) -> list[tuple[str, str, dict]]:
    """``(change, why, plan)`` of each of :func:`candidate_changes`: ``plan_config`` plans ``cfg`` with that change
    applied in memory (``config.with_overrides``: whatever its file holds now); a change the config refuses is left
    out."""
    out = []
    for change, why in candidate_changes(cfg, given):
        try:
            out.append((change, why, plan_config(with_overrides(cfg, change.split()))))
        except (ConfigError, DeepSpeedConfigError):
            continue
    return out


def lever_text(given: dict, planned: list[tuple[str, str, dict]], phase: str | None = None) -> str:
    """The changes that save at least :data:`MIN_SAVING`, largest first, each with its saving and whether it fits
    alone; or a sentence saying none does. ``planned``: ``(change, why, its plan)``. ``phase`` (a key of
    :data:`~.phases.MEASURED_PHASES`): the savings on that phase's planned peak instead of the run's (the phase a
    GPU ran out of memory in: memory/oom.py), without the verdict on fitting, which the plan had given already."""

    def peak(p: dict) -> int:
        return p["total_bytes"] if phase is None else phase_totals(p)[phase]

    rows = []
    for change, why, p in planned:
        saved = peak(given) - peak(p)
        if saved >= MIN_SAVING:
            fits = " (fits alone)" if phase is None and p["headroom_bytes"] >= 0 else ""
            rows.append((saved, f"{change} -{saved / GIB:.1f} GiB{fits}: {why}"))
    if not rows:
        return NO_LEVER
    return "; ".join(text for _, text in sorted(rows, key=lambda r: -r[0]))
