"""glm_grpo_ds/runtime/memory_probe.py on the CPU: a phase's peak sees a torch allocation made and freed inside it,
a new phase starts from the current resident set, and the run's peak survives the resets."""

import gc

import torch

from glm_grpo_ds.observability.metrics import measure
from glm_grpo_ds.runtime import memory_probe

CPU = torch.device("cpu")
MIB = 2**20


def _allocate_and_free(mib: int) -> None:
    t = torch.ones(mib * MIB // 4)  # written, so every page is resident
    assert float(t[-1]) == 1.0


def test_phase_peak_sees_an_allocation_freed_inside_the_block_and_the_run_peak_survives():
    # An earlier test's garbage freed by a collection between a reading and the block's reset took the resident set
    # 340 MB down once (CI): collect it first, keep the collector off, and read the start inside the block.
    gc.collect()
    gc.disable()
    try:
        timings, peaks = {}, {}
        with measure(timings, peaks, "big", CPU):
            start = memory_probe.current_bytes(CPU)  # the figure the reset started the peak at
            _allocate_and_free(256)
    finally:
        gc.enable()
    assert peaks["memory/big_peak_mb"] >= start / MIB + 240  # the 256 MiB tensor, gone by the block's end
    assert timings["big"] >= 0
    with measure(timings, peaks, "small", CPU):
        _allocate_and_free(16)
    # the reset took the peak down to the resident set at the second block's start: the 256 MiB are not in it
    assert peaks["memory/small_peak_mb"] < peaks["memory/big_peak_mb"] - 200
    assert memory_probe.run_peak_bytes(CPU) / MIB >= peaks["memory/big_peak_mb"]


def test_check_run_phase_comparison_by_hand():
    from glm_grpo_ds.commands.check_run import phase_comparison

    plan = {
        "components": {"weights": 3 * MIB, "decoder": 1 * MIB, "gather": 2 * MIB},
        "persistent": ["weights", "decoder"],
        "phases": {"rollout": 2 * MIB, "decode": 0, "update": 1 * MIB, "step": 3 * MIB, "reward": 0},
    }
    rows = [
        {"step": 2, "memory/rollout_peak_mb": 7.0, "memory/update_peak_mb": 8.0, "memory/before_load_mb": 1.0},
        {"step": 3, "memory/rollout_peak_mb": 6.0, "memory/update_peak_mb": 9.0, "memory/before_load_mb": 1.0},
    ]
    c = phase_comparison(rows, plan)
    assert set(c) == {"rollout", "update"}  # phases without a measurement are left out
    # rollout: 4 persistent + 2 transient + 1 before the models loaded; the highest of the two steps
    assert c["rollout"] == {"measured_mb": 7.0, "planned_mb": 7.0, "ratio": 1.0, "step": 2}
    # update: the larger of the plan's update (1) and optimizer step (3) phases
    assert c["update"]["planned_mb"] == 8.0 and c["update"]["ratio"] == 9.0 / 8.0 and c["update"]["step"] == 3


def test_first_step_phases_are_planned_without_the_optimizer_state_its_step_creates():
    """A one-step run (the GPU checks) measures rollout, decode and reward before torch's AdamW or bitsandbytes
    has created its moments: step 1 is compared with the plan less ``created_at_first_step``; its update, which
    creates them, and every later step with the whole plan."""
    from glm_grpo_ds.commands.check_run import phase_comparison

    plan = {
        "components": {"weights": 3 * MIB, "optimizer_states": 2 * MIB},
        "persistent": ["weights", "optimizer_states"],
        "phases": {"rollout": 1 * MIB, "decode": 0, "update": 1 * MIB, "step": 0, "reward": 0},
        "created_at_first_step": 2 * MIB,
    }
    first = {"step": 1, "memory/rollout_peak_mb": 4.0, "memory/update_peak_mb": 6.0}
    c = phase_comparison([first], plan)
    assert c["rollout"]["planned_mb"] == 4.0  # 5 persistent - 2 not yet created + 1 transient
    assert c["update"]["planned_mb"] == 6.0  # the whole plan: the step creates the state
    later = {"step": 2, "memory/rollout_peak_mb": 4.0}
    assert phase_comparison([later], plan)["rollout"]["planned_mb"] == 6.0
    # the worse of the two steps against its own plan is the one reported
    assert phase_comparison([first, later], plan)["rollout"]["step"] == 1
