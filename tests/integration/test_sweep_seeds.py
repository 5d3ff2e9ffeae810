"""benchmarks/sweep_world.py over seeds (issue #51 item 4b): the interval and paired-difference math against
hand-computed values (no launches), its bad inputs, and a smoke of the real thing: one variant of the tiny world
at 2 seeds x 2 steps (2 real training runs under DeepSpeed ZeRO-3, one CPU rank each, started as the launcher
would by tests/integration/launching.py's spawn_ranks; what 2 ranks compute is tested in test_trainer_deepspeed
and test_world), whose report's per-seed fractions are the runs' own eval.jsonl and whose interval is recomputed
here by hand. The evidence itself (5 seeds x 60 steps) is a benchmark: docs/sweep.md."""

import json
import math

import pytest
from benchmark_scripts import load_benchmark  # noqa: E402  (tests/benchmark_scripts.py)
from launching import spawn_ranks  # noqa: E402  (tests/integration/launching.py)

T975 = {1: 12.706204736174698, 2: 4.302652729749464, 4: 2.7764451051977934}  # t(0.975, df), from tables


sw = load_benchmark("sweep_world")


def test_t_interval_five_values():
    # mean 0.3, sd sqrt(0.1 / 4) = 0.158114, half = 2.776445 x 0.158114 / sqrt(5) = 0.196324
    mean, low, high = sw.t_interval([0.1, 0.2, 0.3, 0.4, 0.5])
    assert mean == pytest.approx(0.3)
    assert (low, high) == pytest.approx((0.103676, 0.496324), abs=1e-6)


def test_t_interval_two_values_and_fewer():
    # sd = 0.0707107, half = 12.706205 x 0.0707107 / sqrt(2) = 0.635310
    assert sw.t_interval([0.8, 0.9]) == pytest.approx((0.85, 0.21469, 1.48531), abs=1e-5)
    mean, low, high = sw.t_interval([0.7])
    assert mean == 0.7 and math.isnan(low) and math.isnan(high)
    assert sw.t_interval([0.4, 0.4, 0.4]) == (pytest.approx(0.4), pytest.approx(0.4), pytest.approx(0.4))


def test_paired_difference_holds_0_or_not():
    # seeds 0-2 in both (seed 3 only in the baseline: left out); diffs +0.05, -0.10, +0.05: mean 0,
    # sd sqrt(0.0075) = 0.0866025, half = 4.302653 x 0.0866025 / sqrt(3) = 0.215133
    d = sw.paired_difference({0: 0.9, 1: 0.8, 2: 0.95}, {0: 0.85, 1: 0.9, 2: 0.9, 3: 0.5})
    assert d["seeds"] == [0, 1, 2] and d["diffs"] == pytest.approx([0.05, -0.1, 0.05])
    assert d["mean"] == pytest.approx(0.0, abs=1e-12)
    assert d["ci"] == pytest.approx([-0.215133, 0.215133], abs=1e-6) and d["holds_0"] is True
    # diffs +0.10, +0.12, +0.11: mean 0.11, sd 0.01, half 4.302653 x 0.01 / sqrt(3) = 0.024842
    d = sw.paired_difference({0: 0.6, 1: 0.62, 2: 0.61}, {0: 0.5, 1: 0.5, 2: 0.5})
    assert d["ci"] == pytest.approx([0.085158, 0.134842], abs=1e-6) and d["holds_0"] is False
    assert sw.paired_difference({0: 0.6}, {0: 0.5})["holds_0"] is None  # one pair: no interval


def _result(variant, lr, seed, fraction, dlogp=1e-3, k3=1e-6):
    return {
        "name": sw.run_name(variant, lr, seed),
        "variant": variant,
        "lr": lr,
        "seed": seed,
        "wall_s": 60.0,
        "eval": [0.5, 0.5 + 0.5 * fraction, 1.0, fraction],
        "mismatch": {"logp_abs_mean": dlogp, "kl_k3": k3},
    }


def test_seed_summary_groups_by_variant_and_lr_and_pairs_at_the_same_lr():
    results = [
        _result("bf16", 3e-3, 0, 0.8, dlogp=1e-3),
        _result("bf16", 3e-3, 1, 0.9, dlogp=3e-3),
        _result("bf16_merged", 3e-3, 0, 0.85, k3=2e-6),
        _result("bf16_merged", 3e-3, 1, 0.75, k3=4e-6),
        _result("bf16", 3e-4, 0, 0.3),
        _result("bf16", 3e-4, 1, 0.5),
        _result("bf16_merged", 3e-4, 1, 0.2),  # one seed: no configuration row, no pair
    ]
    summary = sw.seed_summary(results, "bf16")
    rows = {(c["variant"], c["lr"]): c for c in summary["configurations"]}
    assert list(rows) == [("bf16", 3e-3), ("bf16_merged", 3e-3), ("bf16", 3e-4)]
    assert rows["bf16", 3e-3]["fractions"] == {0: 0.8, 1: 0.9}
    assert rows["bf16", 3e-3]["mean"] == pytest.approx(0.85)
    assert rows["bf16", 3e-3]["ci"] == pytest.approx([0.85 - T975[1] * 0.05, 0.85 + T975[1] * 0.05])
    assert rows["bf16", 3e-3]["logp_abs_mean"] == pytest.approx(2e-3)
    assert rows["bf16_merged", 3e-3]["kl_k3"] == pytest.approx(3e-6)
    [pair] = summary["paired"]
    assert (pair["variant"], pair["baseline"], pair["lr"]) == ("bf16_merged", "bf16", 3e-3)
    assert pair["diffs"] == pytest.approx([0.05, -0.15]) and pair["mean"] == pytest.approx(-0.05)
    # the Markdown: one row per configuration, one per pair, the interval as computed
    md = "\n".join(sw.seed_tables(summary))
    assert "| bf16_merged - bf16 | 0.003 | 2 | 0: +0.050, 1: -0.150 | -0.050 [-1.321, +1.221] | yes |" in md
    assert "| bf16 | 0.0003 | 2 | 0: 0.300, 1: 0.500 | 0.400 [-0.871, 1.671] |" in md


def test_seed_summary_refuses_one_configuration_and_seed_under_two_names():
    twice = [_result("bf16", 3e-3, 0, 0.8), _result("bf16", 3e-3, 1, 0.9), _result("bf16", 3e-3, 0, 0.7)]
    twice[2]["name"] = "bf16_seed0"  # the world's own lr, where the others were run with --lr 3e-3
    with pytest.raises(ValueError, match=r"runs bf16_lr0\.003_seed0 and bf16_seed0 are both bf16 at lr 0\.003, seed 0"):
        sw.seed_summary(twice, "bf16")


def test_run_names_keep_lrs_and_seeds_apart():
    assert sw.run_name("bf16", None, None) == "bf16"  # the single-seed sweep's names, as before
    assert sw.run_name("bf16", 3e-4, 2) == "bf16_lr0.0003_seed2"
    assert sw.run_name("bf16_merged", None, 0) == "bf16_merged_seed0"


@pytest.mark.parametrize(
    "args,words",
    [
        (["--seeds", "0,x"], "--seeds '0,x' is not a comma-separated list of integers"),
        (["--seeds", "1,1"], "give distinct seeds >= 0"),
        (["--lr", "fast"], "--lr 'fast' is not a number"),
        (["--lr", "0"], "--lr '0' must be a positive number"),
        (["--baseline", "bf17"], "unknown run 'bf17'"),
        (["--steps", "1"], "--steps 1 leaves no eval after the first"),
        (["--report-only"], "sweep.json not found"),
    ],
)
def test_bad_inputs_one_line_exit_2_nothing_written(tmp_path, capsys, args, words):
    out = tmp_path / "sweep"
    assert sw.main(["--world", str(tmp_path / "no_world"), "--out", str(out), "--only", "base", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1
    assert not out.exists()


def _forked(args, procs, log):
    """The sweep's runs started without the deepspeed launcher's two Python processes, forked from the parent
    that imported the libraries once (what the script's default launch costs more is not what is tested here)."""
    proc, _ = spawn_ranks(procs, args, timeout=300)
    log.write(proc.stdout + proc.stderr)
    return proc.returncode


def test_smoke_two_seeds(tiny_world, tmp_path):
    """2 real runs: the report's fractions per seed are the runs' own (end - start) / (best - start) of
    eval.jsonl, and its interval the t interval of those two values."""
    out = tmp_path / "sweep"
    quick = ["eval.num_prompts=2", "grpo.group_size=4", "batch.micro_batch_size=4", "logging.plot=false"]
    argv = ["--world", str(tiny_world), "--out", str(out), "--steps", "2", "--procs", "1", "--only", "base"]
    assert sw.main([*argv, "--seeds", "0,1", "--set", *quick], launch=_forked) == 0
    summary = json.loads((out / "sweep_seeds.json").read_text())
    [config] = summary["configurations"]
    assert config["variant"] == "base" and config["lr"] == 3e-3  # the world's lr, read from the run's config
    fractions = {}
    for seed in (0, 1):
        run = out / f"base_seed{seed}"
        assert json.loads((run / "config.json").read_text())["train"]["seed"] == seed
        evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
        assert [e["step"] for e in evals] == [0, 2]
        start, end = evals[0]["eval/reward_mean"], evals[-1]["eval/reward_mean"]
        fractions[str(seed)] = (end - start) / (1.0 - start)  # the world's best reward is 1 for every prompt
    assert config["fractions"] == pytest.approx(fractions)
    a, b = fractions["0"], fractions["1"]
    half = T975[1] * abs(a - b) / 2  # sd = |a - b| / sqrt(2), / sqrt(n = 2)
    assert config["mean"] == pytest.approx((a + b) / 2)
    assert config["ci"] == pytest.approx([(a + b) / 2 - half, (a + b) / 2 + half])
    assert summary["paired"] == []  # no bf16 baseline among the runs
    md = (out / "sweep.md").read_text()
    assert "| base_seed0 |" in md and "| base_seed1 |" in md and "mean fraction [95 % t interval]" in md
    # --report-only rewrites the same report from sweep.json, running nothing
    (out / "sweep.md").unlink()
    assert sw.main([*argv, "--report-only"]) == 0
    assert (out / "sweep.md").read_text() == md
