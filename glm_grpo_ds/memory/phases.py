"""Which components of the memory plan (glm_grpo_ds/memory/plan.py) a GPU holds when: the resident ones all the
time, and one phase's transients at a time (rollout, decode, update, optimizer step, reward, the decoder's load).
The peak is the resident components + the largest phase. :func:`phase_totals` turns a plan into the per-phase
figures a run measures (metrics.jsonl ``memory/<phase>_peak_mb``), for the first step or a later one.
"""

from __future__ import annotations

from typing import NamedTuple

# on the GPU for the whole step (+ rollout.merge_lora's copy, placed once the rest is known)
RESIDENT = (
    "ar_weights",
    "lora_weights",
    "gradients",
    "master_weights",
    "optimizer_states",
    "reference",
    "lora_ema",
    "decoder",
    "reward_models",
    "zero_buffers",
    "runtime_overhead",
)


class Phase(NamedTuple):
    """The transients one phase holds: the largest of ``one_at_a_time`` (alive one after another) + all of
    ``beside`` (alive the whole phase)."""

    one_at_a_time: tuple[str, ...] = ()
    beside: tuple[str, ...] = ()


PHASES = {
    # a merge_lora rollout first merges (fp32 temporaries), then samples into the KV cache, then runs the
    # reference / old log-probs once the cache is gone; the gather (and its gloo staging) and the fused adapters
    # span all three
    "rollout": Phase(
        one_at_a_time=("rollout_kv_cache", "rollout_logprobs", "rollout_merge"),
        beside=("rollout_gather", "rollout_fused_lora", "gather_staging"),
    ),
    "decode": Phase(one_at_a_time=("decode_activations",)),
    "update": Phase(beside=("logits", "activations", "zero3_update_gather", "gather_staging")),
    # activations are freed by then; the flat copy is gone before the optimizer allocates its temporaries
    "step": Phase(one_at_a_time=("grad_flatten", "optimizer_step_temporaries"), beside=("fp32_grad_step",)),
    # an offloaded judge's visit and its forward's activations at once
    "reward": Phase(one_at_a_time=("reward_offloaded",), beside=("reward_scoring",)),
    # the decoder's load, before the first step (with decoder.fp8 only: the DiT unconverted)
    "load": Phase(one_at_a_time=("decoder_fp8_load",)),
}


def transient_phases(comp: dict[str, int], one_step_off: bool = False) -> dict[str, int]:
    """Bytes of each phase's transients (:data:`PHASES`) from the components' bytes. ``one_step_off``
    (``rollout.one_step_off``): the next step's rollout runs beside this step's decode and rewards, so a phase
    ``rollout_beside_decode`` holds the rollout's transients and the larger of the decode's and the reward's."""
    phases = {}
    for name, phase in PHASES.items():
        total = max((comp[k] for k in phase.one_at_a_time), default=0)
        for k in phase.beside:
            total += comp[k]
        phases[name] = total
    if one_step_off:
        phases["rollout_beside_decode"] = phases["rollout"] + max(phases["decode"], phases["reward"])
    return phases


# measured phase (metrics.jsonl ``memory/<phase>_peak_mb``) -> the plan's transient phases it contains (one step
# off, the decode's peak is the device's while the next rollout runs beside it)
MEASURED_PHASES = {
    "rollout": ("rollout",),
    "decode": ("decode", "rollout_beside_decode"),
    "reward": ("reward",),
    "update": ("update", "step"),
}


def phase_totals(planned: dict, first_step: bool = False) -> dict[str, int]:
    """Bytes per measured phase (:data:`MEASURED_PHASES`): the persistent components + the largest transient
    the phase contains. ``first_step``: the phases of a run's first step, whose rollout, decode and reward come
    before the optimizer's first step has created its state (``created_at_first_step``); its update makes it."""
    persistent = sum(planned["components"][k] for k in planned["persistent"])
    lazy = planned.get("created_at_first_step", 0) if first_step else 0
    return {
        name: persistent + max(planned["phases"].get(p, 0) for p in inner) - (0 if name == "update" else lazy)
        for name, inner in MEASURED_PHASES.items()
    }
