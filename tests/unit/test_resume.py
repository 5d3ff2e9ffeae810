"""glm_grpo_ds/lifecycle/resume.py: a finished run is left alone, an outdated final_*/ is set aside by its step (never
overwritten), and a changed prompt source is told apart (issue #27). The trainer's use of them:
tests/integration/test_robustness.py::test_resume_from_auto_starts_fresh_then_continues."""

import json

from glm_grpo_ds.data.rows import PromptRow
from glm_grpo_ds.lifecycle.resume import data_changed, data_fingerprint, finished, set_aside_final, write_final_state


def test_finished_only_at_or_past_max_steps():
    assert finished({"step": 4}, 5) is None
    assert "finished at step 5 of max_steps=5" in finished({"step": 5}, 5)


def test_set_aside_names_by_step_and_never_overwrites(tmp_path):
    for expected in ("final_adapter.step3", "final_adapter.step3~1"):
        (tmp_path / "final_adapter").mkdir()
        write_final_state(tmp_path / "final_adapter", 3)
        (tmp_path / "final_adapter" / "w").write_text(expected)
        assert len(set_aside_final(tmp_path, resume_step=3, max_steps=6)) == 1
        assert (tmp_path / expected / "w").read_text() == expected and not (tmp_path / "final_adapter").exists()
    (tmp_path / "final_model").mkdir()  # written before the step was recorded
    set_aside_final(tmp_path, 3, 6)
    assert (tmp_path / "final_model.earlier").is_dir()


def test_max_steps_lowered_below_the_final_weights_sets_them_aside(tmp_path):
    """A checkpoint at or past max_steps writes its own step's final weights at once: those of a later step (no
    checkpoint left of it: save_steps 2, max_steps 3 -> 2) were replaced and lost; its own step's stay (a kill cut
    their writing short, run.py rewrites them in place)."""
    final = tmp_path / "final_adapter"
    final.mkdir()
    write_final_state(final, 3)
    (final / "w").write_text("step 3")
    lines = set_aside_final(tmp_path, resume_step=2, max_steps=2)
    assert lines == [
        "glm-grpo: final_adapter/ (from step 3) moved to final_adapter.step3/: this run ends at step 2, and "
        "final_adapter/ will hold its end"
    ]
    assert (tmp_path / "final_adapter.step3" / "w").read_text() == "step 3" and not final.exists()
    final.mkdir()
    write_final_state(final, 2)
    assert set_aside_final(tmp_path, 2, 2) == [] and final.is_dir()
    (tmp_path / "final_model").mkdir()  # of an unknown step: set aside rather than replaced
    assert len(set_aside_final(tmp_path, 4, 2)) == 2 and (tmp_path / "final_model.earlier").is_dir()


def test_fingerprint_of_a_file_and_of_rows(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("a\nb\n")
    first = data_fingerprint(str(f), ["a", "b"])
    assert data_changed(first, data_fingerprint(str(f), ["a", "b"])) is None
    assert data_changed(None, first) is None  # a checkpoint from before fingerprints
    moved = tmp_path / "moved.txt"
    moved.write_text("a\nb\n")
    assert data_changed(first, data_fingerprint(str(moved), ["a", "b"])) is None  # the same file elsewhere
    f.write_text("a\nc\n")  # same size, other contents
    assert "differs" in data_changed(first, data_fingerprint(str(f), ["a", "c"]))
    rows = [PromptRow(i, f"prompt {i}") for i in range(200)]
    ds = data_fingerprint("org/dataset", rows)
    assert ds == data_fingerprint("org/dataset", list(rows)) and ds["rows"] == 200
    rows[-1] = PromptRow(199, "edited")
    assert data_fingerprint("org/dataset", rows) != ds
    assert json.dumps(ds)  # stored in trainer_state.json


def test_config_changes_list_each_changed_key_and_the_history_grows_by_segment():
    from glm_grpo_ds.lifecycle.resume import changes_line, config_changes, segments

    saved = {"optimizer": {"lr": 1e-5, "name": "adamw"}, "grpo": {"sampler_correction": None}, "resume_from": None}
    now = {"optimizer": {"lr": 2e-5, "name": "adamw"}, "grpo": {"sampler_correction": "tis"}, "resume_from": "latest"}
    changes = config_changes(saved, now)  # resume_from says how the launch starts: not a change
    assert changes == {"grpo.sampler_correction": [None, "tis"], "optimizer.lr": [1e-5, 2e-5]}
    assert config_changes(None, now) == {} and config_changes(saved, saved) == {}
    # a setting added since the checkpoint was saved: that run had its default, so the default is no change
    defaults = {"optimizer": {"lr": 1e-5, "name": "adamw", "fp8": False}, "lora": {"r": 16}}
    newer = {**saved, "optimizer": {**saved["optimizer"], "fp8": False}}
    assert config_changes(saved, newer, defaults) == {}
    assert config_changes(saved, {**newer, "optimizer": {**newer["optimizer"], "fp8": True}}, defaults) == {
        "optimizer.fp8": [False, True]
    }
    # a rewards entry saved before rewards[i].label existed had label "": no change; a label set now is one
    old_rewards = {**saved, "rewards": [{"name": "ocr", "weight": 1.0, "args": {}}]}
    labelled = [{"name": "ocr", "weight": 1.0, "args": {}, "label": ""}]
    assert config_changes(old_rewards, {**saved, "rewards": labelled}) == {}
    renamed = [{**labelled[0], "label": "text"}]
    assert config_changes(old_rewards, {**saved, "rewards": renamed}) == {"rewards": [labelled, renamed]}
    full_ft = {**saved, "lora": None}  # a section held as null stays null: switching to LoRA is a change
    assert config_changes(full_ft, {**saved, "lora": {"r": 16}}, defaults) == {"lora.r": [None, 16]}
    line = changes_line(changes, 40)
    assert line.startswith("glm-grpo: warning: resuming at step 40 with 2 changed setting(s): ")
    assert 'grpo.sampler_correction null -> "tis"; optimizer.lr 1e-05 -> 2e-05. Steps 1-40 ran' in line
    first = segments(None, 0, {})
    assert first == [{"from_step": 0, "changed": {}}]
    second = segments({"segments": first}, 40, changes)
    assert second == [{"from_step": 0, "changed": {}}, {"from_step": 40, "changed": changes}]
    assert segments({"segments": second}, 60, {}) == second  # resumed again without changes
    assert segments({"segments": second}, 20, {}) == first  # resumed from a checkpoint before the change


def test_the_ema_adapter_of_an_earlier_end_is_set_aside_with_the_final_weights(tmp_path):
    """max_steps raised on a finished lora.ema_decay run: final_adapter/ of step 4 was set aside, while
    final_adapter_ema/ of step 4 was replaced by step 6's."""
    from glm_grpo_ds.lifecycle.resume import final_written

    for name in ("final_adapter", "final_adapter_ema"):
        (tmp_path / name).mkdir()
        write_final_state(tmp_path / name, 4)
    assert len(set_aside_final(tmp_path, resume_step=4, max_steps=6)) == 2
    assert (tmp_path / "final_adapter_ema.step4").is_dir() and not (tmp_path / "final_adapter_ema").exists()
    (tmp_path / "final_adapter_ema").mkdir()  # the average is written first: alone, it does not finish a run
    write_final_state(tmp_path / "final_adapter_ema", 6)
    assert not final_written(tmp_path, 6)
