"""`glm-grpo decode-agreement` on the tiny model: the same token grids decoded by a candidate and by the
reference decode, scored and ranked within each group (the rank math itself: tests/unit/test_rank_agreement.py)."""

import json
import math

import pytest
from in_process import glm_grpo  # noqa: E402  (tests/in_process.py)
from launching import CONFIG, common  # noqa: E402  (tests/integration/launching.py)

SMALL = ["rollout.height=64", "rollout.width=64", "grpo.group_size=4", "batch.micro_batch_size=4"]
TWO_REWARDS = "rewards=[{name: pixel_mse}, {name: ssim, weight: 0.5}]"


@pytest.mark.slow  # reads the shared short training run's adapter
def test_reference_against_itself_agrees_fully_and_a_cheap_decode_is_rated(
    tiny_model_dir, data64, short_run, tmp_path, capfd, cpu_fp8
):
    out = tmp_path / "agreement.json"
    argv = ["decode-agreement", "--config", str(CONFIG), *common(tiny_model_dir, data64, tmp_path / "unused")]
    # an FP8 candidate first: the decoder converts only after the full-precision ones (and the reference) decoded
    argv += [*SMALL, TWO_REWARDS, "--num-prompts", "4", "--candidate", "50:1.5+fp8", "--candidate", "50:1.5"]
    argv += ["--candidate", "1:1.0", "--candidate", "4:1.5:2"]
    argv += ["--adapter", str(short_run / "final_adapter"), "--out", str(out)]
    code, stdout, stderr = glm_grpo(argv, capfd)
    assert code == 0, stderr
    r = json.loads(out.read_text())
    assert (r["groups"], r["group_size"], r["image"]) == (4, 4, [64, 64])
    # no reference given, eval.* null: the pipeline's own decode
    assert (r["reference"]["num_inference_steps"], r["reference"]["guidance_scale"]) == (50, 1.5)
    fp8, same, cheap, early = r["candidates"]
    assert fp8["fp8"] is True and "fp8" not in same and "50 steps, guidance 1.5 fp8" in stdout
    assert (early["num_inference_steps"], early["guidance_scale"], early["guidance_steps"]) == (4, 1.5, 2)
    assert "guidance_steps" not in same and "4 steps, guidance 1.5 x2" in stdout
    assert (same["num_inference_steps"], same["guidance_scale"], cheap["num_inference_steps"]) == (50, 1.5, 1)
    assert set(same["rewards"]) == {"pixel_mse", "ssim", "total"}
    for label, a in same["rewards"].items():  # the same decode, the same noise: identical rankings
        assert a["groups"] == 4 and a["groups_ranked"] == 4, label
        assert a["spearman"] == 1.0 and a["best_same"] == 1.0, label
    # FP8 changed the images and so the rewards (the same decode in full precision moved none)
    assert fp8["rewards"]["pixel_mse"]["max_reward_diff"] > 0 and same["rewards"]["pixel_mse"]["max_reward_diff"] == 0
    for label, a in [*cheap["rewards"].items(), *fp8["rewards"].items()]:
        assert -1 <= a["spearman"] <= 1 and 0 <= a["best_same"] <= 1 and a["groups_ranked"] >= 1, label
    assert all(c["time_ratio"] > 0 and math.isfinite(c["time_ratio"]) for c in (same, cheap, early))
    assert "reference: 50 steps, guidance 1.5" in stdout and "1 step, guidance 1 " in stdout
    assert cheap["saves_time"] == (cheap["time_ratio"] < 1)


def test_bad_decode_settings_are_one_line_exit_2(tiny_model_dir, data64, tmp_path, capfd):
    base = ["decode-agreement", "--config", str(CONFIG), *common(tiny_model_dir, data64, tmp_path / "o"), *SMALL]
    for extra, message in (
        (["--candidate", "8"], "--candidate '8' must be STEPS:GUIDANCE or STEPS:GUIDANCE:GUIDED_STEPS, e.g. 8:1.0"),
        (["--candidate", "8:1.5:2:1"], "--candidate '8:1.5:2:1' must be STEPS:GUIDANCE or"),
        (["--candidate", "8:1.5:9"], "--candidate 8:1.5:9: guidance_steps must be between 1 and num_inference_steps"),
        (["--candidate", "8:1.0:3"], "--candidate 8:1.0:3: guidance_steps=3 limits a guidance that guidance_scale=1"),
        (["decoder.guidance_steps=0"], "decoder.guidance_steps must be between 1 and num_inference_steps (2), got 0"),
        (["--reference", "0:1.5"], "--reference 0:1.5: num_inference_steps must be >= 1, got 0"),
        (["--candidate", "8:1.5+int8"], "--candidate '8:1.5+int8': the only option after '+' is fp8 (e.g. 8:1.5+fp8)"),
        (["--candidate", "8:1.5+fp8", "--device", "meta"], "decoder.fp8=true: FP8 matmuls (e4m3fn) are not supported"),
        (["decoder.attention=fast"], "decoder.attention"),
        (["eval.guidance_scale=0"], "eval.guidance_scale must be > 0 and finite (<= 1: no guidance pass), got 0"),
    ):
        code, _, stderr = glm_grpo(base + extra, capfd)
        lines = stderr.strip().splitlines()
        assert code == 2 and len(lines) == 1 and message in lines[0], (extra, stderr)


STARVED = """import torch
def score(images, prompts, samples):  # torch 2.15's caching allocator's words
    raise torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.23 GiB is "
        "free. Of the allocated memory 70.10 GiB is allocated by PyTorch, and 0.50 GiB is reserved by PyTorch but "
        "unallocated."
    )
"""


def test_out_of_memory_is_one_line_naming_the_phase_and_what_to_change_exit_8(tiny_model_dir, data64, tmp_path, capfd):
    """A reward running out of GPU memory: not a failure of its samples (their agreement would be measured on the
    other reward alone) but the command's end, exit 8, one line: the phase and reward, torch's figures, the
    --num-prompts that scores fewer groups at once; nothing written."""
    plugin = tmp_path / "starved.py"
    plugin.write_text(STARVED)
    out = tmp_path / "agreement.json"
    argv = ["decode-agreement", "--config", str(CONFIG), *common(tiny_model_dir, data64, tmp_path / "unused")]
    argv += [*SMALL, f"rewards=[{{name: pixel_mse}}, {{name: '{plugin}:score', label: judge}}]", "--num-prompts", "2"]
    code, _, stderr = glm_grpo([*argv, "--candidate", "1:1.0", "--reference", "1:1.0", "--out", str(out)], capfd)
    assert code == 8, stderr
    assert stderr.strip().splitlines()[-1] == (
        "glm-grpo decode-agreement: out of GPU memory in the reward phase (reward judge): tried to allocate 2.00 GiB "
        "with 1.23 GiB of 79.15 GiB free; --num-prompts 1 samples and scores half as many groups at once (now 2 of 4 "
        "samples), and measures the agreement on fewer groups; nothing was written"
    )
    assert "Traceback" not in stderr and not out.exists()
