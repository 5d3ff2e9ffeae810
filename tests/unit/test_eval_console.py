"""The console lines of the in-training evaluation (glm_grpo_ds/evaluation/in_training.py): one per evaluation,
and the closing line's summary of eval.jsonl; `glm-grpo evaluate`'s progress count (runtime/progress_count.py) and
the lines under its table naming the alarms and the failed rewards of each adapter's run and the samples the evaluation
left undefined (evaluation/report.py)."""

import json

import torch

from glm_grpo_ds.evaluation.in_training import eval_line, eval_summary


def test_one_line_per_evaluation_with_each_reward_when_there_are_several():
    record = {
        "step": 20, "eval/reward_mean": 0.51234, "eval/reward/ocr": 0.4, "eval/reward/aesthetic": None,
        "eval/reward/ocr_undefined": 0, "eval/reward/aesthetic_undefined": 32,  # counts, not rewards
        "eval/num_prompts": 8, "eval/time": 3.21, "gallery": "samples/eval_step_000020.png",
    }  # fmt: skip
    assert eval_line(record, 4) == (
        "eval at step 20: reward 0.5123 (ocr 0.4000, aesthetic n/a), 8 prompts x 4 samples, 3.2 s; "
        "samples/eval_step_000020.png"
    )
    one = {"step": 0, "eval/reward_mean": 0.25, "eval/reward/mse": 0.25, "eval/num_prompts": 2, "eval/time": 1.0}
    one["eval/reward/mse_undefined"] = 0
    assert eval_line(one, 2) == "eval at step 0: reward 0.2500, 2 prompts x 2 samples, 1.0 s"


def test_the_closing_summary_names_the_first_and_last_eval_reward(tmp_path):
    path = tmp_path / "eval.jsonl"
    assert eval_summary(path) is None
    rows = [{"step": 0, "eval/reward_mean": 0.5}, {"step": 40, "eval/reward_mean": 0.9}, {"step": 80}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert eval_summary(path) == "3 evaluation(s), reward 0.5000 at step 0 -> n/a at step 80"


def test_a_count_in_a_log_is_plain_lines_and_on_a_terminal_a_bar():
    import io

    from glm_grpo_ds.runtime.progress_count import Count

    log = io.StringIO()  # not a terminal
    with Count(6, "evaluate (2 models x 4 samples)", "prompts", stream=log, every_s=3600) as count:
        for _ in range(3):
            count.update(2)
    assert "\r" not in log.getvalue()
    assert log.getvalue().splitlines() == [
        "evaluate (2 models x 4 samples): 6/6 prompts, 00:00, eta 00:00"
    ]  # only the end
    log = io.StringIO()
    with Count(4, "x", "prompts", stream=log, every_s=0) as count:
        count.update(1)
        count.update(3)
    assert [line.split(",")[0] for line in log.getvalue().splitlines()] == ["x: 1/4 prompts", "x: 4/4 prompts"]
    with Count(4, "x", "prompts", stream=io.StringIO(), enabled=False) as count:  # other ranks: nothing
        count.update(4)
        assert count.bar is None and not count.lines

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    with Count(4, "x", "prompts", stream=term) as count:
        count.update(4)
    assert "\r" in term.getvalue() and "4/4" in term.getvalue()  # tqdm's bar


def test_under_the_table_each_adapters_run_alarms_one_line_each_or_none(tmp_path):
    """A run directory written by hand, read as the HTML report reads it (``run_alarms``): its alarm that fired is
    one line with the step, the value and the bound; a clean run says none fired; an adapter with no run beside it
    says so; several adapters are named."""
    from glm_grpo_ds.evaluation.report import alarm_lines, run_alarms

    run = tmp_path / "run"
    (run / "final_adapter").mkdir(parents=True)
    rules = ["dark_fraction > start + 0.25"]
    (run / "config.json").write_text(json.dumps({"train": {"monitor": {"alarms": rules}}}))
    evals = [{"step": s, "eval/images/dark_fraction": d} for s, d in [(0, 0.1), (20, 0.45), (40, 0.2)]]
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    adapter = str(run / "final_adapter")
    assert alarm_lines({"adapter_0": run_alarms(adapter)}) == [
        "alarms: 'dark_fraction > start + 0.25' fired at step 20: dark_fraction 0.45 vs bound 0.35 (start 0.1 at "
        f"step 0); held at step 20, cleared by the end ({run / 'eval.jsonl'})"
    ]
    evals[1]["eval/images/dark_fraction"] = 0.3
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    lone = tmp_path / "lone_adapter"
    lone.mkdir()
    assert alarm_lines({"adapter_0": run_alarms(adapter), "lone": run_alarms(str(lone))}) == [
        "alarms (adapter_0): none fired during training (rules: dark_fraction > start + 0.25)",
        "alarms (lone): unknown, no run records beside the adapter (config.json, eval.jsonl, metrics.jsonl)",
    ]
    assert alarm_lines({}) == []  # the base alone: no line


def test_under_the_table_the_rewards_that_failed_during_each_adapters_run(tmp_path):
    """The run's metrics.jsonl with reward/ocr_failed on two of three steps: one line per failed reward in
    check-run's words (steps, samples, first and last); a run whose rewards never failed and an adapter with no run
    beside it add no line (the alarms' line already says the run was not found)."""
    from glm_grpo_ds.evaluation.report import reward_failure_lines, run_reward_failures

    run = tmp_path / "run"
    (run / "final_adapter").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"train": {"rewards": [{"name": "ocr"}]}}))
    steps = [
        {"step": 1, "reward/ocr_failed": 0},
        {"step": 2, "reward/ocr_failed": 16},
        {"step": 3, "reward/ocr_failed": 4},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    adapter = str(run / "final_adapter")
    found = run_reward_failures(adapter)
    assert found["failed"] == {"ocr": [[2, 16], [3, 4]]} and found["steps"] == 3
    assert reward_failure_lines({"adapter_0": found}) == [
        "reward failures during training: ocr: 20 samples undefined by failures in 2 of 3 steps (steps 2-3; "
        "reward/ocr_failed in metrics.jsonl, the reason in logs/)"
    ]
    json.loads(json.dumps(found))  # evaluate.json holds it as it is
    steps[1]["reward/ocr_failed"] = steps[2]["reward/ocr_failed"] = 0
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    lone = tmp_path / "lone_adapter"
    lone.mkdir()
    assert run_reward_failures(str(lone)) is None
    assert reward_failure_lines({"adapter_0": run_reward_failures(adapter), "lone": None}) == []


def test_under_the_table_the_samples_this_evaluation_left_undefined():
    """A reward that returned NaN on 3 of the adapter's 8 samples (and 1 of the base's): the table says so, with
    both counts; the base-only table says its own; rewards defined everywhere add no line."""
    from glm_grpo_ds.evaluation.report import base_table, table
    from glm_grpo_ds.evaluation.stats import paired_summary

    nan = float("nan")
    base = torch.tensor([[0.1, 0.2], [nan, 0.4], [0.5, 0.6], [0.7, 0.8]])
    model = torch.tensor([[nan, 0.3], [nan, 0.5], [0.6, nan], [0.8, 0.9]])
    summary = {
        "adapter_0": {
            "path": "run/final_adapter",
            "rewards": {
                "ocr": {**paired_summary(base, model), "trained_on": True},
                "mse": {**paired_summary(torch.zeros(4, 2), torch.ones(4, 2)), "trained_on": False},
            },
            "categories": {},
        }
    }
    lines = [line for line in table(summary).splitlines() if line.startswith("undefined")]
    assert lines == [
        "undefined: ocr on 1 of 8 base samples and 3 of 8 adapter_0 samples (the reward raised or returned NaN: its "
        "warning above; a rerun scores a batch it raised on again); left out under both"
    ]
    assert [
        line for line in base_table({"ocr": base, "mse": torch.zeros(4, 2)}).splitlines() if "undefined" in line
    ] == [
        "undefined: ocr on 1 of 8 samples (the reward raised or returned NaN: its warning above; a rerun scores a "
        "batch it raised on again); left out of its mean"
    ]
