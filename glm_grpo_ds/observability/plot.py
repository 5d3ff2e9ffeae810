"""Training curves PNG from a run's ``metrics.jsonl`` (and ``eval.jsonl`` when present): reward mean with
its std band, each reward's mean and the eval reward; KL (when the run computed it); the policy entropy
of the generated tokens (when recorded: a collapse shows as a falling curve); what the images look like (the image
statistics of docs/monitoring.md, from the evaluations when the run has them, else the steps; colour entropy / 9
so every curve is in [0, 1]) with a red line where an alarm first fired; clip fractions low / high.
The trainer writes ``output_dir/reward_curve.png`` at the end of a run (``logging.plot``); ``glm-grpo
plot OUTPUT_DIR`` (glm_grpo_ds/commands/plot.py) plots a running or finished run at any time.
"""

from __future__ import annotations

from pathlib import Path

from .records import read_metrics, reward_means

PLOT_NAME = "reward_curve.png"


def _values(rows: list[dict], key: str) -> list[float]:
    nan = float("nan")
    return [nan if r.get(key) is None else r[key] for r in rows]


def _image_series(rows: list[dict], evals: list[dict]):
    """``(records, key prefix)`` of the image statistics the monitor checked (evaluations, else steps), or None."""
    for records, prefix in ((evals, "eval/images/"), (rows, "images/")):
        if any(k.startswith(prefix) for r in records for k in r):
            return records, prefix
    return None


def _plot_images(ax, records: list[dict], prefix: str) -> None:
    steps = [r["step"] for r in records]
    names = sorted({k[len(prefix) :] for r in records for k in r if k.startswith(prefix) and not k.endswith("_spread")})
    for i, name in enumerate(names):
        scale = 9.0 if name == "colour_entropy" else 1.0  # bits of 512 colours: at most 9
        values = [v / scale for v in _values(records, prefix + name)]
        ax.plot(steps, values, label=name + (" / 9" if scale != 1 else ""), color=f"C{i}", linewidth=1)
    fired: dict[str, int] = {}
    for r in records:
        for key, on in r.items():
            if key.startswith("alarm/") and on and key not in fired:
                fired[key] = r["step"]
    for key, step in fired.items():
        ax.axvline(step, color="red", linewidth=1, linestyle=":")
        ax.annotate(key, (step, 1.0), rotation=90, fontsize="x-small", color="red", va="top", ha="right")
    ax.set_ylabel("images" + (" (eval)" if prefix.startswith("eval/") else ""))
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="x-small")


def plot_training(metrics_path: str | Path, out_png: str | Path, eval_path: str | Path | None = None) -> Path:
    """Write the PNG; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    evals = read_metrics(eval_path) if eval_path is not None and Path(eval_path).is_file() else []
    steps = [r["step"] for r in rows]
    with_kl = any(r.get("kl") for r in rows)  # beta = 0 runs compute no KL
    with_entropy = any(r.get("entropy") is not None for r in rows)  # runs before the metric existed have none
    images = _image_series(rows, evals)
    panels = 2 + with_kl + with_entropy + (images is not None)
    fig, axes = plt.subplots(
        panels, 1, figsize=(7, 3 + 1.6 * panels), sharex=True, height_ratios=[3] + [1] * (panels - 1)
    )
    ax = axes[0]
    mean = _values(rows, "reward_mean")
    std = [0.0 if s != s else s for s in _values(rows, "reward_std")]
    ax.plot(steps, mean, label="reward (mean)", color="C0")
    ax.fill_between(
        steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], color="C0", alpha=0.2
    )
    per_reward = sorted({f"reward/{label}" for r in rows for label in reward_means(r)})
    if len(per_reward) > 1:
        for i, key in enumerate(per_reward):
            ax.plot(steps, _values(rows, key), label=key, color=f"C{i + 1}", linewidth=1)
    if evals:
        ax.plot(
            [e["step"] for e in evals], _values(evals, "eval/reward_mean"), "o--", color="k", label="eval reward (mean)"
        )
    ax.set_ylabel("reward")
    ax.legend(loc="best", fontsize="small")
    panel = 1
    if with_kl:
        axes[panel].plot(steps, _values(rows, "kl"), color="C3")
        axes[panel].set_ylabel("KL")
        panel += 1
    if with_entropy:
        axes[panel].plot(steps, _values(rows, "entropy"), color="C6")
        axes[panel].set_ylabel("entropy (nats)")
        panel += 1
    if images is not None:
        _plot_images(axes[panel], *images)
    ax_clip = axes[-1]
    ax_clip.plot(steps, _values(rows, "clip_frac_low"), label="clip low (ratio < 1-eps)", color="C4")
    ax_clip.plot(steps, _values(rows, "clip_frac_high"), label="clip high (ratio > 1+eps)", color="C5")
    ax_clip.set_ylabel("clip fraction")
    ax_clip.legend(loc="best", fontsize="small")
    ax_clip.set_xlabel("step")
    for a in axes:
        a.grid(alpha=0.3)
    fig.tight_layout()
    out = png_path(out_png)
    try:
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return out


def png_path(out: str | Path) -> Path:
    """Where a curve asked for at ``out`` is written: in it when it is a folder, with ``.png`` added when it has no
    suffix (matplotlib adds it, and the path printed named a file that was not there)."""
    out = Path(out)
    if out.is_dir():
        return out / PLOT_NAME
    return out if out.suffix else out.with_name(out.name + ".png")


def plot_training_or_warn(out: Path) -> None:
    """The trainer's end-of-run curve of ``out`` (rank 0): one it cannot draw (a records file edited by hand, a full
    disk) is a warning, not rank 0 ending alone while the others wait in the final save's collectives."""
    from ..runtime import log

    try:
        plot_training(out / "metrics.jsonl", out / PLOT_NAME, out / "eval.jsonl")
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning(f"glm-grpo: warning: {out / PLOT_NAME} could not be drawn ({type(err).__name__}: {err})")
