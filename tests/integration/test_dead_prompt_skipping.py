"""`data.dead_prompt_skip_prob` through training: prompts whose group had no reward variance are passed
over in later epochs (no rollout, no decode), and every step records `frac_reward_zero_std`. The sampler's
draws, their agreement across ranks and resume: tests/unit/test_dead_prompts.py."""

import json

import pytest
from launching import FAST, run_cmd, train_cmd  # noqa: E402  (tests/integration/launching.py)
from run_files import metrics  # noqa: E402  (tests/run_files.py)

pytestmark = pytest.mark.slow  # a training run

# 1.0 for the prompts that say "flat" (every sample alike: a dead group), the image mean otherwise; and the image
# mean everywhere, logged at weight 0 (it varies in the flat prompts' groups too, and must not keep them alive)
PLUGIN = """
import torch
def flat_or_mean(images, prompts, samples):
    flat = torch.tensor(["flat" in p for p in prompts])
    return torch.where(flat, torch.ones(len(prompts)), images.mean(dim=(1, 2, 3)))
def image_mean(images, prompts, samples):
    return images.mean(dim=(1, 2, 3))
"""


def test_dead_prompts_are_skipped_after_their_first_group(tiny_model_dir, tmp_path):
    (tmp_path / "flat.py").write_text(PLUGIN)
    (tmp_path / "p.txt").write_text("a flat square\na flat circle\na red apple\na blue car\n")
    out = tmp_path / "run"
    cmd = train_cmd()
    cmd += [f"model.path={tiny_model_dir}", f"data.train_file={tmp_path / 'p.txt'}", f"output_dir={out}", *FAST]
    cmd += ["grpo.group_size=2", "batch.micro_batch_size=2", "data.shuffle=false", "max_steps=8"]
    plugin = tmp_path / "flat.py"
    rewards = f"rewards=[{{name: '{plugin}:flat_or_mean'}}, {{name: '{plugin}:image_mean', weight: 0}}]"
    cmd += ["data.dead_prompt_skip_prob=0.999999", rewards, "logging.sample_records=1"]
    proc = run_cmd(cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(out)
    # epoch 0 in file order: the two flat prompts are dead groups; afterwards they are passed over (one
    # draw per turn, each almost surely a skip), so steps 5-8 train the red apple and the blue car twice
    assert [r["frac_reward_zero_std"] for r in rows] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [r["prompts_skipped"] for r in rows] == [0, 0, 0, 0, 2, 0, 2, 0]
    assert all(r["dead_prompts"] == 2 for r in rows[1:])
    assert [r["reward_mean"] == 1.0 for r in rows] == [True, True] + [False] * 6
    # samples.jsonl: a line per sample, its prompt, each reward, the total and the advantage the update used
    lines = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [(s["step"], s["sample"], s["group_member"]) for s in lines] == [
        (i // 2 + 1, i % 2, i % 2) for i in range(16)
    ]
    flat = [s for s in lines if "flat" in s["prompt"]]
    assert [s["step"] for s in flat] == [1, 1, 2, 2]  # passed over after their dead first groups
    assert all(
        s["advantage"] == 0.0 and s["reward"] == 1.0 and s["rewards"][f"{plugin}:flat_or_mean"] == 1.0 for s in flat
    )
    for step, r in enumerate(rows, 1):
        mine = [s for s in lines if s["step"] == step]
        assert sum(s["reward"] for s in mine) / 2 == pytest.approx(r["reward_mean"])
        assert sum(s["advantage"] for s in mine) == pytest.approx(0.0, abs=1e-3)  # centred within the group (float32)
        assert mine[0]["rewards"][f"{plugin}:image_mean"] != mine[1]["rewards"][f"{plugin}:image_mean"]  # weight 0
