"""`glm-grpo profile bench` end to end on the tiny model (small settings): every phase and every
side-by-side comparison is measured and written to bench.json."""

import json
import math
import sys

import pytest
from launching import run_cmd  # noqa: E402  (tests/integration/launching.py)

# every benchmark, one on 2 ranks; the tools tier (make test-tools, after make test in CI: docs/testing.md)
pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.tools]


def test_bench_writes_every_phase_and_ratio(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "glm_grpo_ds.commands.cli",
        "profile",
        "bench",
        "--size",
        "64",
        "--group-size",
        "4",
        "--steps",
        "1",
        "--repeats",
        "1",
        "--out",
        str(tmp_path),
        "--count-variants",  # the decode_step_counts section: tests/integration/test_decode_counts.py
        "none",
    ]
    proc = run_cmd(cmd, timeout=900)  # forked from the preloaded parent (tests/forkserver.py)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "bench.json").read_text())
    assert "decode_step_counts" not in r
    p = r["phases"]
    for key in (
        "rollout_tokens_per_s",
        "decode_images_per_s",
        "reward_images_per_s",
        "update_tokens_per_s",
        "peak_memory_mb",
        "rollout_ours_tokens_per_s",
        "rollout_pipeline_tokens_per_s",
        "rollout_compiled_tokens_per_s",
        "image_stats_ms",
        "image_stats_over_decode",
    ):
        assert p[key] > 0 and math.isfinite(p[key]), key
    assert r["zero3_rollout_2_ranks"]["world_size"] == 2
    assert set(r["ratios"]) == {
        "rollout_ours_over_pipeline",
        "rollout_compiled_over_pipeline",
        "zero3_gathered_over_sharded",
        "update_peak_mb2_over_mb4",
    }
    assert all(v > 0 for v in r["ratios"].values())
    # a group of 4 in one micro-batch holds more activations than micro-batches of 2
    assert r["update_memory"]["4"]["update_peak_above_start_mb"] > r["update_memory"]["2"]["update_peak_above_start_mb"]
    assert "ZeRO-3 2 ranks: gathered / sharded" in proc.stdout


def test_bench_gathers_counts_fewer_gathers_with_the_reference_in_the_rollout(tiny_model_dir, data64, tmp_path):
    """`glm-grpo profile bench --gathers`: DeepSpeed's comms logger on 2 ZeRO-3 ranks; the reference log-probs in
    the rollout's gather take gathers out of the update, and larger micro-batches gather less. On the session's
    tiny model and 64x64 data (--model / --data; the test above covers the bench building its own)."""
    cmd = [sys.executable, "-m", "glm_grpo_ds.commands.cli", "profile", "bench", "--gathers", "--size", "64"]
    cmd += ["--model", str(tiny_model_dir), "--data", str(data64)]
    cmd += ["--group-size", "4", "--gathers-micro-batches", "2,4", "--out", str(tmp_path)]
    proc = run_cmd(cmd, timeout=900)  # forked from the preloaded parent (tests/forkserver.py)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "bench_gathers.json").read_text())["micro_batches"]
    for m in ("2", "4"):
        before, after = r[m]["before"], r[m]["after"]
        assert 0.9 < before["rollout"] == after["rollout"] <= 1.0  # the whole AR once (small tensors stay whole)
        assert after["update"] < before["update"] and after["step"] == after["rollout"] + after["update"]
    assert r["4"]["after"]["update"] < r["2"]["after"]["update"]
    assert "parameters gathered per step" in proc.stdout
