"""benchmarks/sweep_world.py's variants are configs the trainer takes: each one's overrides on
launch/configs/tiny_world.yaml load and validate (a variant the config refuses would fail only an hour into a
sweep), and the variants of a setting that needs more than one update per rollout get one."""

import pytest
from benchmark_scripts import load_benchmark

from glm_grpo_ds.config import load_config

sw = load_benchmark("sweep_world")
PATHS = ["model.path=/world/model", "data.train_file=/world/train.jsonl", "eval.file=/world/heldout.jsonl"]


@pytest.mark.parametrize("variant", sorted(sw.VARIANTS))
def test_each_variant_is_a_valid_config(variant):
    cfg = load_config(str(sw.CONFIG), [*PATHS, *sw.VARIANTS[variant][1]])
    if cfg.grpo.objective != "clip" or cfg.grpo.importance_sampling_level == "sequence":  # differ off-policy only
        assert cfg.updates_per_step > 1 or cfg.rollout.one_step_off, variant
