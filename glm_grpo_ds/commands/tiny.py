"""``glm-grpo tiny-model | tiny-data | tiny-world``: write the offline tiny GLM-Image models and data
that the tests and ``make demo`` use (the builders are in glm_grpo_ds/testing/)::

    glm-grpo tiny-model OUT_DIR [--seed N] [--full-size-ar]
    glm-grpo tiny-data --config CFG [--num-prompts N] [key=value ...]
    glm-grpo tiny-world OUT_DIR [--seed N]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import load_config, parse_with_overrides
from ..testing.tiny import build_tiny_pipeline
from ..testing.tiny_data import PROMPTS, write_tiny_dataset
from ..testing.world import write_world


def tiny_model(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="glm-grpo tiny-model", description="write a random-weight tiny GLM-Image pipeline directory (offline)"
    )
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--full-size-ar",
        action="store_true",
        help="the AR at GLM-Image's real size (10 B params, ~20 GB bf16; for GPU benchmarks)",
    )
    args = parser.parse_args(argv)
    path = build_tiny_pipeline(args.out_dir, seed=args.seed, full_size_ar=args.full_size_ar)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    print(f"wrote tiny GLM-Image pipeline to {path} ({size / 1e6:.2f} MB)")
    return 0


def tiny_data(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="glm-grpo tiny-data", description="write a learnable prompt set with target images for the tiny model"
    )
    p.add_argument("--config", required=True, help="the training config the data is for")
    p.add_argument("--num-prompts", type=int, default=len(PROMPTS))
    p.add_argument("overrides", nargs="*", help="key=value overrides, as for training")
    a = parse_with_overrides(p, argv)
    cfg = load_config(a.config, a.overrides)
    train_file = Path(cfg.data.train_file)
    if train_file.suffix != ".jsonl":
        raise SystemExit(f"glm-grpo tiny-data: data.train_file must be a .jsonl path, got {train_file}")
    path = write_tiny_dataset(
        cfg.model.path, train_file.parent, cfg.rollout.height, cfg.rollout.width, cfg.decoder, a.num_prompts
    )
    if path != train_file:
        path.replace(train_file)
    print(f"wrote {a.num_prompts} prompts with target images to {train_file}")
    return 0


def tiny_world(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="glm-grpo tiny-world",
        description="write the learnable tiny world: colour-block decoder, colour prompts, best rewards",
    )
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    summary = write_world(args.out_dir, args.seed)
    best = list(summary["best"].values())
    print(
        f"wrote the tiny world to {args.out_dir}: model/, train.jsonl, heldout.jsonl, layouts.jsonl, best.json "
        f"(best colour_layout reward {min(best):.4f}..{max(best):.4f})"
    )
    return 0
