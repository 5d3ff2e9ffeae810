"""``glm-grpo plot OUTPUT_DIR [--out PNG]``: the training curves of a running or finished run
(reward, per-reward and eval reward, KL, clip fractions; glm_grpo_ds/observability/plot.py draws them).
Exit 2 when the run has no finished step yet."""

from __future__ import annotations

import sys
from pathlib import Path

from ..observability.plot import PLOT_NAME, plot_training
from .cli import parser_for


def main(argv: list[str] | None = None) -> int:
    p = parser_for("plot")
    p.add_argument("output_dir", help="a run's output_dir (holds metrics.jsonl)")
    p.add_argument("--out", help=f"PNG to write (default OUTPUT_DIR/{PLOT_NAME})")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    run = Path(args.output_dir)
    metrics = run / "metrics.jsonl"
    if not metrics.is_file() or not metrics.stat().st_size:
        print(f"glm-grpo plot: {metrics} does not exist or is empty (no training step finished yet?)", file=sys.stderr)
        return 2
    try:
        out = plot_training(metrics, args.out or run / PLOT_NAME, run / "eval.jsonl")
    except OSError as err:  # a read-only run folder, a --out in a folder that is not there
        print(
            f"glm-grpo plot: cannot write the curves ({err.strerror}: {err.filename}); give --out PNG", file=sys.stderr
        )
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
