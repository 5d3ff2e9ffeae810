"""Run outputs on global rank 0: ``metrics.jsonl`` (one object per step), the progress bar and the
reward-curve PNG. Other ranks get no-op objects, so the training loop never branches on rank."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import torch


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated (CUDA) or peak resident set size of this process (CPU), in MB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux
    return rss_kb / 1024


class MetricsWriter:
    """``metrics.jsonl``; ``resume_step`` keeps the records up to that step and appends after them
    (records a killed run wrote after its last checkpoint are dropped, not duplicated)."""

    def __init__(self, output_dir: str | Path, enabled: bool, resume_step: int | None = None):
        self.enabled = enabled
        self.path = Path(output_dir) / "metrics.jsonl"
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
    """tqdm bar with the latest reward / KL, on rank 0 only."""

    def __init__(self, total: int, initial: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="grpo", unit="step", file=sys.stderr, dynamic_ncols=True)

    def update(self, record: dict) -> None:
        if self.bar is not None:
            def fmt(key: str, spec: str) -> str:  # None: undefined reward / skipped non-finite step
                return "n/a" if record[key] is None else format(record[key], spec)

            self.bar.set_postfix(reward=fmt("reward_mean", ".4g"), kl=fmt("kl", ".3g"), loss=fmt("loss", ".3g"))
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_reward_curve(metrics_path: str | Path, out_png: str | Path) -> Path:
    """Reward mean (with +-std band and each reward's mean) and KL over steps, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    steps = [r["step"] for r in rows]
    nan = float("nan")
    mean = [nan if r["reward_mean"] is None else r["reward_mean"] for r in rows]
    std = [0.0 if r["reward_std"] is None else r["reward_std"] for r in rows]
    with_kl = any(r.get("kl") for r in rows)  # beta = 0 runs compute no KL
    if with_kl:
        fig, (ax, ax_kl) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=[3, 1])
    else:
        fig, ax = plt.subplots(1, 1, figsize=(7, 4.5))
    ax.plot(steps, mean, label="reward (mean)", color="C0")
    ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], color="C0", alpha=0.2)
    per_reward = sorted({k for r in rows for k in r if k.startswith("reward/") and not k.endswith(("_std", "_undefined", "_failed"))})
    if len(per_reward) > 1:
        for i, key in enumerate(per_reward):
            ax.plot(steps, [nan if r.get(key) is None else r[key] for r in rows], label=key, color=f"C{i + 1}", linewidth=1)
    ax.set_ylabel("reward")
    ax.legend(loc="best")
    ax.grid(alpha=0.3)
    if with_kl:
        ax_kl.plot(steps, [nan if r["kl"] is None else r["kl"] for r in rows], color="C3")
        ax_kl.set_ylabel("KL")
        ax_kl.set_xlabel("step")
        ax_kl.grid(alpha=0.3)
    else:
        ax.set_xlabel("step")
    fig.tight_layout()
    out = Path(out_png)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
