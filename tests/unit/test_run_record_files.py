"""A run's record files survive a failure while they are rewritten, and a broken one is one line naming it:
metrics.jsonl's records kept by a resume are rewritten in one rename (runtime/atomic_files.py), config.json is read
by observability/records.read_run_record."""

import json

import pytest

from glm_grpo_ds.lifecycle.checkpoint import OutputDirError
from glm_grpo_ds.observability import records
from glm_grpo_ds.observability.records import MetricsWriter, read_metrics, read_run_record


def test_a_failure_while_a_resume_rewrites_the_kept_records_leaves_the_file_whole(tmp_path, monkeypatch):
    writer = MetricsWriter(tmp_path, True)
    for step in range(1, 6):
        writer.write({"step": step, "loss": step / 10})
    writer.close()
    before = (tmp_path / "metrics.jsonl").read_text()
    real, calls = json.dumps, []

    def fails_on_the_third(*args, **kwargs):  # the disk full, a signal: anything raising mid-rewrite
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(records.json, "dumps", fails_on_the_third)
    with pytest.raises(OSError):
        MetricsWriter(tmp_path, True, resume_step=4)
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_text() == before  # it truncated the file, then wrote 2 of the 4 records
    writer = MetricsWriter(tmp_path, True, resume_step=4)
    writer.write({"step": 5, "loss": 0.55})
    writer.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"train": {"seed": 1}, "segm', "cannot be read as a glm-grpo run record"),
        ('{"_name_or_path": "x"}', "no train"),
    ],
)
def test_a_broken_run_record_is_one_line_naming_it(tmp_path, text, message):
    assert read_run_record(tmp_path) is None
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(OutputDirError, match=rf"{tmp_path}/config.json .*{message}") as err:
        read_run_record(tmp_path)
    assert "\n" not in str(err.value)
