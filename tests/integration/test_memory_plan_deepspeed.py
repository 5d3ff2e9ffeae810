"""`glm-grpo estimate-memory` against what DeepSpeed really allocates: 2 CPU ranks, the tiny model,
one GRPO update; the planner's model-state bytes must equal the bytes of the actual parameter,
gradient, fp32-master and optimizer-state tensors on every rank."""

import pytest
from launching import common, worker  # noqa: E402  (tests/integration/launching.py)

CASES = {
    "zero3-lora-8bit": ("zero3.json", []),
    "zero2-full-adamw": ("zero2.json", ["lora=null", "optimizer.name=adamw"]),
    # bf16 base: peft keeps the adapters in fp32; ZeRO-3 keeps them so (and uses them as the master),
    # ZeRO-1/2 cast them to bf16 (memory_plan.lora_dtype)
    "zero3-lora-8bit-bf16": ("zero3.json", ["model.dtype=bf16"]),
    "zero2-lora-adamw-bf16": ("zero2.json", ["model.dtype=bf16", "optimizer.name=adamw"]),
}

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # 2-rank DeepSpeed update


@pytest.mark.parametrize("case", list(CASES))
def test_planner_model_states_equal_deepspeed_tensors(case, tiny_model_dir, tiny_data, tmp_path):  # noqa: F811
    ds_config, extra = CASES[case]
    overrides = common(
        tiny_model_dir,
        tiny_data,
        tmp_path / "run",
        "rollout.height=64",
        "rollout.width=64",
        "grpo.beta=0",
        "model.dtype=fp32",
        *extra,  # a later model.dtype wins
    )
    r = worker(2, "memory", tmp_path / "w", ds_config, overrides)
    planned = r["plan"]["model_states"]
    assert planned["optimizer_states"] > 0 and planned["master"] > 0
    for rank, (after, boundary) in enumerate(zip(r["after"], r["boundary"])):
        # after the step: weights (ZeRO-3: partitions + persistent small tensors), masters, states
        for key in ("parameters", "master", "optimizer_states"):
            assert after[key] == planned[key], (case, rank, key, after[key], planned[key])
        # just before engine.step the gradient partitions are complete. ZeRO-2 keeps whole tensors at
        # partition edges (the plan's worst rank) and may still hold the last reduce bucket's .grad
        # tensors, which the plan counts under zero_buffers
        low, high = planned["gradients_min"], planned["gradients"] + r["plan"]["components"]["zero_buffers"]
        assert low <= boundary["gradients"] <= high, (case, rank, boundary["gradients"], low, high)
