"""`glm-grpo check-run`'s verdicts on a run directory written here by hand (the real run: tests/integration/
test_gpu_check.py): the parity tolerance follows the dtype verify-logprobs names, a CPU's peaks against the plan
are one INFO line (reported, not judged: no PASS wording, no WARN every CPU run would print), an image-statistics
alarm that fired is a WARN line with its step, value and bound (exit 0: a WARN is no failure), and a directory
that is not a run is one line, exit 2."""

import json

from glm_grpo_ds.commands.check_run import main

MIB = 2**20


def _run(tmp_path, update_peak_mb: float, before_load_mb: float = 0.0):
    out = tmp_path / "run"
    out.mkdir()
    row = {"step": 1, "loss": 0.1, "skipped": 0, "first_iteration_ratio_min": 1.0, "first_iteration_ratio_max": 1.0}
    row.update({"peak_rss_mb": 900.0, "memory/update_peak_mb": update_peak_mb, "memory/before_load_mb": before_load_mb})
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


def test_the_parity_tolerance_is_the_dtypes_and_a_cpu_peak_is_one_info_line(tmp_path, capsys):
    out = _run(tmp_path, update_peak_mb=116.0)  # 16 % over the plan's 100 MiB
    assert main([str(out), "--verify", _verify(tmp_path, 1e-3, "fp32")]) == 1  # fp32: 1e-4
    lines = capsys.readouterr().out.splitlines()
    assert "FAIL  sampler vs trainer parity: max_abs_diff 1.000e-03 (tolerance 1e-04: fp32), non-finite 0" in lines
    # the phases and the whole run's peak, reported once, as INFO: a CPU run prints no WARN of its own
    cpu = [line for line in lines if "planned" in line]
    assert cpu == [
        "INFO  not judged on a CPU: peak vs planner, measured / planned: update 0.11 / 0.10 GiB (116%), whole run "
        "0.88 / 0.10 GiB (900%); a CPU's resident set holds the interpreter and libraries that the plan (a GPU's) "
        "leaves out, so on a GPU these are PASS / FAIL"
    ], lines
    assert not any(line.startswith("WARN") for line in lines)
    assert main([str(out), "--verify", _verify(tmp_path, 1e-3, "bf16")]) == 0  # bf16: 5e-2; a WARN is no failure
    assert "PASS  sampler vs trainer parity: max_abs_diff 1.000e-03 (tolerance 5e-02: bf16)" in capsys.readouterr().out
    assert main([str(out), "--verify", _verify(tmp_path, 1e-3, "fp32"), "--parity-tolerance", "1e-2"]) == 0


def test_on_a_cpu_the_whole_runs_plan_counts_the_process_before_load_as_each_phases_does(tmp_path, capsys):
    """A CPU's phases were planned with the process's size before the models loaded, the whole run without it: the
    same line read `update 1.03 / 0.89 GiB (115%), whole run 1.03 / 0.02 GiB (6362%)`."""
    out = _run(tmp_path, update_peak_mb=800.0, before_load_mb=700.0)
    main([str(out)])
    line = next(line for line in capsys.readouterr().out.splitlines() if "planned" in line)
    assert "update 0.78 / 0.78 GiB (100%), whole run 0.88 / 0.78 GiB (112%)" in line, line


def test_an_alarm_that_fired_is_a_warn_with_its_step_value_and_bound(tmp_path, capsys):
    """The run's image statistics (no evaluations: its training steps were checked) and its config.json's rules:
    the rule that fired is a WARN line (exit 0), the one that did not is not named; none fired is one INFO line."""
    out = _run(tmp_path, update_peak_mb=90.0)
    rules = ["dark_fraction > start + 0.25", "bright_fraction > start + 0.25"]
    (out / "config.json").write_text(json.dumps({"train": {"monitor": {"alarms": rules}}}))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [{**rows[0], "step": step, "images/dark_fraction": dark, "images/bright_fraction": 0.2} for step, dark in
            [(1, 0.1), (2, 0.5), (3, 0.6)]]  # fmt: skip
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("WARN")] == [
        "WARN  image-statistics alarm: 'dark_fraction > start + 0.25' fired at step 2: dark_fraction 0.5 vs bound "
        f"0.35 (start 0.1 at step 1); held at steps 2, 3, still holding at the end; look at {out / 'samples'}/"
    ]
    rows = [{**r, "images/dark_fraction": 0.1} for r in rows]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"INFO  image-statistics alarms: none fired (rules: {'; '.join(rules)})" in lines
    assert not any(line.startswith("WARN") for line in lines)


def test_a_reward_that_raised_is_a_warn_with_how_many_samples_and_where(tmp_path, capsys):
    """A remote reward down for two steps: the run trained them on its other rewards, which the console said once;
    check-run says it again (exit 0: a WARN is no failure), and one INFO line when no reward raised."""
    out = _run(tmp_path, update_peak_mb=90.0)
    row = json.loads((out / "metrics.jsonl").read_text())
    failed = {1: 0, 2: 16, 3: 8, 4: 0}
    rows = [{**row, "step": s, "reward/remote_failed": n, "reward/pixel_mse_failed": 0} for s, n in failed.items()]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([str(out)]) == 0
    warns = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARN")]
    assert warns == [
        "WARN  reward failures: remote: 24 samples undefined by failures in 2 of 4 steps (steps 2-3; "
        "reward/remote_failed in metrics.jsonl, the reason in logs/)"
    ]
    (out / "metrics.jsonl").write_text("".join(json.dumps({**r, "reward/remote_failed": 0}) + "\n" for r in rows))
    assert main([str(out)]) == 0
    assert "INFO  reward failures: no reward raised" in capsys.readouterr().out.splitlines()


def test_a_directory_that_is_not_a_run_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "typo")]) == 2
    err = capsys.readouterr().err
    assert err == f"glm-grpo check-run: {tmp_path / 'typo'} is not a directory; give a training run's output_dir\n"
    assert main([str(tmp_path)]) == 2
    assert "holds no metrics.jsonl: not a training run's output_dir" in capsys.readouterr().err


def _gpu_rows(out, peaks: dict[int, float]):
    rows = []
    for step, peak in peaks.items():
        row = {"step": step, "loss": 0.1, "skipped": 0, "first_iteration_ratio_min": 1.0}
        row.update(first_iteration_ratio_max=1.0, peak_gpu_memory_mb=peak, **{"memory/update_peak_mb": peak})
        rows.append(row)
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_run_that_died_early_fails_and_one_iteration_does_not_pass_the_ratio(tmp_path, capsys):
    """A run that stopped at step 3 of 10 (out of memory: the failed step writes no record) passed every check;
    at grpo.num_iterations=1 the first-iteration ratio is the update's own log-probs over themselves: 1 whatever the
    math, so a PASS there tested nothing."""
    out = _run(tmp_path, update_peak_mb=90.0)
    _gpu_rows(out, {1: 80.0, 2: 80.0, 3: 80.0})
    (out / "config.json").write_text(json.dumps({"train": {"max_steps": 10, "grpo": {"num_iterations": 1}}}))
    assert main([str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "FAIL  run complete: last step 3 of max_steps=10" in lines
    assert any(line.startswith("INFO  ratio 1 on the first iteration: ") for line in lines), lines
    (out / "config.json").write_text(json.dumps({"train": {"max_steps": 3, "grpo": {"num_iterations": 2}}}))
    assert main([str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "PASS  run complete: last step 3 of max_steps=3" in lines
    assert "PASS  ratio 1 on the first iteration: first-iteration ratio in [1.0, 1.0] over all steps" in lines
    # one iteration in two mini-batches: the old log-probs come from a pass of their own, so the ratio tests them
    train = {"max_steps": 3, "grpo": {"num_iterations": 1}, "batch": {"mini_batches": 2}}
    (out / "config.json").write_text(json.dumps({"train": train}))
    assert main([str(out)]) == 0
    assert "PASS  ratio 1 on the first iteration: first-iteration ratio in [1.0, 1.0] over all steps" in (
        capsys.readouterr().out.splitlines()
    )


def test_the_peaks_are_judged_against_the_plan_of_the_cluster_shape_they_ran_on(tmp_path, capsys):
    """memory_plan.json is the last launch's: a run resumed from 1 GPU at ZeRO-2 onto 8 at ZeRO-3 failed its check
    on the first launch's peaks (150 MiB against the new plan's 100)."""
    out = _run(tmp_path, update_peak_mb=90.0)
    _gpu_rows(out, {1: 150.0, 2: 150.0, 3: 80.0, 4: 80.0})
    segments = [
        {"from_step": 0, "changed": {}},
        {"from_step": 2, "changed": {"world_size": [1, 8], "zero_stage": [2, 3]}},
    ]
    (out / "config.json").write_text(json.dumps({"train": {"max_steps": 4}, "segments": segments}))
    assert main([str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("PASS  measured peak <= planner: measured 0.08 GiB") for line in lines), lines
    segments[1]["changed"] = {"optimizer.lr": [1e-5, 2e-5]}  # a setting, not the shape: every step counts
    (out / "config.json").write_text(json.dumps({"train": {"max_steps": 4}, "segments": segments}))
    assert main([str(out)]) == 1


def test_progress_refuses_a_window_below_one(tmp_path):
    """--window 0 divided by zero (a traceback, exit 1 like a --min-fraction failure)."""
    import pytest

    from glm_grpo_ds.commands.progress import run_progress

    (tmp_path / "config.json").write_text(json.dumps({"train": {"data": {"train_file": "x"}}}))
    (tmp_path / "best.json").write_text('{"best": {}}')
    with pytest.raises(ValueError, match="--window 0: give the steps averaged at each end, 1 or more"):
        run_progress(tmp_path, tmp_path / "best.json", 0)


def test_progress_names_a_best_file_that_is_not_one_and_its_shape(tmp_path, capsys):
    """--best given the prompt file (a user's natural mistake) said "Expecting value: line 1 column 1 (char 0)"."""
    from glm_grpo_ds.commands.progress import main

    (tmp_path / "config.json").write_text(json.dumps({"train": {"data": {"train_file": "x"}}}))
    shape = '{"best": {"<prompt>": <best reward>, ...}} (glm-grpo tiny-world writes one for the tiny world)'
    for name, text, why in [
        ("prompts.txt", "a red apple\n", "is not a best.json (JSONDecodeError): it holds "),
        ("list.json", "[1, 2]", "is not a best.json (AttributeError): it holds "),
        ("other.json", '{"best": {"a": "high"}}', "has no best rewards: it holds "),
    ]:
        (tmp_path / name).write_text(text)
        assert main([str(tmp_path), "--best", str(tmp_path / name)]) == 2
        assert capsys.readouterr().err == f"glm-grpo progress: --best {tmp_path / name} {why}{shape}\n"
