"""How far a run got from its starting reward towards the best achievable one:
``fraction = (reward - start) / (best - start)``, for the fixed-seed eval and for the training reward.

``best.json`` maps each prompt to its best reward (``glm-grpo tiny-world`` computes it for the tiny
world); the run's ``config.json`` says which prompts were trained and evaluated, so the best is the
mean over exactly those prompts. ``make demo`` runs it before its ``glm-grpo evaluate``::

    glm-grpo progress OUTPUT_DIR --best outputs/world/best.json [--window 10] [--min-fraction 0.6]

The eval line compares the first and last evaluation (same prompts, same sampling seeds); the train
line compares the mean ``reward_mean`` of the first and last ``--window`` steps (noisier: each step
draws other prompts). ``--min-fraction`` makes the command exit 1 when the eval fraction is below it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..data import load_prompts
from ..observability.records import read_metrics, read_run_record
from .cli import parser_for


def fraction_of_way(start: float, end: float, best: float) -> float:
    if best <= start:
        raise ValueError(f"the best reward {best:.4f} is not above the start {start:.4f}: nothing to measure")
    return (end - start) / (best - start)


def _mean_best(best: dict[str, float], prompt_file: str, num_prompts: int = 0) -> float:
    prompts = [row.prompt for row in load_prompts(prompt_file)]
    if num_prompts:
        prompts = prompts[:num_prompts]
    missing = [p for p in prompts if p not in best]
    if missing:
        raise ValueError(
            f"best.json has no best reward for {missing[0]!r} (of {prompt_file}); "
            "pass the best.json written with these prompts"
        )
    return sum(best[p] for p in prompts) / len(prompts)


def read_best(path: Path) -> dict[str, float]:
    """``best.json``'s ``{prompt: best reward}``; a file that is not one is a ValueError naming it and the shape."""
    shape = '{"best": {"<prompt>": <best reward>, ...}} (glm-grpo tiny-world writes one for the tiny world)'
    try:
        best = json.loads(path.read_text(encoding="utf-8")).get("best")
    except (UnicodeDecodeError, ValueError, AttributeError) as err:
        raise ValueError(f"--best {path} is not a best.json ({type(err).__name__}): it holds {shape}") from None
    if not isinstance(best, dict) or not all(isinstance(v, (int, float)) for v in best.values()):
        raise ValueError(f"--best {path} has no best rewards: it holds {shape}")
    return best


def run_progress(output_dir: str | Path, best_path: str | Path, window: int = 10, key: str = "reward_mean") -> dict:
    """``{"eval": (start, end, best, fraction, first eval step, last eval step) or None, "train": (start, end, best,
    fraction)}`` of the metric ``key`` (``eval/<key>`` in eval.jsonl): the weighted reward, or one reward's
    ``reward/<label>`` where the run has others beside the world's (benchmarks/sweep_world.py)."""
    out = Path(output_dir)
    record = read_run_record(out)  # OutputDirError (a ValueError): a config.json that is not a run's
    if record is None:
        raise ValueError(f"{out} holds no config.json: give a training run's output_dir")
    cfg = record["train"]
    best = read_best(Path(best_path))
    result: dict = {"eval": None}
    evals = read_metrics(out / "eval.jsonl") if (out / "eval.jsonl").exists() else []
    evals = [e for e in evals if e.get(f"eval/{key}") is not None]  # null: every reward undefined there
    if len(evals) >= 2:
        b = _mean_best(best, cfg["eval"]["file"], cfg["eval"]["num_prompts"])
        start, end = evals[0][f"eval/{key}"], evals[-1][f"eval/{key}"]
        result["eval"] = (start, end, b, fraction_of_way(start, end, b), evals[0]["step"], evals[-1]["step"])
    if window < 1:
        raise ValueError(f"--window {window}: give the steps averaged at each end, 1 or more")
    rewards = [r[key] for r in read_metrics(out / "metrics.jsonl") if r.get(key) is not None]
    if len(rewards) < 2 * window:
        raise ValueError(
            f"{out / 'metrics.jsonl'} has {len(rewards)} steps with a reward; --window {window} needs "
            f"at least {2 * window}"
        )
    b = _mean_best(best, cfg["data"]["train_file"])
    start, end = sum(rewards[:window]) / window, sum(rewards[-window:]) / window
    result["train"] = (start, end, b, fraction_of_way(start, end, b))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = parser_for("progress")
    parser.add_argument("output_dir", help="a run's output_dir (holds eval.jsonl and metrics.jsonl)")
    parser.add_argument(
        "--best", required=True, help="JSON with {'best': {prompt: best reward}} (tiny-world's best.json)"
    )
    parser.add_argument("--window", type=int, default=10, help="training steps averaged at the start and at the end")
    parser.add_argument("--min-fraction", type=float, default=None, help="exit 1 if the eval fraction is below this")
    args = parser.parse_args(argv)
    try:
        res = run_progress(args.output_dir, args.best, args.window)
    except (OSError, ValueError) as err:
        print(f"glm-grpo progress: {err}", file=sys.stderr)
        return 2
    start, end, best, frac = res["train"]
    print(
        f"train reward (first {args.window} steps -> last {args.window}): {start:.3f} -> {end:.3f}, "
        f"best {best:.3f}: {frac:.0%} of the way"
    )
    if res["eval"] is None:
        print("eval: fewer than two evaluations in eval.jsonl (set eval.file and eval.steps)")
        return 0 if args.min_fraction is None else 1
    start, end, best, frac, s0, s1 = res["eval"]
    print(
        f"eval reward (fixed seeds, step {s0} -> {s1}): {start:.3f} -> {end:.3f}, best {best:.3f}: "
        f"fraction of the way to the best = {frac:.2f}"
    )
    if args.min_fraction is not None and frac < args.min_fraction:
        print(
            f"glm-grpo progress: eval fraction {frac:.2f} is below --min-fraction {args.min_fraction}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
