"""``glm-grpo tiny-model | tiny-data | tiny-world``: write the offline tiny GLM-Image models and data
that the tests and ``make demo`` use (the builders are in glm_grpo_ds/testing/)::

    glm-grpo tiny-model OUT_DIR [--seed N] [--full-size-ar]
    glm-grpo tiny-model OUT_DIR --real-width --ar-layers N --dit-layers M [--seed N] [--device cpu|cuda]
        [--configs-from DIR|ID [--revision R]]
    glm-grpo tiny-data --config CFG [--num-prompts N] [key=value ...]
    glm-grpo tiny-world OUT_DIR [--seed N] [--seed-layout]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..config import ConfigError, load_config, parse_with_overrides
from ..testing.slice import build_slice_pipeline, source_configs
from ..testing.tiny import build_tiny_pipeline
from ..testing.tiny_data import PROMPTS, write_tiny_dataset
from ..testing.world import SEED_LAYOUT, write_seed_layout, write_world
from .cli import parser_for


def device_problem(name: str) -> str | None:
    """Why weights cannot be created on ``name`` (not a device, no such accelerator here), or None."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        return "not a device name; give cpu or cuda (cuda:N)"
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        return f"{device.type} weights cannot be saved; give cpu or cuda"
    if not torch.cuda.is_available():
        return "no CUDA device on this machine; build with --device cpu (minutes at full size) or on a GPU node"
    if device.index is not None and device.index >= torch.cuda.device_count():
        return f"this machine has {torch.cuda.device_count()} CUDA device(s)"
    return None


# Written into each directory tiny-model / tiny-data write: a later call may write there again.
MARK = ".glm-grpo-tiny"


def foreign_files(folder: Path, command: str, writes: tuple[Path, ...] = ()) -> str | None:
    """The one line refusing to write into ``folder`` when it holds files these commands did not write (a real
    pipeline, a dataset): transformers' and diffusers' save_pretrained delete the weight shards they do not write
    (a 34 GB download), tiny-data replaces the prompt file. ``writes``: the paths the command writes, when only those
    matter (tiny-data: other files beside them are left alone). None: new, empty, ours, or none of ``writes`` there."""
    if not folder.exists() or (folder / MARK).exists() or (folder.is_dir() and not any(folder.iterdir())):
        return None
    if writes and not any(p.is_file() or (p.is_dir() and any(p.iterdir())) for p in writes):
        return None
    what = "is a file" if not folder.is_dir() else f"holds files glm-grpo {command} did not write"
    return f"glm-grpo {command}: {folder} {what}; give a new or empty directory, or --overwrite to write into it"


def tiny_model(argv: list[str] | None = None) -> int:
    parser = parser_for("tiny-model")
    parser.add_argument("out_dir", help="the pipeline directory to write")
    parser.add_argument("--seed", type=int, default=0, help="seeds the random weights (byte-identical per seed)")
    parser.add_argument(
        "--full-size-ar",
        action="store_true",
        help="the AR at GLM-Image's real size (10 B params, ~20 GB bf16; for GPU benchmarks)",
    )
    parser.add_argument(
        "--real-width",
        action="store_true",
        help="a real-width slice: GLM-Image's real configs, bf16, only the layer counts reduced (docs/real-width.md)",
    )
    parser.add_argument("--ar-layers", type=int, default=1, help="with --real-width: AR layers (real: 40)")
    parser.add_argument("--dit-layers", type=int, default=1, help="with --real-width: DiT layers (real: 30)")
    parser.add_argument(
        "--configs-from",
        default=None,
        help="with --real-width: the component configs of this GLM-Image pipeline directory or cached Hub id "
        "(default: the built-in GLM-Image configs)",
    )
    parser.add_argument("--revision", default=None, help="with --configs-from a Hub id: its revision (default: main)")
    parser.add_argument("--overwrite", action="store_true", help="write into a directory holding other files")
    parser.add_argument(
        "--device",
        default=None,
        help="with --real-width: where to create the weights (default: cpu); cuda builds GLM-Image at its full size "
        "(--ar-layers 40 --dit-layers 30) in seconds, saved in ~1 min (34 GB)",
    )
    args = parser.parse_args(argv)
    if args.full_size_ar and args.real_width:
        parser.error("--full-size-ar and --real-width exclude each other")
    if not args.real_width and (args.ar_layers, args.dit_layers) != (1, 1):
        parser.error("--ar-layers / --dit-layers need --real-width")
    if min(args.ar_layers, args.dit_layers) < 1:
        parser.error("--ar-layers and --dit-layers must be >= 1")
    if args.configs_from and not args.real_width:
        parser.error("--configs-from needs --real-width")
    if args.device is not None and not args.real_width:
        parser.error("--device needs --real-width (--full-size-ar builds on the GPU when there is one)")
    problem = args.device and device_problem(args.device)
    if problem:
        print(f"glm-grpo tiny-model: --device {args.device}: {problem}", file=sys.stderr)
        return 2
    refused = not args.overwrite and foreign_files(Path(args.out_dir), "tiny-model")
    if refused:
        print(refused, file=sys.stderr)
        return 2
    start = time.monotonic()
    if args.real_width:
        configs = None
        if args.configs_from:
            try:
                configs = source_configs(args.configs_from, args.revision)
            except (FileNotFoundError, ValueError) as err:
                print(f"glm-grpo tiny-model: {err}", file=sys.stderr)
                return 2
        path = build_slice_pipeline(
            args.out_dir, args.ar_layers, args.dit_layers, seed=args.seed, configs=configs, device=args.device
        )
        origin = f"configs of {configs['root']}" if configs else "built-in configs"
        kind = f"real-width GLM-Image slice (AR {args.ar_layers} layers, DiT {args.dit_layers} layers, bf16, {origin})"
    else:
        path = build_tiny_pipeline(args.out_dir, seed=args.seed, full_size_ar=args.full_size_ar)
        kind = "tiny GLM-Image pipeline"
    (path / MARK).touch()
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    print(f"wrote {kind} to {path} ({size / 1e6:.2f} MB, {time.monotonic() - start:.0f} s)")
    return 0


def tiny_data(argv: list[str] | None = None) -> int:
    p = parser_for("tiny-data")
    p.add_argument("--config", required=True, help="the training config the data is for")
    p.add_argument("--num-prompts", type=int, default=len(PROMPTS), help="prompts to write")
    p.add_argument("--overwrite", action="store_true", help="write into a folder holding other files")
    p.add_argument("overrides", nargs="*", help="key=value overrides, as for training")
    a = parse_with_overrides(p, argv)
    try:
        cfg = load_config(a.config, a.overrides)
    except ConfigError as err:  # one line, as train's
        print(f"glm-grpo tiny-data: {err}", file=sys.stderr)
        return 2
    train_file = Path(cfg.data.train_file)
    if train_file.suffix != ".jsonl":
        raise SystemExit(f"glm-grpo tiny-data: data.train_file must be a .jsonl path, got {train_file}")
    writes = (train_file, train_file.parent / "prompts.jsonl", train_file.parent / "targets")
    refused = not a.overwrite and foreign_files(train_file.parent, "tiny-data", writes)
    if refused:
        print(refused, file=sys.stderr)
        return 2
    path = write_tiny_dataset(
        cfg.model.path, train_file.parent, cfg.rollout.height, cfg.rollout.width, cfg.decoder, a.num_prompts
    )
    if path != train_file:
        path.replace(train_file)
    (train_file.parent / MARK).touch()
    print(f"wrote {a.num_prompts} prompts with target images to {train_file}")
    return 0


def tiny_world(argv: list[str] | None = None) -> int:
    parser = parser_for("tiny-world")
    parser.add_argument("out_dir", help="the directory to write (model/, train.jsonl, heldout.jsonl, ...)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the random weights of the model (byte-identical per seed)"
    )
    parser.add_argument(
        "--seed-layout",
        action="store_true",
        help=f"also write the train prompts in the seeds' layout, {SEED_LAYOUT}/prompts.txt + target_images/, with a "
        "tiny CLIP and aesthetic head, for launch/configs/seed_recipe.yaml's reward mix (docs/training.md)",
    )
    args = parser.parse_args(argv)
    summary = write_world(args.out_dir, args.seed)
    best = list(summary["best"].values())
    print(
        f"wrote the tiny world to {args.out_dir}: model/, train.jsonl, heldout.jsonl, layouts.jsonl, best.json "
        f"(best colour_layout reward {min(best):.4f}..{max(best):.4f})"
    )
    if args.seed_layout:
        prompts = write_seed_layout(Path(args.out_dir) / SEED_LAYOUT, summary["height"], summary["width"], args.seed)
        print(
            f"wrote the seeds' layout to {prompts.parent}: prompts.txt, target_images/ (one image per line, from 1), "
            "clip/, aesthetic_head.safetensors"
        )
    return 0
