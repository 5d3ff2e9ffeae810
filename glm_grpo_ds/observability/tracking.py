"""Where metric records go, on global rank 0: the one place a record fans out to every tracker.

Always: JSON lines in ``output_dir`` (``metrics.jsonl`` for training steps, ``eval.jsonl`` for
evaluations). When ``logging.report_to`` names them (TRL / transformers names; ``all`` = every
installed one): accelerate's tracker classes (``accelerate.tracking``) for TensorBoard
(``output_dir/tensorboard/<run_name>/``; ``tensorboard --logdir OUTPUT_DIR/tensorboard``), Weights &
Biases (``logging.wandb_mode: offline`` by default: no network, ``output_dir/wandb/offline-run-*``,
upload later with ``wandb sync``), MLflow, trackio, Comet ML, ClearML, DVCLive, SwanLab and Aim. Each
gets the run's config as hyper-parameters (:func:`hyperparameters`), every numeric field of every
record at its ``step``, and the gallery PNGs where it takes images (:data:`IMAGE_TRACKERS`). A
tracker's package is imported only when it is used (``pip install 'glm-grpo-ds[tracking]'`` for
TensorBoard and W&B).

    tracker = build_tracker(cfg, is_main=rank == 0)
    tracker.log("train", {"step": 1, "loss": 0.1, ...})
    tracker.log_image("samples", Path("out/samples/step_000001.png"), step=1)
    tracker.close()

No accelerate state is created. ``Accelerator.init_trackers`` / ``log`` / ``end_training`` are
replaced by direct calls of each tracker's ``start``, ``store_init_configuration``, ``log``,
``log_images`` and ``finish`` on rank 0, the only rank that builds trackers. accelerate's
``on_main_process`` decorator would build a ``PartialState()`` for trackers whose
``main_process_only`` is true: under the deepspeed launcher that reads the launcher's environment and
calls ``init_process_group`` (or ``deepspeed.init_distributed``) when no group exists, sets the device
and the thread count, on rank 0 alone, beside DeepSpeed's own group. So each tracker's
``main_process_only`` is set false: the main-process gate is that only rank 0 holds trackers. And
accelerate.tracking's module logger, which raises unless a ``PartialState`` exists, is replaced by a
plain logger of the same name (:func:`_plain_accelerate_logger`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..config import ConfigError, to_dict
from ..config.redact import redacted
from .records import MetricsWriter

STREAMS = {"train": "metrics.jsonl", "eval": "eval.jsonl", "samples": "samples.jsonl"}
# Trackers whose accelerate class takes images (log_images; MLflow: the PNG as an artifact).
IMAGE_TRACKERS = ("tensorboard", "wandb", "mlflow", "clearml", "swanlab", "aim")


def scalars(record: dict) -> dict[str, float]:
    """The numeric fields of a record except ``step`` (None = undefined is left out)."""
    return {
        k: float(v)
        for k, v in record.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def hyperparameters(cfg) -> dict[str, bool | int | float | str]:
    """The run's config as flat ``section.key`` -> scalar, what every tracker's
    ``store_init_configuration`` accepts (TensorBoard's ``add_hparams`` refuses None, lists and
    mappings): lists, null and empty mappings as their JSON text."""
    flat: dict = {}

    def walk(key: str, value) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{key}.{k}" if key else str(k), v)
        elif isinstance(value, (bool, int, float, str)):
            flat[key] = value
        else:
            flat[key] = json.dumps(value)

    walk("", redacted(to_dict(cfg)))  # a tracker's server is another machine: secrets masked (config/redact.py)
    return flat


class _PlainAccelerateLogger(logging.LoggerAdapter):
    """accelerate's tracker logger without its ``PartialState`` requirement (same logger name, so
    ``logging`` configuration of ``accelerate.tracking`` still applies)."""

    def __init__(self):
        super().__init__(logging.getLogger("accelerate.tracking"), {})
        self._warned: set[str] = set()

    def warning_once(self, msg, *args, **kwargs):
        if msg not in self._warned:
            self._warned.add(msg)
            self.warning(msg, *args, **kwargs)


def _plain_accelerate_logger() -> None:
    import accelerate.tracking

    if not isinstance(accelerate.tracking.logger, _PlainAccelerateLogger):
        accelerate.tracking.logger = _PlainAccelerateLogger()


def tracker_arguments(name: str, cfg, resume_step: int | None = None) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of accelerate's tracker class ``name`` for this run: its files under
    ``output_dir``, ``logging.project`` and the run name, then ``logging.tracker_kwargs[name]`` over them."""
    lg, out = cfg.logging, Path(cfg.output_dir)
    run = lg.run_name or out.name
    args: tuple = (lg.project,)  # accelerate's first argument: the project (init_trackers' project_name)
    kwargs: dict = {}
    if name == "tensorboard":
        args = (run, str(out / "tensorboard"))
        if resume_step is not None:
            # hide what a killed run logged after its checkpoint, as metrics.jsonl drops those records
            kwargs["purge_step"] = resume_step + 1
    elif name == "wandb":
        kwargs = {"name": run, "dir": str(out), "mode": lg.wandb_mode}
    elif name == "mlflow":
        args, kwargs = (), {"experiment_name": lg.project, "run_name": run}
    elif name in ("trackio", "swanlab", "clearml"):
        kwargs = {{"trackio": "name", "swanlab": "experiment_name", "clearml": "task_name"}[name]: run}
        if name == "swanlab":
            kwargs["logdir"] = str(out / "swanlog")
    elif name == "dvclive":
        args, kwargs = (), {"dir": str(out / "dvclive")}
    elif name == "aim":
        args, kwargs = (run, str(out)), {"experiment": lg.project}  # the Aim repository: output_dir/.aim
    return args, {**kwargs, **lg.tracker_kwargs.get(name, {})}


def start_tracker(name: str, cfg, resume_step: int | None = None):
    """accelerate's tracker ``name``, started, with the run's hyper-parameters stored (rank 0 only)."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    _plain_accelerate_logger()
    args, kwargs = tracker_arguments(name, cfg, resume_step)
    if name == "wandb":
        # WANDB_MODE is what wandb's own tools (and its service process) read; keep it in step.
        os.environ["WANDB_MODE"] = kwargs["mode"]
        (Path(cfg.output_dir) / "wandb").mkdir(parents=True, exist_ok=True)
    try:
        tracker = LOGGER_TYPE_TO_CLASS[name](*args, **kwargs)
        tracker.main_process_only = False  # see the module docstring: no PartialState
        tracker.start()
        tracker.store_init_configuration(hyperparameters(cfg))
    except Exception as err:  # a wrong tracker_kwargs key, no login / server: the run's setup, one line
        first = (str(err).splitlines() or [""])[0]
        raise ConfigError(
            f"logging.report_to: {name} could not start ({type(err).__name__}: {first}); check "
            f"logging.tracker_kwargs.{name} and {name}'s own setup (login, server, API key)"
        ) from err
    return tracker


def log_image(name: str, tracker, tag: str, path: Path, step: int) -> None:
    """The gallery PNG at ``path`` to one tracker, in the form its accelerate class takes."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as img:
        rgb = img.convert("RGB")
    if name == "tensorboard":
        tracker.log_images({tag: np.asarray(rgb)[None]}, step=step, dataformats="NHWC")
        tracker.tracker.flush()
    elif name in ("wandb", "swanlab"):
        tracker.log_images({tag: [rgb]}, step=step)
    elif name in ("clearml", "aim"):
        tracker.log_images({tag: rgb}, step=step)
    elif name == "mlflow":
        tracker.log_artifact(str(path), artifact_path=tag)


class Tracker:
    """Fans records out to the JSON-lines files and the started trackers; a no-op off rank 0."""

    def __init__(self, writers: dict[str, MetricsWriter], trackers: dict):
        self.writers, self.trackers = writers, trackers

    def log(self, stream: str, record: dict) -> None:
        self.writers[stream].write(record)
        values = scalars(record)
        for tracker in self.trackers.values():
            tracker.log(values, step=int(record["step"]))

    def write(self, stream: str, record: dict) -> None:
        """A record to ``stream``'s file only (``samples``: a line per sample, not a tracker's scalars)."""
        self.writers[stream].write(record)

    def log_image(self, tag: str, path: Path, step: int) -> None:
        for name, tracker in self.trackers.items():
            if name in IMAGE_TRACKERS:  # the others (trackio, comet_ml, dvclive) take none: the PNG is not read
                log_image(name, tracker, tag, Path(path), step)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        for tracker in self.trackers.values():
            tracker.finish()


def build_tracker(cfg, is_main: bool, resume_step: int | None = None) -> Tracker:
    out = Path(cfg.output_dir)
    streams = {"train": STREAMS["train"]} | ({"eval": STREAMS["eval"]} if cfg.eval.file else {})
    if cfg.logging.sample_records:  # observability/sample_records.py
        streams["samples"] = STREAMS["samples"]
    elif is_main and resume_step is None:  # an earlier attempt's, which no step of this run wrote
        (out / STREAMS["samples"]).unlink(missing_ok=True)
    elif is_main and (out / STREAMS["samples"]).is_file():  # resumed with it off: a killed branch's lines dropped
        MetricsWriter(out, True, resume_step, STREAMS["samples"]).close()
    if is_main and resume_step is None and not cfg.eval.file:  # an earlier attempt's (it died before its first
        (out / STREAMS["eval"]).unlink(missing_ok=True)  # step), which the plot and progress would read as this run's
    elif is_main and not cfg.eval.file and (out / STREAMS["eval"]).is_file():  # resumed without evaluating: the
        MetricsWriter(out, True, resume_step, STREAMS["eval"]).close()  # records past the checkpoint are of a
        # branch thrown away, which the card, the curve and the closing line would report as this run's
    writers = {stream: MetricsWriter(out, is_main, resume_step, name) for stream, name in streams.items()}
    trackers = {name: start_tracker(name, cfg, resume_step) for name in cfg.logging.trackers()} if is_main else {}
    return Tracker(writers, trackers)
