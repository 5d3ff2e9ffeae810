"""Experiment trackers through accelerate's tracker classes (glm_grpo_ds/observability/tracking.py): the real
TensorBoard and W&B (offline) packages write files that are read back; the report_to names, "all" /
"none" and their config errors; no accelerate state or process group is created. ~15 s.

The trained runs (1 and 2 ranks) are in tests/integration/test_observability.py."""

import importlib.util
import json
import threading

import pytest
import torch
from PIL import Image

from glm_grpo_ds.config import TRACKERS, ConfigError, load_config
from glm_grpo_ds.observability.records import MetricsWriter
from glm_grpo_ds.observability.tracking import Tracker, build_tracker, hyperparameters, scalars, tracker_arguments

BASE = ["model.path=/m", "data.train_file=/d.jsonl", "rewards=[{name: pixel_mse}]"]
tensorboard = pytest.importorskip("tensorboard", reason="pip install 'glm-grpo-ds[tracking]'")
wandb = pytest.importorskip("wandb", reason="pip install 'glm-grpo-ds[tracking]'")


def read_tensorboard(tb_run_dir) -> tuple[dict[str, list[tuple[int, float]]], dict]:
    """``({scalar tag: [(step, value)]}, tags)`` of the event files in one run directory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}, acc.Tags()


def test_trackers_are_accelerates_under_transformers_names():
    """Every accelerate tracker class has a report_to name, each known to transformers too (Aim is
    accelerate's only); the tracker packages are imported by those names."""
    import ast
    from pathlib import Path

    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    # transformers' report_to names: the keys of INTEGRATION_TO_CALLBACK, read from its source
    # (importing integration_utils pulls in every integration: ~10 s)
    source = Path(importlib.util.find_spec("transformers.integrations.integration_utils").origin).read_text()
    (table,) = [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "INTEGRATION_TO_CALLBACK"
    ]
    transformers_names = {key.value for key in table.keys}
    assert {"tensorboard", "wandb", "mlflow"} <= transformers_names  # the source was read
    assert set(TRACKERS) == set(LOGGER_TYPE_TO_CLASS)
    assert set(TRACKERS) - transformers_names == {"aim"}


def test_tensorboard_and_wandb_get_scalars_images_and_the_config(tmp_path, monkeypatch):
    from accelerate.state import PartialState

    from glm_grpo_ds.testing import wandb_offline

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "myrun"
    cfg = load_config(
        None,
        BASE + [f"output_dir={out}", "logging.report_to=[tensorboard, wandb]", "eval.file=/e.txt", "grpo.beta=0.02"],
    )
    tracker = build_tracker(cfg, is_main=True)
    assert list(tracker.trackers) == ["tensorboard", "wandb"]
    tracker.log("eval", {"step": 0, "eval/reward_mean": -0.5, "gallery": "samples/eval_step_000000.png"})
    for step in (1, 2):
        tracker.log("train", {"step": step, "loss": 0.25 * step, "lr": None, "skipped": False, "n": 3})
    gallery = out / "samples" / "step_000002.png"
    gallery.parent.mkdir()
    Image.new("RGB", (24, 12), (255, 0, 0)).save(gallery)
    tracker.log_image("samples", gallery, 2)
    tracker.close()

    # no accelerate state, no process group: only glm_grpo_ds/ds/ sets those up
    assert PartialState._shared_state == {} and not torch.distributed.is_initialized()
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]

    # TensorBoard: event files in output_dir/tensorboard/<run name>/, each value at its step
    got, tags = read_tensorboard(out / "tensorboard" / "myrun")
    assert got == {"eval/reward_mean": [(0, -0.5)], "loss": [(1, 0.25), (2, 0.5)], "n": [(1, 3.0), (2, 3.0)]}
    assert tags["images"] == ["samples"]
    hparams = next((out / "tensorboard" / "myrun").glob("*/hparams.yml")).read_text()
    assert "grpo.beta: 0.02" in hparams

    # W&B offline: one run under output_dir/wandb/, project / name / config, history with the image
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    assert wandb_offline.run_info(run_dir)["project"] == "glm-grpo"
    assert wandb_offline.run_info(run_dir)["name"] == "myrun"
    config = wandb_offline.config(run_dir)
    assert config["grpo.beta"] == 0.02 and config["output_dir"] == str(out) and config["lora.r"] == cfg.lora.r
    rows = wandb_offline.history(run_dir)
    assert [(r["_step"], r.get("eval/reward_mean"), r.get("loss"), r.get("n")) for r in rows] == [
        (0, -0.5, None, None),
        (1, None, 0.25, 3.0),
        (2, None, 0.5, 3.0),
    ]
    image = rows[2]["samples"]
    assert image["_type"] == "images/separated" and (image["width"], image["height"]) == (24, 12)
    assert Image.open(run_dir / "files" / image["filenames"][0]).getpixel((0, 0)) == (255, 0, 0)

    # the file as wandb's service may leave it for a moment after finish(): cut short, then written out; the reader
    # waits for the exit record (it read a file without the run record once), and says so when none comes
    (written,) = run_dir.glob("run-*.wandb")
    late = tmp_path / "late" / "offline-run-late"
    late.mkdir(parents=True)
    (late / written.name).write_bytes(written.read_bytes()[:200])
    with pytest.raises(TimeoutError, match="no exit record after 0 s"):
        wandb_offline.records(late, wait_s=0.3)
    threading.Timer(0.5, lambda: (late / written.name).write_bytes(written.read_bytes())).start()
    assert wandb_offline.run_info(late) == wandb_offline.run_info(run_dir)
    (late / written.name).write_bytes(b"not a run file")  # not W&B's: said at once, not waited for
    with pytest.raises(ValueError, match="is not a W&B run file"):
        wandb_offline.records(late, wait_s=60)


def test_resumed_tensorboard_hides_what_came_after_the_checkpoint(tmp_path):
    """A run killed at step 3 after its step-1 checkpoint: the resumed run's step 2 replaces the old
    one, as metrics.jsonl keeps the records up to the checkpoint only."""
    cfg = load_config(None, BASE + [f"output_dir={tmp_path / 'r'}", "logging.report_to=tensorboard"])
    first = build_tracker(cfg, is_main=True)
    for step in (1, 2, 3):
        first.log("train", {"step": step, "loss": float(step), "other": float(step)})
    first.close()
    resumed = build_tracker(cfg, is_main=True, resume_step=1)
    resumed.log("train", {"step": 2, "loss": 20.0})
    resumed.close()
    got, _ = read_tensorboard(tmp_path / "r" / "tensorboard" / "r")
    # "other" (not logged again) loses steps 2 and 3 too: TensorBoard's purge, not only its out-of-order drop
    assert got == {"loss": [(1, 1.0), (2, 20.0)], "other": [(1, 1.0)]}
    assert [json.loads(x)["loss"] for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()] == [1, 20]


def test_a_fresh_run_without_evaluation_leaves_no_earlier_attempts_evaluations(tmp_path):
    """An attempt that died after its step-0 evaluation (before its first step: not an earlier run to refuse) left
    eval.jsonl, which the plot and glm-grpo progress of the next run, not evaluating, read as its own."""
    cfg = load_config(None, BASE + [f"output_dir={tmp_path / 'r'}"])
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "eval.jsonl").write_text('{"step": 0, "eval/reward_mean": 0.5}\n{"step": 5, "x": 1}\n')
    build_tracker(cfg, is_main=True, resume_step=3).close()
    # a resumed run's history up to its checkpoint stays; the step-5 evaluation was of a branch thrown away (the
    # card reported "step 0 -> step 5" for a run resumed at 3 without evaluation)
    assert [r["step"] for r in map(json.loads, (tmp_path / "r" / "eval.jsonl").read_text().splitlines())] == [0]
    build_tracker(cfg, is_main=True).close()
    assert not (tmp_path / "r" / "eval.jsonl").exists()


def test_off_rank_0_and_with_none_nothing_is_started(tmp_path):
    cfg = load_config(None, BASE + [f"output_dir={tmp_path / 'a'}", "logging.report_to=[tensorboard, wandb]"])
    assert build_tracker(cfg, is_main=False).trackers == {}
    for none in ("none", "[none]", "[]"):
        cfg = load_config(None, BASE + [f"output_dir={tmp_path / 'b'}", f"logging.report_to={none}"])
        assert cfg.logging.trackers() == [] and build_tracker(cfg, is_main=True).trackers == {}
    assert not (tmp_path / "a").exists() and not (tmp_path / "b" / "tensorboard").exists()


def test_all_is_every_installed_tracker(monkeypatch):
    installed = [name for name in TRACKERS if importlib.util.find_spec(name) is not None]
    assert {"tensorboard", "wandb"} <= set(installed)
    for value in ("all", "[all]"):
        assert load_config(None, BASE + [f"logging.report_to={value}"]).logging.trackers() == installed
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    cfg = load_config(None, BASE + ["logging.report_to=all"])  # a missing package is no error for "all"
    assert "wandb" not in cfg.logging.trackers() and "tensorboard" in cfg.logging.trackers()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "logging.report_to=[tensorbord, wandb]",
            "logging.report_to[0]: unknown tracker 'tensorbord'; did you mean 'tensorboard'? known: tensorboard, "
            "wandb, mlflow, trackio, comet_ml, clearml, dvclive, swanlab, aim, all, none",
        ),
        ("logging.report_to=neptune", "logging.report_to[0]: unknown tracker 'neptune'; known: tensorboard, wandb"),
        ("logging.report_to=[all, wandb]", "logging.report_to: all stands alone, got ['all', 'wandb']"),
        ("logging.report_to=[none, wandb]", "logging.report_to: none stands alone, got ['none', 'wandb']"),
        ("logging.tracker_kwargs={wandbb: {}}", "logging.tracker_kwargs: unknown tracker 'wandbb'; did you mean"),
        ("logging.tracker_kwargs.wandb=team", "logging.tracker_kwargs.wandb must be a mapping of keyword arguments"),
    ],
)
def test_report_to_errors_are_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, BASE + [override])
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1


def test_a_named_tracker_without_its_package_fails_at_config_time():
    missing = [name for name in ("mlflow", "comet_ml", "clearml") if importlib.util.find_spec(name) is None]
    if not missing:
        pytest.skip("mlflow, comet_ml and clearml are all installed")
    name = missing[0]
    pip = {"comet_ml": "comet-ml"}.get(name, name)
    with pytest.raises(
        ConfigError,
        match=rf"^logging.report_to names {name} but the {name} package is not installed: pip install {pip}$",
    ):
        load_config(None, BASE + [f"logging.report_to={name}"])


def test_every_accelerate_tracker_takes_the_run_arguments(tmp_path):
    """Each tracker class is built with this run's arguments (construction imports no tracker
    package): files under output_dir, logging.project, the run name, tracker_kwargs over them."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    out = tmp_path / "exp1"
    cfg = load_config(
        None,
        BASE
        + [f"output_dir={out}", "logging.project=proj", "logging.tracker_kwargs={wandb: {entity: team, mode: online}}"],
    )
    built = {}
    for name in TRACKERS:
        args, kwargs = tracker_arguments(name, cfg)
        built[name] = LOGGER_TYPE_TO_CLASS[name](*args, **kwargs)
    assert (built["tensorboard"].run_name, built["tensorboard"].logging_dir_param) == ("exp1", str(out / "tensorboard"))
    assert built["wandb"].run_name == "proj"  # accelerate passes it to wandb.init as the project
    assert built["wandb"].init_kwargs == {"name": "exp1", "dir": str(out), "mode": "online", "entity": "team"}
    assert (built["mlflow"].experiment_name, built["mlflow"].run_name) == ("proj", "exp1")
    assert built["trackio"].run_name == "proj" and built["trackio"].init_kwargs == {"name": "exp1"}
    assert built["comet_ml"].run_name == "proj"
    assert built["clearml"].user_provided_run_name == "proj" and built["clearml"].init_kwargs == {"task_name": "exp1"}
    assert built["dvclive"].init_kwargs == {"dir": str(out / "dvclive")}
    assert built["swanlab"].init_kwargs == {"experiment_name": "exp1", "logdir": str(out / "swanlog")}
    assert (built["aim"].run_name, built["aim"].aim_repo_path) == ("exp1", str(out))
    named = load_config(None, BASE + [f"output_dir={out}", "logging.run_name=named"])
    assert tracker_arguments("tensorboard", named, resume_step=4) == (
        ("named", str(out / "tensorboard")),
        {"purge_step": 5},
    )


@pytest.mark.parametrize(
    ("name", "kwargs", "error"),
    [
        ("tensorboard", "{bogus: 1}", "TypeError: SummaryWriter.__init__() got an unexpected keyword argument 'bogus'"),
        ("mlflow", "{bogus: 1}", "TypeError: MLflowTracker.__init__() got an unexpected keyword argument 'bogus'"),
    ],
)
def test_a_tracker_that_cannot_start_is_a_one_line_error(name, kwargs, error, tmp_path, monkeypatch):
    """Bad tracker_kwargs reach the tracker's own class (SummaryWriter, accelerate's MLflowTracker):
    one line naming the tracker and the key to fix."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n == name else real(n, *a))
    cfg = load_config(
        None, BASE + [f"output_dir={tmp_path}", f"logging.report_to={name}", f"logging.tracker_kwargs.{name}={kwargs}"]
    )
    with pytest.raises(ConfigError) as err:
        build_tracker(cfg, is_main=True)
    assert str(err.value) == (
        f"logging.report_to: {name} could not start ({error}); check logging.tracker_kwargs.{name} and {name}'s "
        "own setup (login, server, API key)"
    )


def test_hyperparameters_are_flat_scalars():
    cfg = load_config(None, BASE + ["lora=null", "rewards=[{name: pixel_mse, args: {a: 1}}]"])
    hp = hyperparameters(cfg)
    assert all(isinstance(v, (bool, int, float, str)) for v in hp.values())
    assert hp["grpo.beta"] == cfg.grpo.beta and hp["lora"] == "null" and hp["logging.tracker_kwargs"] == "{}"
    assert json.loads(hp["rewards"]) == [{"name": "pixel_mse", "weight": 1.0, "args": {"a": 1}, "label": ""}]


def test_tracker_fans_out_to_jsonl_and_drops_non_numbers(tmp_path):
    tracker = Tracker({"train": MetricsWriter(tmp_path, True)}, {})
    tracker.log("train", {"step": 1, "loss": 0.5, "grad_norm": None, "gallery": "samples/step_000001.png"})
    tracker.close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["gallery"] == "samples/step_000001.png"
    assert scalars({"step": 2, "flag": True, "x": None, "y": 1, "s": "a"}) == {"y": 1.0}
