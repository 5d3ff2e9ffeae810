"""The learnable tiny world: its decoder paints exact colour blocks through the real GlmImagePipeline,
and GRPO under real DeepSpeed (2 CPU ranks, ZeRO-3, LoRA, 8-bit AdamW) learns it - while the same run
with a learning rate of 1e-9 (the config refuses 0) does not (the learning assertion is shown able to fail)."""

import json
import sys
from pathlib import Path

import pytest
import torch

from glm_grpo_ds.config import DecoderConfig
from glm_grpo_ds.decoder import ImageDecoder
from glm_grpo_ds.rollout import upsample_grid
from glm_grpo_ds.testing import world

sys.path.insert(0, str(Path(__file__).parent))
from test_trainer_deepspeed import launch  # noqa: E402  (same directory)

WORLD_CONFIG = "launch/configs/tiny_world.yaml"


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    world.write_world(out)
    return out


@pytest.mark.parametrize("steps,guidance", [(1, 1.0), (3, 1.5), (8, 4.0)])
def test_decoder_paints_each_token_its_colour(world_dir, steps, guidance):
    decoder = ImageDecoder(world_dir / "model", DecoderConfig(num_inference_steps=steps, guidance_scale=guidance), "cpu")
    grids = torch.randint(0, 16, (4, 6), generator=torch.Generator().manual_seed(steps))  # 2x3 cells: 64x96
    images = decoder.decode(upsample_grid(grids, 2, 3), ["red image"] * 4, 64, 96, [0, 1, 2, 3])
    assert set(images.unique().tolist()) <= {0.0, 1.0}  # saturated, whatever the noise
    expected = torch.tensor([[world.COLOURS[world.token_colour(int(k))] for k in row] for row in grids]).view(4, 2, 3, 3)
    assert torch.equal(world.cell_colours(images), expected.float())
    assert (images.reshape(4, 3, 2, 32, 3, 32).std(dim=(3, 5)) == 0).all()  # every cell is one flat colour


def test_write_world_best_and_prompts(world_dir):
    summary = json.loads((world_dir / "best.json").read_text())
    assert len(summary["palette"]) == 16 and summary["palette"][1] == [1.0, 0.0, 0.0]
    train = [json.loads(line)["prompt"] for line in (world_dir / "train.jsonl").read_text().splitlines()]
    held = [json.loads(line)["prompt"] for line in (world_dir / "heldout.jsonl").read_text().splitlines()]
    assert not set(train) & set(held) and all(summary["best"][p] == 1.0 for p in train + held)


def _eval_fraction(run_dir, best=1.0):
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    start, end = rows[0]["eval/reward_mean"], rows[-1]["eval/reward_mean"]
    return start, end, (end - start) / (best - start)


def _train(world_dir, run_dir, *extra):
    prompts = run_dir.parent / f"{run_dir.name}_prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "red image"}) + "\n" + json.dumps({"prompt": "red image"}) + "\n")
    launch(2, ["--module", "glm_grpo_ds.train", "--config", WORLD_CONFIG, "--deepspeed", "ds_configs/zero3.json",
               f"model.path={world_dir / 'model'}", f"data.train_file={prompts}", f"eval.file={prompts}",
               "eval.num_prompts=1", "eval.group_size=16", "eval.steps=0", "eval.gallery=false", "max_steps=25",
               f"output_dir={run_dir}", "logging.progress_bar=false", "logging.plot=false", *extra], timeout=600)
    return _eval_fraction(run_dir)


def test_grpo_learns_the_world_and_a_frozen_control_does_not(world_dir, tmp_path):
    start, end, fraction = _train(world_dir, tmp_path / "learn")
    print(f"learning run: eval reward {start:.3f} -> {end:.3f}, {fraction:.0%} of the way to the best")
    c_start, c_end, c_fraction = _train(world_dir, tmp_path / "control", "optimizer.lr=1e-9")
    print(f"control (lr=1e-9): eval reward {c_start:.3f} -> {c_end:.3f}, {c_fraction:.0%}")
    assert c_start == start  # same initial policy, same fixed eval seeds
    assert fraction >= 0.5
    assert not c_fraction >= 0.5  # the same assertion fails without learning
