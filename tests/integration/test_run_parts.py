"""The trainer by composition (glm_grpo_ds/startup.py Run, glm_grpo_ds/train.py Trainer(run)): a Run put together
from parts - a fresh policy engine, its sampler, the prompt order, the rollout source, a monitor, without the run's
life on disk, publisher or tracker - takes the same first step as the Run build_run makes (one CPU rank, real
DeepSpeed ZeRO-2, the tiny model; tests/integration/ds_worker.py parts)."""

import pytest
from launching import FAST, common, worker  # noqa: E402  (tests/integration/launching.py)


@pytest.mark.distributed
def test_a_run_from_parts_takes_the_step_build_run_takes(tiny_model_dir, tiny_data, tmp_path):
    overrides = common(tiny_model_dir, tiny_data, tmp_path / "run", "max_steps=1", *FAST)
    r = worker(1, "parts", tmp_path / "w", "zero2.json", overrides)
    built, parts = r["build_run"], r["parts"]
    assert built["step"] == parts["step"] == 1 and built["skipped"] == 0
    # the same samples (rewards, images), the same update (loss, gradient)
    for key in ("reward_mean", "reward_std", "images/brightness", "loss", "entropy", "grad_norm", "advantages/std"):
        assert parts[key] == built[key], key
