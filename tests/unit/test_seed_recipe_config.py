"""launch/configs/seed_recipe.yaml, the seeds' recipe in our keys (docs/seed-recipe.md): it loads,
holds their reward mix and data layout, gives every key the seeds named its seeds' name in a comment, and plans
on 8 GPUs at ZeRO-2 as its header says (`glm-grpo estimate-memory`, in-process; the run itself is
tests/integration/test_seed_recipe.py)."""

import json
import re
from pathlib import Path

from glm_grpo_ds.commands import estimate_memory
from glm_grpo_ds.config import load_config

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "launch" / "configs" / "seed_recipe.yaml"


def test_the_recipe_holds_the_seeds_mix_and_layout():
    cfg = load_config(str(RECIPE))
    assert [(r.name, r.weight) for r in cfg.rewards] == [
        ("lpips", 0.4),
        ("ssim", 0.2),
        ("ocr", 0.3),
        ("aesthetic", 0.1),
    ]
    assert cfg.data.train_file == "/data/prompts.txt" and cfg.lora is not None
    assert cfg.model.path == "zai-org/GLM-Image"
    assert (cfg.optimizer.lr, cfg.optimizer.weight_decay) == (5e-6, 0.01)  # the seeds' values, not our defaults
    assert cfg.grpo.epsilon_low == cfg.grpo.epsilon_high  # their one clip_range


def test_each_key_the_seeds_named_says_their_name():
    text = RECIPE.read_text()
    for ours, theirs in [
        ("group_size", "num_samples"),
        ("epsilon_low", "clip_range"),
        ("beta", "kl_coef"),
        ("advantage_estimator", "normalize_advantages"),
        ("rewards", "reward.metrics"),
        ("train_file", "prompts.txt"),
    ]:
        assert re.search(rf"^\s*{ours}:.*# seeds: .*{re.escape(theirs)}", text, re.M), ours


def test_it_plans_on_8_gpus_at_zero2(capsys):
    argv = ["--config", str(RECIPE), "--deepspeed", str(ROOT / "ds_configs/zero2.json"), "--num-gpus", "8", "--json"]
    assert estimate_memory.main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["fastest_that_fits"]["given_is_fastest"]
