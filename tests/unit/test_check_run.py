"""`glm-grpo check-run`'s verdicts on a run directory written here by hand (the real run: tests/integration/
test_gpu_check.py): the parity tolerance follows the dtype verify-logprobs names, a CPU peak over the plan is a
WARN (not a PASS wording), and a directory that is not a run is one line, exit 2."""

import json

from glm_grpo_ds.commands.check_run import main

MIB = 2**20


def _run(tmp_path, update_peak_mb: float):
    out = tmp_path / "run"
    out.mkdir()
    row = {"step": 1, "loss": 0.1, "skipped": 0, "first_iteration_ratio_min": 1.0, "first_iteration_ratio_max": 1.0}
    row.update({"peak_rss_mb": 900.0, "memory/update_peak_mb": update_peak_mb, "memory/before_load_mb": 0.0})
    (out / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    plan = {
        "components": {"weights": 90 * MIB},
        "persistent": ["weights"],
        "phases": {"rollout": 0, "decode": 0, "reward": 0, "update": 10 * MIB, "step": 0},
        "total_bytes": 100 * MIB,
    }
    (out / "memory_plan.json").write_text(json.dumps(plan))
    return out


def _verify(tmp_path, diff: float, dtype: str):
    path = tmp_path / f"verify_{dtype}.txt"
    result = f"max_abs_diff={diff:.3e} mean_abs_diff=1.000e-05 nonfinite_logprobs=0"
    path.write_text(f"{result}\nOK: within tolerance 1.0e+00 ({dtype}, attn=sdpa)\n")
    return str(path)


def test_the_parity_tolerance_is_the_dtypes_and_a_cpu_peak_over_the_plan_warns(tmp_path, capsys):
    out = _run(tmp_path, update_peak_mb=116.0)  # 16 % over the plan's 100 MiB
    assert main([str(out), "--verify", _verify(tmp_path, 1e-3, "fp32")]) == 1  # fp32: 1e-4
    lines = capsys.readouterr().out.splitlines()
    assert "FAIL  sampler vs trainer parity: max_abs_diff 1.000e-03 (tolerance 1e-04: fp32), non-finite 0" in lines
    warn = next(line for line in lines if "update peak" in line)
    assert warn.startswith("WARN  update peak vs planner: measured 0.11 GiB vs planned 0.10 GiB (116%)"), warn
    assert warn.endswith("over the plan") and not any("<= planner" in line for line in lines)
    assert main([str(out), "--verify", _verify(tmp_path, 1e-3, "bf16")]) == 0  # bf16: 5e-2; a WARN is no failure
    assert "PASS  sampler vs trainer parity: max_abs_diff 1.000e-03 (tolerance 5e-02: bf16)" in capsys.readouterr().out
    assert main([str(out), "--verify", _verify(tmp_path, 1e-3, "fp32"), "--parity-tolerance", "1e-2"]) == 0


def test_a_directory_that_is_not_a_run_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "typo")]) == 2
    err = capsys.readouterr().err
    assert err == f"glm-grpo check-run: {tmp_path / 'typo'} is not a directory; give a training run's output_dir\n"
    assert main([str(tmp_path)]) == 2
    assert "holds no metrics.jsonl: not a training run's output_dir" in capsys.readouterr().err
