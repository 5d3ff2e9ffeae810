"""Benchmarks of a GRPO step, phase by phase, plus side-by-side comparisons reported as ratios.

    glm-grpo profile bench [--model DIR] [--size 256] [--group-size 16] [--steps 3] \
        [--out outputs/bench] [key=value ...]
    python -m glm_grpo_ds.profiling.bench ...      # the same

    # GPU, full-size random-init AR (LoRA r=64, 8-bit AdamW, checkpointing, ZeRO-3 world 1, G=16, 1024²):
    glm-grpo tiny-model /tmp/glm_full --full-size-ar
    glm-grpo profile bench --model /tmp/glm_full --size 1024 --group-size 16 lora.r=64 lora.alpha=128 \
        model.dtype=bf16

``--model`` is a pipeline directory or a Hub id (glm_grpo_ds/model/source.py; ``--revision`` pins it),
resolved once here; the measurement processes read the local directory with HF_HUB_OFFLINE=1.
Without ``--model`` it builds the tiny GLM-Image and its learnable dataset in a temp dir (CPU).
Prints a table and writes ``OUT/bench.json``. Measured:

* ``phases``: of ``Trainer.step`` (ZeRO-3, one process, LoRA, 8-bit AdamW, checkpointing): rollout
  tokens/s, decode images/s, reward images/s, update tokens/s, peak memory (median of the steps
  after a warm-up step);
* in ``phases`` too, and as ``ratios.rollout_ours_over_pipeline`` / ``rollout_compiled_over_pipeline``: our
  KV-cached rollout, eager and with ``rollout.compile``, vs ``GlmImagePipeline.generate_prior_tokens``, same model,
  batch (G rows of one prompt) and size, tokens/s;
* ``zero3_rollout_2_ranks`` (ratio ``ratios.zero3_gathered_over_sharded``): ZeRO-3 rollout on 2 ranks
  (``deepspeed --num_gpus 2``; CPU ranks without a GPU) with the parameters gathered once vs left sharded, tokens/s;
* ``update_memory`` (ratio ``ratios.update_peak_mb2_over_mb<G>``): peak memory of one update at micro-batch 2 vs
  micro-batch G, each in a fresh process (CPU: resident set, with glibc told to unmap freed blocks above 16 KiB so
  it follows the live tensors, its peak reset through /proc/self/clear_refs before the update; GPU:
  ``torch.cuda.max_memory_allocated`` after a reset);
* ``decode_step_counts``: per decode step, kernels launched, module calls, Python calls, host syncs and
  tokens/s of HF generate, the eager LoRA loop, the merged, fused and compiled loops (and the plain model
  without peft), on the tiny configuration at 2 and 4 layers, extrapolated to 40, as ratios over the eager
  loop (glm_grpo_ds/profiling/decode_counts.py; ``--count-variants`` picks them, ``none`` skips the section).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import parse_with_overrides
from .bench_workers import WORKERS
from .decode_counts import VARIANTS as COUNT_VARIANTS
from .tools import parser_for

# package data (setup.py), so `glm-grpo profile bench` runs from an installed wheel: the settings of
# launch/configs/tiny_cpu.yaml and ds_configs/zero3.json (tests/unit/test_bench_defaults.py)
DEFAULTS = Path(__file__).resolve().parent / "bench_defaults"
CONFIG = DEFAULTS / "train.yaml"
ZERO3 = DEFAULTS / "zero3.json"


@dataclass
class BenchConfig:
    """``glm-grpo profile bench``: phase throughputs and side-by-side ratios (see the module docstring)."""

    size: int = 256  # image height = width
    group_size: int = 16
    steps: int = 3  # timed training steps after one warm-up step
    repeats: int = 3  # repeats of each side-by-side comparison (median reported)
    out: str = "outputs/bench"


# ----------------------------------------------------------------------------- driver
def _run_worker(a, name: str, nprocs: int = 1, extra: tuple = ()) -> dict:
    """Each measurement in its own process(es): fresh peak-memory counters, one DeepSpeed init."""
    result = Path(a.workdir) / f"{name}{''.join(extra)}.json"
    args = [
        "--worker",
        name,
        "--result",
        str(result),
        "--model",
        a.model,
        "--data",
        a.data,
        "--workdir",
        a.workdir,
        "--size",
        str(a.size),
        "--group-size",
        str(a.group_size),
        "--steps",
        str(a.steps),
        "--repeats",
        str(a.repeats),
        "--config",
        a.config,
        "--deepspeed",
        a.deepspeed,
        "--count-variants",
        a.count_variants or "none",
        *extra,
        *a.overrides,
    ]
    if a.hbm_gbps:
        args += ["--hbm-gbps", str(a.hbm_gbps)]
    if nprocs > 1:
        from ..runtime.local_launch import deepspeed_command

        cmd, env = deepspeed_command(
            nprocs, ["--module", "glm_grpo_ds.profiling.bench", *args], cpu=not torch.cuda.is_available()
        )
    else:
        cmd, env = [sys.executable, "-m", "glm_grpo_ds.profiling.bench", *args], dict(os.environ, HF_HUB_OFFLINE="1")
    if name == "update-memory":
        # glibc serves allocations above this size with mmap and unmaps them on free, so the
        # resident set follows the live tensors instead of keeping freed heap pages
        env["MALLOC_MMAP_THRESHOLD_"] = "16384"
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not result.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise RuntimeError(f"benchmark worker {name} failed ({proc.returncode}):\n{tail}")
    return json.loads(result.read_text())


def run_all(a) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    res = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else f"cpu ({os.cpu_count()} cores)",
        "model": a.model,
        "size": a.size,
        "group_size": a.group_size,
        "steps": a.steps,
    }
    res["phases"] = _run_worker(a, "phases", extra=("--micro-batch", "2"))
    res["phases"]["micro_batch"] = 2
    res["update_memory"] = {
        m: _run_worker(a, "update-memory", extra=("--micro-batch", str(m))) for m in (2, a.group_size)
    }
    res["zero3_rollout_2_ranks"] = _run_worker(a, "zero3-rollout", nprocs=2, extra=("--micro-batch", "2"))
    if a.count_variants:
        res["decode_step_counts"] = _run_worker(a, "decode-counts")
    p, z, u = res["phases"], res["zero3_rollout_2_ranks"], res["update_memory"]
    res["ratios"] = {
        "rollout_ours_over_pipeline": p["rollout_ours_tokens_per_s"] / p["rollout_pipeline_tokens_per_s"],
        "rollout_compiled_over_pipeline": p["rollout_compiled_tokens_per_s"] / p["rollout_pipeline_tokens_per_s"],
        "zero3_gathered_over_sharded": z["gathered_tokens_per_s"] / z["sharded_tokens_per_s"],
        f"update_peak_mb2_over_mb{a.group_size}": u[2]["update_peak_above_start_mb"]
        / u[a.group_size]["update_peak_above_start_mb"],
    }
    return res


def run_gathers(a) -> dict:
    """``--gathers``: what a LoRA step gathers under ZeRO-3 on 2 ranks, per micro-batch size."""
    sizes = [int(x) for x in a.gathers_micro_batches.split(",")]
    return {
        "model": a.model,
        "size": a.size,
        "group_size": a.group_size,
        "micro_batches": {m: _run_worker(a, "zero3-gathers", nprocs=2, extra=("--micro-batch", str(m))) for m in sizes},
    }


def format_gathers(r: dict) -> str:
    lines = [
        f"ZeRO-3, LoRA, 2 ranks, G={r['group_size']}, {r['size']}x{r['size']}: parameters gathered per step, in whole "
        "ARs (reference log-probs in the update -> in the rollout's gather)",
        f"  {'micro-batch':>11}  {'rollout':>15}  {'update':>15}  {'step':>15}",
    ]
    for m, g in r["micro_batches"].items():
        b, a = g["before"], g["after"]
        cells = [f"{b[k]:6.2f} -> {a[k]:5.2f}" for k in ("rollout", "update", "step")]
        lines.append(f"  {m:>11}  " + "  ".join(f"{c:>15}" for c in cells))
    return "\n".join(lines)


def format_table(r: dict) -> str:
    p, z, u = r["phases"], r["zero3_rollout_2_ranks"], r["update_memory"]
    g = r["group_size"]
    rows = [
        ("rollout (ZeRO-3, 1 rank)", f"{p['rollout_tokens_per_s']:,.0f} tokens/s"),
        ("decode (DiT + VAE)", f"{p['decode_images_per_s']:.2f} images/s"),
        ("reward", f"{p['reward_images_per_s']:.1f} images/s"),
        (
            "image statistics",
            f"{p['image_stats_ms']:.1f} ms/step ({100 * p['image_stats_over_decode']:.2f}% of the decode)",
        ),
        ("update (micro-batch 2)", f"{p['update_tokens_per_s']:,.0f} tokens/s"),
        (
            "step time",
            f"{p['step_time_s']:.2f} s (" + ", ".join(f"{k} {v:.2f}" for k, v in p["time_split_s"].items()) + ")",
        ),
        ("peak memory", f"{p['peak_memory_mb']:,.0f} MB"),
        (
            "rollout: ours / pipeline",
            f"{r['ratios']['rollout_ours_over_pipeline']:.2f}x  "
            f"({p['rollout_ours_tokens_per_s']:,.0f} vs {p['rollout_pipeline_tokens_per_s']:,.0f} tokens/s)",
        ),
        (
            "rollout: compiled / pipeline",
            f"{r['ratios']['rollout_compiled_over_pipeline']:.2f}x  "
            f"({p['rollout_compiled_tokens_per_s']:,.0f} vs {p['rollout_pipeline_tokens_per_s']:,.0f} tokens/s)",
        ),
        *(
            [
                (
                    "rollout: adapters in model dtype / fp32",
                    f"{p['rollout_cast_tokens_per_s'] / p['rollout_ours_tokens_per_s']:.2f}x  "
                    f"({p['rollout_cast_tokens_per_s']:,.0f} vs {p['rollout_ours_tokens_per_s']:,.0f} tokens/s)",
                )
            ]
            if "rollout_cast_tokens_per_s" in p
            else []
        ),
        (
            "ZeRO-3 2 ranks: gathered / sharded",
            f"{r['ratios']['zero3_gathered_over_sharded']:.2f}x  "
            f"({z['gathered_tokens_per_s']:,.0f} vs {z['sharded_tokens_per_s']:,.0f} tokens/s)",
        ),
        (
            f"update peak: mb 2 / mb {g}",
            f"{r['ratios'][f'update_peak_mb2_over_mb{g}']:.2f}  "
            f"({u[2]['update_peak_above_start_mb']:,.1f} vs {u[g]['update_peak_above_start_mb']:,.1f} MB above start)",
        ),
    ]
    if "planner_peak_mb" in p:
        rows.append(("peak: measured / planner", f"{p['measured_peak_mb']:,.0f} / {p['planner_peak_mb']:,.0f} MB"))
        if "roofline_fraction" in p:
            rows.append(
                (
                    "AR decode vs HBM roofline",
                    f"{100 * p['roofline_fraction']:.1f}% ({p['decode_step_s'] * 1e3:.1f} ms/step)",
                )
            )
    head = f"device: {r['device']}; model: {r['model']}; {r['size']}x{r['size']}, G={g}, {r['steps']} timed steps"
    width = max(len(k) for k, _ in rows)
    lines = [head] + [f"  {k:<{width}}  {v}" for k, v in rows]
    if "decode_step_counts" in r:
        from .decode_counts import format_counts

        lines += ["decode_step_counts:", format_counts(r["decode_step_counts"])]
    return "\n".join(lines)


def parse_args(argv):
    d = BenchConfig()
    p = parser_for("bench")
    p.add_argument(
        "--model", default=None, help="GLM-Image pipeline: a directory or a Hub id (default: build the tiny one)"
    )
    p.add_argument("--revision", default=None, help="Hub revision of --model (commit, branch or tag; default main)")
    p.add_argument("--data", default=None, help="prompt file (default: the tiny learnable set)")
    p.add_argument("--config", default=str(CONFIG), help="training YAML the runs start from")
    p.add_argument("--deepspeed", default=str(ZERO3), help="DeepSpeed config of the update runs")
    p.add_argument("--size", type=int, default=d.size, help="image height = width in pixels")
    p.add_argument("--group-size", type=int, default=d.group_size, help="samples per prompt")
    p.add_argument("--steps", type=int, default=d.steps, help="timed steps after one warm-up step")
    p.add_argument("--repeats", type=int, default=d.repeats, help="repeats of each side-by-side comparison")
    p.add_argument("--out", default=d.out, help="directory for bench.json")
    p.add_argument(
        "--hbm-gbps", type=float, default=None, help="GPU memory bandwidth for the roofline (default: by device name)"
    )
    p.add_argument(
        "--gathers",
        action="store_true",
        help="measure only what a LoRA step gathers under ZeRO-3 on 2 ranks (DeepSpeed's comms logger), per "
        "micro-batch size, with the reference log-probs in the update vs in the rollout's gather",
    )
    p.add_argument("--gathers-micro-batches", default="2,4,8", help="with --gathers: micro-batch sizes to measure")
    p.add_argument(
        "--count-variants",
        default=",".join(COUNT_VARIANTS),
        help="the decode_step_counts section's loops, comma-separated (glm_grpo_ds/profiling/decode_counts.py); "
        "none: skip the section",
    )
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--micro-batch", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="training config overrides (key=value), as for `glm-grpo train`")
    a = parse_with_overrides(p, argv)
    a.count_variants = "" if a.count_variants == "none" else a.count_variants
    unknown = [v for v in a.count_variants.split(",") if v and v not in COUNT_VARIANTS]
    if unknown:
        p.error(f"--count-variants: unknown {unknown[0]!r}; choose from {', '.join(COUNT_VARIANTS)} or none")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.worker:
        from ..ds.dist import shutdown

        result = WORKERS[a.worker](a)
        if int(os.environ.get("RANK", "0")) == 0:
            Path(a.result).write_text(json.dumps(result))
        shutdown()
        return 0
    if os.environ.get("DS_ACCELERATOR") != "cpu":  # a GPU benchmark must not quietly time the CPU
        from ..runtime.cuda_check import refusal

        problem = refusal()
        if problem:
            print(f"glm-grpo profile bench: {problem}", file=sys.stderr)
            return 2
    if a.model is not None:
        from ..model.source import resolve_model
        from ..testing.random_model import materialize

        try:
            materialize(a.model, "--model")  # a random: model's configs (glm_grpo_ds/model/random_weights.py)
            a.model = str(resolve_model(a.model, a.revision, flag="--model", revision_flag="--revision").path)
        except FileNotFoundError as err:
            print(f"glm-grpo profile bench: {err}", file=sys.stderr)
            return 2
    tmp = Path(tempfile.mkdtemp(prefix="glm_grpo_bench_"))
    try:
        if a.model is None:
            from ..testing.tiny import build_tiny_pipeline

            a.model = str(build_tiny_pipeline(tmp / "tiny"))
        if a.data is None:  # the learnable prompt set, its targets rendered by this model's decoder
            from ..config import DecoderConfig
            from ..testing.tiny_data import write_tiny_dataset

            a.data = str(
                write_tiny_dataset(a.model, tmp / "data", a.size, a.size, DecoderConfig(num_inference_steps=2))
            )
        a.workdir = str(tmp)
        result = run_gathers(a) if a.gathers else run_all(a)
    except RuntimeError as err:  # a worker failed: its own output tail is in the message
        print(f"glm-grpo profile bench: {err}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "bench_gathers.json" if a.gathers else "bench.json"
    (out / name).write_text(json.dumps(result, indent=2))
    print(format_gathers(result) if a.gathers else format_table(result))
    print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":  # a process entry point (the bench's ranks too): no interpreter teardown
    from ..runtime import process_exit

    raise SystemExit(process_exit.exit_now(main()))
