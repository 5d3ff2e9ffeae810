"""What a decode step launches, counted (glm_grpo_ds/profiling/decode_counts.py, `glm-grpo profile bench`'s
decode_step_counts): counts are deterministic, so they are asserted exactly; timings are reported, never asserted.

The eager loops are counted as bench's worker counts them (2 and 4 layers of the tiny configuration, here G=2,
64², 2 rounds, the result through JSON): ~10 s on 2 cores. The compiled step is counted once, at 2 layers: a
whole-step compile, ~10 s on 2 idle cores from a cold inductor cache, ~30 s on busy ones (marked slow).
"""

import json

import pytest
import torch

from glm_grpo_ds.profiling import decode_counts as dc

LAYERS = ("2", "4")


@pytest.fixture(scope="module")
def counts():
    r = dc.decode_counts((2, 4), ("eager", "merged", "plain"), group_size=2, size=64, steps=8, threads=1, rounds=2)
    return json.loads(json.dumps(r))  # as bench's worker hands it over


def test_merged_step_launches_the_plain_models_kernels_and_modules(counts):
    """LoRA merged, a decode step is the plain model's (the same AR built without peft): the same aten ops, one
    by one, and the same module calls."""
    merged, plain = counts["variants"]["merged"], counts["variants"]["plain"]
    for n in LAYERS:
        assert merged["kernels"][n] == plain["kernels"][n] > 0
        assert merged["module_calls"][n] == plain["module_calls"][n] > 0
    assert merged["ops"] == plain["ops"]
    assert counts["checks"]["merged_kernels_equal_plain"] and counts["checks"]["merged_module_calls_equal_plain"]
    assert counts["checks"]["counts_repeat"]  # deterministic: both rounds counted the same


def test_eager_lora_step_launches_more_kernels_than_merged(counts):
    """peft's wrapper runs each adapted linear's two adapter matmuls (and a scale and an add) on top of the base
    matmul: at least 2 kernels more per adapted linear, and more module calls."""
    eager, merged = counts["variants"]["eager"], counts["variants"]["merged"]
    for n in LAYERS:
        lora_layers = counts["lora_layers"][n]
        assert lora_layers == 6 * int(n)  # q, k, v, o, and the MLP's two projections of every layer
        assert eager["kernels"][n] - merged["kernels"][n] >= 2 * lora_layers
        assert eager["module_calls"][n] > merged["module_calls"][n]
        assert eager["python_calls"][n] > merged["python_calls"][n]
    # linear in the layer count: the extrapolation to 40 layers is the per-layer difference times 38
    per_layer = eager["per_layer"]["kernels"]
    assert eager["kernels"]["40"] == eager["kernels"]["2"] + 38 * per_layer


def test_decode_loops_never_read_back_to_the_host(counts):
    for name in ("eager", "merged", "plain"):
        for n in LAYERS:
            assert counts["variants"][name]["host_syncs"][n] == 0, name


def test_the_counter_sees_a_host_sync_and_skips_views():
    x = torch.arange(6.0)
    with dc.counting() as c:
        x.view(2, 3).t().sum().item()
    assert c["host_syncs"] == 1
    assert "aten.view.default" not in c["ops"] and "aten.t.default" not in c["ops"]
    assert c["ops"]["aten.sum.default"] == 1


@pytest.mark.slow
def test_compiled_step_has_no_host_syncs_module_calls_or_the_eager_kernel_count(counts):
    """The whole step compiled (rollout.compile, compile_scope=step) and merged: its kernels are inductor's fused
    ones and the extern matmuls / attention, fewer than the merged eager step's; nothing reads back to the host."""
    policy, rows, positions, grid, sampling = dc.setup(2, 2, 64)
    r = dc.count_step(policy, rows, positions, grid, sampling, "compiled_step", steps=0)  # untimed: one compile
    assert r["host_syncs"] == 0 and r["module_calls"] == 0
    assert 0 < r["kernels"] < counts["variants"]["merged"]["kernels"]["2"]
    assert r["ops"].get("inductor kernel", 0) > 0  # the generated kernels are counted


def test_table_prints_every_count_and_the_check(counts):
    table = dc.format_counts(counts)
    for label in ("kernels @2", "module calls @2", "python calls @2", "host syncs @2", "tokens/s @2", "@40*"):
        assert label in table
    assert "merged == the plain model (no peft): kernels yes, module calls yes" in table


def test_bench_takes_the_sections_loops_or_none():
    from glm_grpo_ds.profiling.bench import parse_args
    from glm_grpo_ds.profiling.bench_workers import WORKERS, worker_decode_counts

    assert WORKERS["decode-counts"] is worker_decode_counts

    assert parse_args([]).count_variants == ",".join(dc.VARIANTS)
    assert parse_args(["--count-variants", "none"]).count_variants == ""
    with pytest.raises(SystemExit):
        parse_args(["--count-variants", "eager,graph"])
