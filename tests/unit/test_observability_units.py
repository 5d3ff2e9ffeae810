"""Pure pieces of the run outputs: gallery layout, progress lines, plot, eval sharding, logging / eval
config validation (the trackers: test_tracking.py)."""

import io
import json

import numpy as np
import pytest
import torch

from glm_grpo_ds.config import ConfigError, load_config
from glm_grpo_ds.data import PromptRow
from glm_grpo_ds.observability import gallery
from glm_grpo_ds.observability.metrics import Progress
from glm_grpo_ds.observability.records import MetricsWriter

BASE = ["model.path=/m", "data.train_file=/d.jsonl", "rewards=[{name: pixel_mse}]"]


@pytest.mark.parametrize(
    "h,w,max_side,expected",
    [(64, 64, 128, (64, 64)), (1024, 1024, 128, (128, 128)), (1024, 512, 128, (128, 64)), (96, 64, 48, (48, 32))],
)
def test_thumbnail_size_keeps_aspect_and_never_upscales(h, w, max_side, expected):
    assert gallery.thumbnail_size(h, w, max_side) == expected
    assert tuple(gallery.thumbnails(torch.rand(2, 3, h, w), max_side).shape) == (2, 3, *expected)


def test_thumbnails_are_uint8_and_exact_when_not_resized():
    images = torch.rand(3, 3, 32, 48)
    t = gallery.thumbnails(images, 64)
    assert t.dtype == torch.uint8 and torch.equal(t, (images * 255).round().to(torch.uint8))


def test_grid_pixel_size_rows_by_cols_by_tile():
    rows, cols, h, w = 3, 4, 40, 56
    g = gallery
    thumbs = torch.randint(0, 256, (rows * cols, 3, h, w), dtype=torch.uint8)
    img = g.make_grid(thumbs, ["a prompt"] * rows, [f"r={i}" for i in range(rows * cols)], cols)
    row_h = g.LINE_H + h + g.CAPTION_H + g.GUTTER  # a short prompt: one line
    assert img.size == g.grid_size(rows, cols, h, w) == (g.GUTTER + cols * (w + g.GUTTER), g.GUTTER + rows * row_h)
    # tile (row 1, col 2) is pasted unchanged below its row's prompt, a gutter from its neighbours
    top, left = g.GUTTER + 1 * row_h + g.LINE_H, g.GUTTER + 2 * (w + g.GUTTER)
    tile = torch.from_numpy(np.array(img.crop((left, top, left + w, top + h))))
    assert torch.equal(tile.permute(2, 0, 1), thumbs[1 * cols + 2])
    assert img.getpixel((left - 1, top + h // 2)) == g.BACKGROUND  # the gutter: grey, so a white tile shows


def test_grid_headers_and_long_prompts_wrapped_whole():
    g = gallery
    words = " ".join(f"word{i}" for i in range(12))  # ~100 characters: several lines over two 64-pixel tiles
    thumbs = torch.full((4, 3, 32, 64), 255, dtype=torch.uint8)
    img = g.make_grid(thumbs, [words, "short"], ["r=1"] * 4, 2, headers=["base", "adapter_0"])
    lines = g.prompt_lines([words, "short"], 2, 64)
    assert 1 < lines <= g.PROMPT_LINES
    assert img.size == g.grid_size(2, 2, 32, 64, lines, headers=True)
    assert img.size[1] == g.GUTTER + g.HEADER_H + 2 * (lines * g.LINE_H + 32 + g.CAPTION_H + g.GUTTER)
    from PIL import Image, ImageDraw, ImageFont

    draw, font = ImageDraw.Draw(Image.new("RGB", (1, 1))), ImageFont.load_default()
    wrapped = g._wrap(draw, words, 2 * 64 + g.GUTTER, font)
    assert " ".join(wrapped) == words  # every word, in order, nothing cut
    cut = g._wrap(draw, words * 5, 64, font)
    assert len(cut) == g.PROMPT_LINES and cut[-1].endswith("...")
    with pytest.raises(ValueError, match="need as many headers"):
        g.make_grid(thumbs, [words, "short"], ["r=1"] * 4, 2, headers=["base"])


def test_grid_rejects_inconsistent_inputs():
    thumbs = torch.zeros(5, 3, 8, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="do not fill rows"):
        gallery.make_grid(thumbs, ["p"], ["c"] * 5, 2)
    with pytest.raises(ValueError, match="prompts and captions"):
        gallery.make_grid(thumbs[:4], ["p"], ["c"] * 4, 2)


def test_long_text_is_truncated_to_the_tile():
    from PIL import Image, ImageDraw, ImageFont

    draw, font = ImageDraw.Draw(Image.new("RGB", (10, 10))), ImageFont.load_default()
    cut = gallery._fit(draw, "a very long prompt " * 20, 100, font)
    assert cut.endswith("...") and draw.textlength(cut, font=font) <= 100
    assert gallery._fit(draw, "short", 100, font) == "short"
    assert gallery.reward_caption(float("nan")) == "r=n/a" and gallery.reward_caption(-0.012345) == "r=-0.01235"


def test_save_gallery_writes_png(tmp_path):
    from PIL import Image

    path = gallery.save_gallery(
        tmp_path / "samples" / "step_000001.png",
        torch.zeros(4, 3, 16, 24, dtype=torch.uint8),
        ["p0", "p1"],
        [0.1, float("nan"), 0.3, 0.4],
        cols=2,
    )
    assert Image.open(path).size == gallery.grid_size(2, 2, 16, 24)


def _record(step, reward=0.5):
    return {"step": step, "reward_mean": reward, "kl": 0.01, "loss": 0.2, "entropy": 2.25}


class _Stream(io.StringIO):
    def isatty(self):
        return False


def test_progress_prints_compact_lines_when_not_a_terminal():
    stream = _Stream()
    p = Progress(total=25, initial=0, enabled=True, every=10, stream=stream)
    assert p.bar is None
    for step in range(1, 26):
        p.update(_record(step))
    p.close()
    lines = stream.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["1/25", "10/25", "20/25", "25/25"]  # first, every 10, last
    assert "eta" in lines[0] and "reward 0.5" in lines[0] and "kl 0.01" in lines[0] and "entropy 2.25" in lines[0]


def test_progress_disabled_prints_nothing():
    stream = _Stream()
    p = Progress(total=3, initial=0, enabled=False, stream=stream)
    p.update(_record(1))
    assert stream.getvalue() == ""


def test_metrics_writer_resume_keeps_records_up_to_the_checkpoint(tmp_path):
    w = MetricsWriter(tmp_path, True, name="eval.jsonl")
    for step in (0, 2, 4):
        w.write({"step": step})
    w.close()
    w = MetricsWriter(tmp_path, True, resume_step=2, name="eval.jsonl")
    w.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "eval.jsonl").read_text().splitlines()] == [0, 2]


def test_a_record_cut_off_mid_write_does_not_stop_the_resume_nor_the_tools(tmp_path):
    """A run killed (or out of disk) while writing a record leaves a last line without its newline: the resume read
    it with json.loads and stopped with a traceback. Any other bad line is one error naming the file and line."""
    from glm_grpo_ds.observability.records import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    assert read_metrics(path) == [{"step": 1}, {"step": 2}]
    MetricsWriter(tmp_path, True, resume_step=2).close()
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON record \(.*\); fix or delete that line$"):
        read_metrics(path)


def test_plot_training_with_eval(tmp_path):
    from PIL import Image

    from glm_grpo_ds.commands.plot import main
    from glm_grpo_ds.observability.plot import plot_training

    rows = [
        dict(
            step=s,
            reward_mean=0.1 * s,
            reward_std=0.05,
            kl=0.01 * s,
            clip_frac_low=0.0,
            clip_frac_high=0.1,
            **{"reward/a": 0.1, "reward/b": None},
        )
        for s in range(1, 6)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "eval.jsonl").write_text(json.dumps({"step": 0, "eval/reward_mean": 0.0}) + "\n")
    out = plot_training(tmp_path / "metrics.jsonl", tmp_path / "p.png", tmp_path / "eval.jsonl")
    assert Image.open(out).size[0] > 300
    assert main([str(tmp_path)]) == 0 and (tmp_path / "reward_curve.png").is_file()
    assert main([str(tmp_path / "missing")]) == 2
    # with image statistics in the evaluations (and an alarm): one more panel, from those records
    stats = [
        {"step": s, "eval/reward_mean": 0.1, "eval/images/dark_fraction": 0.1 * s, "eval/images/colour_entropy": 4.5}
        | {"eval/images/dark_fraction_spread": 0.01, "alarm/dark_fraction": int(s >= 3)}
        for s in range(0, 6)
    ]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stats))
    taller = plot_training(tmp_path / "metrics.jsonl", tmp_path / "q.png", tmp_path / "eval.jsonl")
    assert Image.open(taller).size[1] > Image.open(out).size[1]


def test_eval_shares_are_disjoint_padded_and_cover_every_prompt():
    from glm_grpo_ds.evaluation.in_training import Evaluator

    cfg = load_config(None, BASE + ["eval.file=/e.txt", "eval.num_prompts=5"])
    rows = [PromptRow(index=i, prompt=f"p{i}") for i in range(7)]
    shares = [Evaluator(cfg, rows, r, 2, torch.device("cpu")).mine for r in range(2)]
    assert [len(s) for s in shares] == [3, 3]  # ceil(5 / 2), same on every rank
    real = [row.index for share in shares for row, is_real in share if is_real]
    assert real == [0, 1, 2, 3, 4]
    assert [is_real for _, is_real in shares[1]] == [True, True, False]
    ev = Evaluator(
        load_config(None, BASE + ["eval.file=/e.txt", "eval.steps=3", "max_steps=10"]), rows, 0, 1, torch.device("cpu")
    )
    assert [s for s in range(1, 11) if ev.due(s)] == [3, 6, 9, 10]


def test_logging_and_eval_config():
    cfg = load_config(None, BASE)
    assert cfg.logging.report_to == [] and cfg.logging.gallery_steps == 0 and cfg.eval.file == ""
    assert cfg.logging.wandb_mode == "offline"
    with pytest.raises(ConfigError, match=r"unknown tracker 'tensorbord'; did you mean 'tensorboard'"):
        load_config(None, BASE + ["logging.report_to=[tensorbord]"])
    with pytest.raises(ConfigError, match=r"unknown tracker 'neptune'; known: tensorboard, wandb, mlflow, "):
        load_config(None, BASE + ["logging.report_to=[neptune]"])
    with pytest.raises(ConfigError) as err:
        load_config(None, BASE + ["logging.gallery_steps=-1", "eval.group_size=0", "logging.wandb_mode=cloud"])
    assert len(str(err.value).splitlines()) == 3
    with pytest.raises(ConfigError, match="did you mean 'eval'"):
        load_config(None, BASE + ["evl.steps=3"])


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_report_to_a_missing_package_fails_at_config_time(name, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == name else real(n, *a))
    with pytest.raises(
        ConfigError, match=rf"the {name} package is not installed: pip install 'glm-grpo-ds\[tracking\]'"
    ):
        load_config(None, BASE + [f"logging.report_to=[{name}]"])


@pytest.mark.parametrize("name", ["tiny_cpu.yaml", "glm_image_lora.yaml", "glm_image_full.yaml"])
def test_example_configs_load(name):
    from pathlib import Path

    cfg = load_config(str(Path(__file__).resolve().parents[2] / "launch" / "configs" / name))
    assert cfg.logging.gallery_steps >= 0 and cfg.eval.steps >= 0


def test_phase_timer_waits_for_cuda_work_before_reading_the_clock(monkeypatch):
    """CUDA runs kernels after their launch returns: a time/* field must include the phase's GPU work,
    so the timer synchronises its thread's stream at its start and its end once CUDA is initialised (fakes count
    the calls: no GPU here), and never initialises CUDA itself. Never the whole device: with rollout.one_step_off
    another thread may be capturing a CUDA graph, and a device synchronize then fails (error 900) and loses the
    capture, whatever its capture mode."""
    from glm_grpo_ds.observability.metrics import timer

    calls = []

    class Stream:
        def synchronize(self):
            calls.append("sync")

    def device_sync(*args):
        raise AssertionError("torch.cuda.synchronize(): the whole device, invalid during another thread's capture")

    monkeypatch.setattr(torch.cuda, "synchronize", device_sync)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    timings = {}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    with timer(timings, "rollout"):
        calls.append("work")
    assert calls == ["work"] and timings["rollout"] >= 0
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    calls.clear()
    with timer(timings, "update"):
        calls.append("work")
    assert calls == ["sync", "work", "sync"] and timings["update"] >= 0


def _alarm_records(values, prefix="eval/images/"):
    """Checked records: (step, dark fraction), each with the start's spread and a brightness that never moves."""
    return [
        {"step": s, prefix + "dark_fraction": v, prefix + "dark_fraction_spread": 0.01, prefix + "brightness": 0.5}
        for s, v in values
    ]


def test_replay_says_when_where_and_by_how_much_each_rule_fired_as_the_monitor_flagged_it():
    """The alarms' history after the run (monitoring/alarms.py ``replay``) is what the monitor flagged during
    it, record by record, with the value and the bound at the first firing, every step it held at and whether it
    held at the end; a rule that never fired is not listed; ``describe`` is its one line."""
    from glm_grpo_ds.monitoring.alarms import Monitor, describe, parse_rules, replay

    rules = parse_rules(["brightness < 0.1", "dark_fraction > start + 0.25", "dark_fraction > 0.45"])
    records = _alarm_records([(0, 0.1), (5, 0.2), (10, 0.4), (15, 0.3), (20, 0.5)])
    fired = replay(rules, records, "eval/images/")
    monitor = Monitor(rules, "eval/images/")
    flagged = [r["step"] for r in records if monitor.check(r)[0]["alarm/dark_fraction"]]
    assert flagged == [10, 20] and fired[0]["steps"] == [10, 20]
    assert fired == [
        {
            "statistic": "dark_fraction", "rule": "dark_fraction > start + 0.25", "first_step": 10, "value": 0.4,
            "bound": pytest.approx(0.35), "start": 0.1, "start_step": 0, "steps": [10, 20], "holding_at_end": True,
        },
        {
            "statistic": "dark_fraction", "rule": "dark_fraction > 0.45", "first_step": 20, "value": 0.5,
            "bound": 0.45, "start": 0.1, "start_step": 0, "steps": [20], "holding_at_end": True,
        },
    ]  # fmt: skip
    assert describe(fired[0]) == (
        "'dark_fraction > start + 0.25' fired at step 10: dark_fraction 0.4 vs bound 0.35 (start 0.1 at step 0); "
        "held at steps 10, 20, still holding at the end"
    )
    # one that cleared; a long list of steps is shortened; no records, no rules: nothing fired
    back = [(0, 0.1), *((s, 0.9) for s in range(1, 9)), (9, 0.1)]
    assert replay(rules[1:2], _alarm_records(back)) == []  # the evaluations' fields: the steps' prefix sees none
    cleared = replay(rules[1:2], _alarm_records(back), "eval/images/")
    assert describe(cleared[0]).endswith("held at steps 1, 2, ..., 7, 8 (8 checks), cleared by the end")
    assert replay(rules, [], "eval/images/") == [] and replay([], records, "eval/images/") == []


def test_fired_alarms_reads_the_checked_file_with_the_runs_rules_up_to_a_step(tmp_path):
    """A run directory written by hand: the evaluations' records are the checked ones when the run evaluated (the
    training steps' image statistics are not), the rules come from config.json, ``step`` cuts the history (a
    checkpoint's card), and a run without image statistics has no alarm record."""
    from glm_grpo_ds.observability.records import fired_alarms

    run = tmp_path / "run"
    run.mkdir()
    rules = ["dark_fraction > start + 0.25", "brightness < 0.1"]
    (run / "config.json").write_text(json.dumps({"train": {"monitor": {"alarms": rules}}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _alarm_records([(1, 0.9)], "images/")))
    assert fired_alarms(run)["file"] == str(run / "metrics.jsonl")  # no evaluations: the steps were checked
    (run / "eval.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in _alarm_records([(0, 0.1), (5, 0.2), (10, 0.4)]))
    )
    alarms = fired_alarms(run)
    assert alarms["file"] == str(run / "eval.jsonl") and alarms["rules"] == rules
    assert [(a["rule"], a["first_step"], a["value"]) for a in alarms["fired"]] == [(rules[0], 10, 0.4)]
    assert fired_alarms(run, step=5)["fired"] == []
    # resumed without evaluation: its monitor checked the steps, not the evaluations of the launch before
    (run / "config.json").write_text(json.dumps({"train": {"monitor": {"alarms": rules}, "eval": {"file": ""}}}))
    assert fired_alarms(run)["file"] == str(run / "metrics.jsonl")
    (run / "config.json").write_text(json.dumps({"train": {"monitor": {"alarms": rules}}}))
    (run / "eval.jsonl").write_text(json.dumps({"step": 0, "eval/reward_mean": 0.5}) + "\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    assert fired_alarms(run) is None


def test_only_fail_on_alarm_with_a_fired_alarm_makes_a_finished_run_exit_6():
    """monitor.fail_on_alarm's decision (glm_grpo_ds/train.py ``Trainer.exit_status``): any rule that fired, held at
    the end or not; off by default; its status is none of the trainer's others (2 bad input, 3 non-finite, 4 upload,
    5 stop_on_alarm, 128 + signal)."""
    from glm_grpo_ds.config import TrainConfig
    from glm_grpo_ds.monitoring.alarms import EXIT_ALARMS_FIRED, alarm_failure

    fired = [{"rule": "dark_fraction > 0.45", "holding_at_end": False}]
    assert alarm_failure(fired, True) and not alarm_failure([], True) and not alarm_failure(fired, False)
    assert TrainConfig().monitor.fail_on_alarm is False
    assert EXIT_ALARMS_FIRED == 6


def test_the_startup_summary_says_when_top_k_or_top_p_draw_off_policy():
    from glm_grpo_ds.config import SamplingConfig
    from glm_grpo_ds.observability.summary import _cut_note

    assert "draws off-policy" in _cut_note(SamplingConfig(temperature=0.9, top_k=50, top_p=0.75), 16384)
    assert "draws off-policy" in _cut_note(SamplingConfig(temperature=1.0, top_k=0, top_p=0.9), 16384)
    assert _cut_note(SamplingConfig(temperature=0.9, top_k=0, top_p=1.0), 16384) == ""
    # a top-k of the whole codebook or more cuts nothing (the tiny model: 16 ids under the shipped top_k 50)
    assert _cut_note(SamplingConfig(temperature=1.0, top_k=50, top_p=1.0), 16) == ""
    assert "draws off-policy" in _cut_note(SamplingConfig(temperature=1.0, top_k=50, top_p=1.0), 16384)
    assert "draws off-policy" in _cut_note(SamplingConfig(temperature=1.0, top_k=50, top_p=1.0), None)


def test_sample_lines_by_hand():
    """samples.jsonl's lines (observability/sample_records.py): one per sample, group by group; an undefined reward
    or advantage is null, not NaN (which JSON has not)."""
    import json

    from glm_grpo_ds.observability.sample_records import sample_lines

    nan = float("nan")
    lines = sample_lines(
        7,
        [3, 3, 9, 9],
        ["a cat", "a cat", "a dog", "a dog"],
        {"ocr": torch.tensor([0.5, nan, 1.0, 0.0]), "mse": torch.tensor([-0.1, -0.2, -0.3, -0.4])},
        torch.tensor([0.4, 0.3, 0.7, -0.4]),
        torch.tensor([0.7, -0.7, 0.0, 0.0]),
        2,
    )
    assert [(s["sample"], s["prompt_index"], s["group_member"], s["prompt"]) for s in lines] == [
        (0, 3, 0, "a cat"), (1, 3, 1, "a cat"), (2, 9, 0, "a dog"), (3, 9, 1, "a dog")
    ]  # fmt: skip
    assert lines[1]["rewards"] == {"ocr": None, "mse": pytest.approx(-0.2)} and lines[1]["step"] == 7
    assert lines[0]["reward"] == pytest.approx(0.4) and lines[1]["advantage"] == pytest.approx(-0.7)
    assert "NaN" not in json.dumps(lines)
