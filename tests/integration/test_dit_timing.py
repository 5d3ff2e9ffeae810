"""`glm-grpo profile dit-timing` on the tiny pipeline (CPU, real components): the reference against itself, a lossless
attention kernel, FP8 linears, a GPU-only kernel skipped with its reason, and bad input refused before any model
loads."""

import json
import math

import pytest
import torch

from glm_grpo_ds.decoder.fp8 import fp8_supported
from glm_grpo_ds.profiling import dit_timing


def test_times_and_compares_the_variants(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "x.json"
    argv = ["--model", str(tiny_model_dir), "--variants", "sdpa,sdpa_math,fp8,sdpa_cudnn", "--batch", "2"]
    # --steps 1,4, fastest of 3: three steps' difference (~10 ms) above most of a loaded CPU's noise (1,2: ~3 ms)
    argv += ["--size", "64", "--steps", "1,4", "--repeats", "3", "--device", "cpu", "--out", str(out)]
    assert dit_timing.main(argv) == 0
    m = json.loads(out.read_text())
    assert (m["device"], m["dtype"], m["steps"], m["batch"]) == ("cpu", "float32", [1, 4], 2)
    # torch 2.11's CPU (the floor's) has no per-row FP8 product: the variant is skipped with the reason, not failed
    no_fp8 = fp8_supported(torch.device("cpu"))
    assert list(m["variants"]) == ["sdpa", "sdpa_math"] + ([] if no_fp8 else ["fp8"]) and m["failed"] == {}
    ref, exact = m["variants"]["sdpa"], m["variants"]["sdpa_math"]
    assert ref["max_abs_diff"] == 0 and ref["psnr_db"] is None and ref["speedup_vs_sdpa"] == 1  # inf: strict JSON null
    assert exact["max_abs_diff"] < 1e-4  # the same attention, other kernel: float rounding only (null PSNR: equal)
    if no_fp8:
        assert m["skipped"]["fp8"] == f"decoder.fp8=true: {no_fp8}; set decoder.fp8=false"
    else:
        fp8 = m["variants"]["fp8"]
        assert fp8["max_abs_diff"] > 0 and math.isfinite(fp8["psnr_db"])
        assert fp8["psnr_db"] < (exact["psnr_db"] or math.inf)
        assert fp8["dit_bytes"] < ref["dit_bytes"] == exact["dit_bytes"]  # 1-byte weights in the blocks' linears
    for r in m["variants"].values():
        # not its sign: a difference of two CPU timings is a benchmark's figure, not a test's (load makes it noise)
        t1, t4 = r["seconds"]["1"], r["seconds"]["4"]
        assert math.isclose(r["s_per_image_step"], (t4 - t1) / (3 * 2)) and min(t1, t4) > 0
        assert r["setup_s"] > 0 and r["dit_bytes"] > 0 and r["peak_bytes"] is None
    assert "CUDA" in m["skipped"]["sdpa_cudnn"]
    printed = capsys.readouterr().out
    assert "DiT decode on cpu" in printed and "skipped sdpa_cudnn:" in printed
    assert ("skipped fp8:" if no_fp8 else "\nfp8 ") in printed


def test_the_report_is_written_after_each_variant(tiny_model_dir, tmp_path):
    """A lease's budget may stop the run between variants (launch/gpu_timing.sh's part 3): --out is rewritten after
    each variant, its pending ones named, so the variants timed are kept; the docs region says which were not run."""
    from glm_grpo_ds.memory.timing_docs import dit_region

    argv = ["--model", str(tiny_model_dir), "--variants", "sdpa,sdpa_math,sdpa_cudnn", "--batch", "1"]
    a = dit_timing.parse_args([*argv, "--size", "64", "--steps", "1,2", "--repeats", "1", "--device", "cpu"])
    dit_timing.check_args(a)
    seen = []
    final = dit_timing.measure(a, on_variant=lambda m: seen.append(json.loads(json.dumps(dit_timing._strict(m)))))
    assert [(list(m["variants"]), list(m["skipped"]), m["pending"]) for m in seen] == [
        (["sdpa"], [], ["sdpa_math", "sdpa_cudnn"]),
        (["sdpa", "sdpa_math"], [], ["sdpa_cudnn"]),
        (["sdpa", "sdpa_math"], ["sdpa_cudnn"], []),  # no CUDA here: skipped, said
    ]
    assert final["pending"] == [] and list(final["variants"]) == ["sdpa", "sdpa_math"]
    cut = dit_region(seen[0], tmp_path / "dit_timing.json")
    assert "- not run (stopped): `sdpa_math`, `sdpa_cudnn`" in cut
    assert "not run" not in dit_region(seen[-1], tmp_path / "dit_timing.json")


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--variants", "sdpa,warp_drive", "'warp_drive'"),
        ("--steps", "3,1", "--steps '3,1'"),
        ("--size", "100", "--size 100"),
        ("--guidance", "1.0", "--guidance 1"),
        ("--batch", "0", "--batch 0"),
        ("--repeats", "0", "--repeats 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_model_dir, tmp_path, capsys, flag, value, named):
    out = tmp_path / "x.json"
    argv = ["--model", str(tiny_model_dir), "--device", "cpu", "--out", str(out), flag, value]
    assert dit_timing.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("glm-grpo profile dit-timing: ") and named in err and len(err.splitlines()) == 1
    assert not out.exists()
