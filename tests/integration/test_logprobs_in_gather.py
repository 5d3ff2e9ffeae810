"""The reference and old log-probs computed inside the rollout's parameter gather (what the trainer does)
equal those the update would compute through the engine, bitwise, and under ZeRO-3 they gather nothing
more, while the update's own reference pass would gather the whole AR again. 2 CPU ranks, real DeepSpeed."""

import pytest
import torch
from launching import common, worker  # noqa: E402  (tests/integration/launching.py)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


@pytest.mark.parametrize("ds_config", ["zero3.json", "zero2.json"])
def test_logprobs_before_the_update_are_exact_and_gather_nothing(ds_config, tiny_model_dir, data64, tmp_path):
    overrides = common(tiny_model_dir, data64, tmp_path / "run", "rollout.height=64", "rollout.width=64")
    overrides += ["grpo.group_size=4", "batch.micro_batch_size=2", "grpo.beta=0.1", "grpo.num_iterations=2"]
    r = worker(2, "before", tmp_path / "w", ds_config, overrides)
    for key in ("ref", "old"):
        in_gather, through_engine = r[key]
        assert torch.equal(in_gather, through_engine), key
    assert r["first_ratio"] == (1.0, 1.0)  # old log-probs from the gather, the first ratio exactly 1
    b = r["bytes"]
    assert b["rollout_with_before"] == b["rollout"]  # the extra passes ran on the gathered AR
    if ds_config == "zero3.json":
        # the comms logger records an all-gather's input, one rank's shard: x world = what is gathered
        assert b["rollout"] * r["world"] == r["ar_bytes"]  # the rollout gathers the whole AR once
        assert b["reference_in_update"] >= b["rollout"]  # a reference pass in the update: all of it again
    else:
        assert b["rollout"] == b["reference_in_update"] == 0  # ZeRO-2: parameters are never gathered
