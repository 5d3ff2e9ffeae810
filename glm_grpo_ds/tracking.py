"""Where metric records go, on global rank 0: the one place a record fans out to every sink.

Always: JSON lines in ``output_dir`` (``metrics.jsonl`` for training steps, ``eval.jsonl`` for
evaluations). When ``logging.report_to`` names them: TensorBoard (event files in
``output_dir/tensorboard/``; ``tensorboard --logdir OUTPUT_DIR/tensorboard``) and Weights & Biases
(``logging.wandb_project``; ``logging.wandb_mode: offline`` by default, which needs no network and
writes ``output_dir/wandb/offline-run-*``; upload later with ``wandb sync``). Both are imported
only when enabled (``pip install 'glm-grpo-ds[tracking]'``).

    tracker = build_tracker(cfg, is_main=rank == 0)
    tracker.log("train", {"step": 1, "loss": 0.1, ...})
    tracker.log_image("samples", Path("out/samples/step_000001.png"), step=1)
    tracker.close()
"""

from __future__ import annotations

import os
from pathlib import Path

from .config import to_dict
from .metrics import MetricsWriter

STREAMS = {"train": "metrics.jsonl", "eval": "eval.jsonl"}


def scalars(record: dict) -> dict[str, float]:
    """The numeric fields of a record except ``step`` (None = undefined is left out)."""
    return {
        k: float(v)
        for k, v in record.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def log_image(self, tag: str, path: Path, step: int) -> None:
        import numpy as np
        from PIL import Image

        self.writer.add_image(tag, np.asarray(Image.open(path).convert("RGB")), global_step=step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, cfg, out: Path):
        import wandb

        lg = cfg.logging
        run_dir = out / "wandb"
        run_dir.mkdir(parents=True, exist_ok=True)
        # WANDB_MODE is what wandb's own tools (and its service process) read; keep it in step.
        os.environ["WANDB_MODE"] = lg.wandb_mode
        self.run = wandb.init(
            project=lg.wandb_project,
            name=lg.wandb_run_name or out.name,
            dir=str(out),
            mode=lg.wandb_mode,
            config=to_dict(cfg),
        )

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def log_image(self, tag: str, path: Path, step: int) -> None:
        import wandb

        self.run.log({tag: wandb.Image(str(path))}, step=step)

    def close(self) -> None:
        self.run.finish()


class Tracker:
    """Fans records out to the JSON-lines files and the enabled trackers; a no-op off rank 0."""

    def __init__(self, writers: dict[str, MetricsWriter], sinks: list):
        self.writers, self.sinks = writers, sinks

    def log(self, stream: str, record: dict) -> None:
        self.writers[stream].write(record)
        values = scalars(record)
        for sink in self.sinks:
            sink.log(values, int(record["step"]))

    def log_image(self, tag: str, path: Path, step: int) -> None:
        for sink in self.sinks:
            sink.log_image(tag, path, step)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        for sink in self.sinks:
            sink.close()


def build_tracker(cfg, is_main: bool, resume_step: int | None = None) -> Tracker:
    out = Path(cfg.output_dir)
    streams = STREAMS if cfg.eval.file else {"train": STREAMS["train"]}
    writers = {stream: MetricsWriter(out, is_main, resume_step, name) for stream, name in streams.items()}
    sinks: list = []
    if is_main:
        if "tensorboard" in cfg.logging.report_to:
            sinks.append(TensorBoardSink(out / "tensorboard"))
        if "wandb" in cfg.logging.report_to:
            sinks.append(WandbSink(cfg, out))
    return Tracker(writers, sinks)
