"""Run outputs on global rank 0: JSON-lines metric files (``metrics.jsonl``, one object per step;
``eval.jsonl``, one per evaluation) and the progress display. Other ranks get no-op objects, so the
training loop never branches on rank. Trackers (TensorBoard, W&B) are in tracking.py, the plots in
plot.py."""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import torch


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated (CUDA) or peak resident set size of this process (CPU), in MB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux
    return rss_kb / 1024


class MetricsWriter:
    """``output_dir/name`` (JSON lines with a ``step``); ``resume_step`` keeps the records up to that
    step and appends after them (records a killed run wrote after its last checkpoint are dropped,
    not duplicated)."""

    def __init__(self, output_dir: str | Path, enabled: bool, resume_step: int | None = None, name: str = "metrics.jsonl"):
        self.enabled = enabled
        self.path = Path(output_dir) / name
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept = []
            if resume_step is not None and self.path.is_file():
                kept = [r for r in read_metrics(self.path) if r["step"] <= resume_step]
            self._fh = open(self.path, "w", encoding="utf-8")
            for record in kept:
                self.write(record)

    def write(self, record: dict) -> None:
        if self.enabled:
            self._fh.write(json.dumps(record, sort_keys=True) + "\n")
            self._fh.flush()

    def close(self) -> None:
        if self.enabled:
            self._fh.close()


class Progress:
    """Progress on rank 0: step, reward, KL, loss, elapsed time and ETA.

    On a terminal: a tqdm bar (its ``[elapsed<remaining]`` is the ETA). When stderr is not a
    terminal (log files, SLURM, the ``deepspeed`` launcher piping output) tqdm's carriage-return
    redraws would become one log line per refresh, so instead one compact line is printed at the
    first step, every ``every`` steps and at the last step.
    """

    def __init__(self, total: int, initial: int, enabled: bool, every: int = 10, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.initial, self.every = total, initial, every
        self.bar, self.lines = None, False
        if enabled and self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="grpo", unit="step", file=self.stream, dynamic_ncols=True)
        elif enabled:
            self.lines = True
            self.t0 = time.perf_counter()

    def update(self, record: dict) -> None:
        def fmt(key: str, spec: str) -> str:  # None: undefined reward / skipped non-finite step
            return "n/a" if record.get(key) is None else format(record[key], spec)

        stats = dict(reward=fmt("reward_mean", ".4g"), kl=fmt("kl", ".3g"), loss=fmt("loss", ".3g"))
        if self.bar is not None:
            self.bar.set_postfix(**stats)
            self.bar.update(1)
        elif self.lines:
            step = record["step"]
            if step % self.every and step != self.total and step != self.initial + 1:
                return
            from tqdm import tqdm

            elapsed = time.perf_counter() - self.t0
            per_step = elapsed / max(1, step - self.initial)
            print(
                f"grpo step {step}/{self.total} " + " ".join(f"{k} {v}" for k, v in stats.items())
                + f" | {per_step:.2f} s/step, elapsed {tqdm.format_interval(elapsed)}, eta {tqdm.format_interval(per_step * (self.total - step))}",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def nan_mean(values: torch.Tensor) -> float | None:
    """Mean of the defined (non-NaN) values; None when there are none."""
    defined = values[~torch.isnan(values)]
    return defined.mean().item() if defined.numel() else None


def nan_std(values: torch.Tensor) -> float | None:
    defined = values[~torch.isnan(values)]
    return defined.std().item() if defined.numel() > 1 else None


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
