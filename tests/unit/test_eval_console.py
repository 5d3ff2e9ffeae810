"""The console lines of the in-training evaluation (glm_grpo_ds/evaluation/in_training.py): one per evaluation,
and the closing line's summary of eval.jsonl; `glm-grpo evaluate`'s progress count (runtime/progress_count.py) and
the lines under its table naming the alarms of each adapter's run (evaluation/report.py ``alarm_lines``)."""

import json

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
