"""The planned time of a step (glm_grpo_ds/memory/step_time.py) by hand from its H200 anchors: the image decode
counted at the config's size, steps and guidance, the rollout at the config's decode-step variant, the update at
its ZeRO stage; and the measured full-size step it must reproduce."""

from pathlib import Path

import pytest

from glm_grpo_ds.config import load_config
from glm_grpo_ds.memory.plan import grid_tokens
from glm_grpo_ds.memory.step_time import describe, step_time

ROOT = Path(__file__).resolve().parents[2]


def cfg(config="launch/configs/glm_image_lora_zero3.yaml", *overrides):
    return load_config(ROOT / config, list(overrides))


def test_decode_is_images_x_steps_x_the_guided_image_step_scaled_by_latent_tokens():
    t = step_time(cfg(), 2, grid_tokens(1024, 1024))  # G=16, 30 steps, guidance 1.5, 1024x1024
    assert t.decode_s == pytest.approx(16 * 30 * 0.289)
    unguided = step_time(cfg("launch/configs/glm_image_lora_zero3.yaml", "decoder.guidance_scale=1.0"), 2, 1280)
    assert unguided.decode_s == pytest.approx(16 * 30 * 0.289 / 2)  # one DiT forward a step instead of two
    small = step_time(
        cfg("launch/configs/glm_image_lora_zero3.yaml", "rollout.height=512", "rollout.width=512"), 2, 320
    )
    assert small.decode_s == pytest.approx(16 * 30 * 0.289 / 4)  # a quarter of the latent tokens
    assert small.rollout_s == pytest.approx(320 * 19.3 / 1000)


def test_rollout_follows_the_variant_and_update_the_stage():
    plain = step_time(cfg("launch/configs/glm_image_lora_zero3.yaml", "rollout.cuda_graph=false"), 3, 1280)
    assert plain.rollout_s == pytest.approx(1280 * 75.7 / 1000)  # the eager loop, LoRA unmerged
    fast = step_time(
        cfg("launch/configs/glm_image_lora_zero3.yaml", "rollout.merge_lora=true", "rollout.compile=true"), 3, 1280
    )
    assert fast.rollout_s == pytest.approx(1280 * 9.4 / 1000)
    assert plain.update_s == pytest.approx(20.2) and step_time(cfg(), 2, 1280).update_s == pytest.approx(4.85)
    full = step_time(cfg("launch/configs/glm_image_full_zero3.yaml"), 3, 1280)
    assert full.update_s is None and "full fine-tuning: not measured" in describe(full)


def test_the_measured_full_size_step_is_reproduced():
    # H200, GLM-Image at full size, ZeRO-2, G=16, 1024x1024, 8 guided DiT steps, merged + graph + compiled layers:
    # 58.2 s = rollout 15.4 (a first compile of ~3-4 s in it) + decode 37.0 + update 5.6
    t = step_time(
        cfg(
            "launch/configs/gpu_check.yaml",
            "grpo.group_size=16",
            "decoder.num_inference_steps=8",
            "decoder.guidance_scale=1.5",
            "rollout.merge_lora=true",
            "rollout.compile=true",
        ),
        2,
        grid_tokens(1024, 1024),
    )
    assert t.decode_s == pytest.approx(37.0, abs=0.1)
    assert 0.75 * 58.2 <= t.total_s <= 58.2
    assert "image decode 37.0 s" in describe(t) and "not counted: rewards" in describe(t)
