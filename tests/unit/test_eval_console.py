"""The console lines of the in-training evaluation (glm_grpo_ds/evaluation/in_training.py): one per evaluation,
and the closing line's summary of eval.jsonl."""

import json

from glm_grpo_ds.evaluation.in_training import eval_line, eval_summary


def test_one_line_per_evaluation_with_each_reward_when_there_are_several():
    record = {
        "step": 20, "eval/reward_mean": 0.51234, "eval/reward/ocr": 0.4, "eval/reward/aesthetic": None,
        "eval/num_prompts": 8, "eval/time": 3.21, "gallery": "samples/eval_step_000020.png",
    }  # fmt: skip
    assert eval_line(record, 4) == (
        "eval at step 20: reward 0.5123 (ocr 0.4000, aesthetic n/a), 8 prompts x 4 samples, 3.2 s; "
        "samples/eval_step_000020.png"
    )
    one = {"step": 0, "eval/reward_mean": 0.25, "eval/reward/mse": 0.25, "eval/num_prompts": 2, "eval/time": 1.0}
    assert eval_line(one, 2) == "eval at step 0: reward 0.2500, 2 prompts x 2 samples, 1.0 s"


def test_the_closing_summary_names_the_first_and_last_eval_reward(tmp_path):
    path = tmp_path / "eval.jsonl"
    assert eval_summary(path) is None
    rows = [{"step": 0, "eval/reward_mean": 0.5}, {"step": 40, "eval/reward_mean": 0.9}, {"step": 80}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert eval_summary(path) == "3 evaluation(s), reward 0.5000 at step 0 -> n/a at step 80"
