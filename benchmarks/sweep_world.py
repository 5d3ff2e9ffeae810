"""Knob sweep on the learnable tiny world (the `make demo` task): one short GRPO run per setting, each
changing one knob from launch/configs/tiny_world.yaml, then a Markdown table and a plot of the
held-out eval reward per run (the table and plot in docs/sweep.md come from this script).

    glm-grpo tiny-world outputs/world
    python benchmarks/sweep_world.py [--world outputs/world] [--out outputs/sweep] [--steps 60] [--only g4,beta]

Every run: 2 CPU ranks, ZeRO-3, LoRA, 8-bit AdamW, the same seed and the same eval (8 held-out
rephrasings, fixed sampling seeds, every 20 steps). Progress is the fraction of the way from the start
eval reward to the best (`glm-grpo progress`). Runs go one after the other (each uses every core).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

# name -> (what changes, config overrides); "base" is launch/configs/tiny_world.yaml as it is
VARIANTS = {
    "base": ("as configured: G=8, beta=0, advantage scale group, 1 iteration, LoRA r=16", []),
    "g4": ("group size 4", ["grpo.group_size=4", "batch.micro_batch_size=4"]),
    "g16": ("group size 16", ["grpo.group_size=16"]),
    "beta0.04": ("KL beta 0.04", ["grpo.beta=0.04"]),
    "scale_batch": ("advantage scale: batch std", ["grpo.advantage_estimator=batch"]),
    "iters2": ("num_iterations 2", ["grpo.num_iterations=2"]),
    "r4": ("LoRA r=4 (alpha 8)", ["lora.r=4", "lora.alpha=8"]),
    "r64": ("LoRA r=64 (alpha 128)", ["lora.r=64", "lora.alpha=128"]),
    # the loss options of docs/training.md#loss-options (one iteration: a ratio is exactly 1, so GSPO differs
    # from token ratios only with reused rollouts, compared with iters2)
    "iters2_gspo": (
        "num_iterations 2, sequence-level ratios (GSPO)",
        ["grpo.num_iterations=2", "grpo.importance_sampling_level=sequence"],
    ),
    "top_entropy0.2": ("train on the top 20 % of tokens by entropy", ["grpo.top_entropy_quantile=0.2"]),
    "entropy0.01": ("entropy bonus 0.01", ["grpo.entropy_coef=0.01"]),
    "tis": ("sampler correction token_truncate (cap 3)", ["grpo.sampler_correction=token_truncate"]),
    "win_rate": ("advantages from within-group win rates", ["grpo.reward_combination=win_rate"]),
    "bf16": ("model.dtype bf16 (the mismatch metrics in bf16)", ["model.dtype=bf16"]),
    "bf16_tis": (
        "bf16 with sampler correction token_truncate",
        ["model.dtype=bf16", "grpo.sampler_correction=token_truncate"],
    ),
    "top_entropy0.2_entropy0.01": (
        "top 20 % of tokens by entropy, with an entropy bonus 0.01 on them",
        ["grpo.top_entropy_quantile=0.2", "grpo.entropy_coef=0.01"],
    ),
    # the world's config leaves the preview grid out of the loss (its DiT renders the target grid only)
    "preview_in_loss": ("the preview grid's tokens in the loss (weight 1)", ["grpo.preview_in_loss=true"]),
    "preview_weight0.5": (
        "the preview grid's tokens in the loss, weighing 0.5 in the policy term",
        ["grpo.preview_in_loss=true", "grpo.preview_weight=0.5"],
    ),
    "bf16_seq_mask": (
        "bf16 with sampler correction sequence_mask (cap 3)",
        ["model.dtype=bf16", "grpo.sampler_correction=sequence_mask"],
    ),
    "bf16_adapters": (
        "bf16, the rollout samples with the adapters in bf16 (rollout.adapters_in_model_dtype)",
        ["model.dtype=bf16", "rollout.adapters_in_model_dtype=true"],
    ),
    "bf16_merged": (
        "bf16, the rollout samples with LoRA merged into the base weights (rollout.merge_lora + cuda_graph)",
        ["model.dtype=bf16", "rollout.merge_lora=true", "rollout.cuda_graph=true"],
    ),
}
CONFIG = "launch/configs/tiny_world.yaml"


def run_one(name: str, overrides: list[str], world: Path, out: Path, steps: int, procs: int) -> dict:
    run_dir = out / name
    with socket.socket() as s:  # a free port: the launcher's default 29500 may be another job's
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        "deepspeed",
        "--num_gpus",
        str(procs),
        "--master_port",
        str(port),
        "--module",
        "glm_grpo_ds.train",
        "--config",
        CONFIG,
        "--deepspeed",
        "ds_configs/zero3.json",
        f"model.path={world / 'model'}",
        f"data.train_file={world / 'train.jsonl'}",
        f"eval.file={world / 'heldout.jsonl'}",
        f"max_steps={steps}",
        f"output_dir={run_dir}",
        "overwrite_output_dir=true",  # a re-run of the sweep replaces its runs
        "logging.progress_bar=false",
        "logging.gallery_steps=0",
        *overrides,
    ]
    t0 = time.time()
    with open(out / f"{name}.log", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.time() - t0
    from glm_grpo_ds.commands.progress import run_progress

    res = run_progress(run_dir, world / "best.json", window=10)
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    steps_ = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    def values(key):
        return [r[key] for r in steps_ if r.get(key) is not None]

    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")

    return {
        "name": name,
        "wall_s": wall,
        "eval": res["eval"],
        "train": res["train"],
        "curve": [(r["step"], r["eval/reward_mean"]) for r in evals],
        # policy entropy over the first and last 10 steps; the sampler-vs-trainer mismatch over all steps
        "entropy": (mean(values("entropy")[:10]), mean(values("entropy")[-10:])),
        "frac_reward_zero_std": mean(values("frac_reward_zero_std")),
        "mismatch": {
            "logp_abs_mean": mean(values("mismatch/logp_abs_mean")),
            "logp_abs_max": max(values("mismatch/logp_abs_max"), default=float("nan")),
            "kl_k3": mean(values("mismatch/kl_k3")),
            "frac_beyond": mean(values("mismatch/frac_beyond")),
        },
    }


def write_report(results: list[dict], out: Path, steps: int) -> None:
    lines = [
        f"| run | change | eval reward start -> end ({steps} steps) | fraction of the way | "
        "eval at step 20 | train reward first 10 -> last 10 | wall time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        e, t = r["eval"], r["train"]
        at20 = dict(r["curve"]).get(20, float("nan"))
        lines.append(
            f"| {r['name']} | {VARIANTS[r['name']][0]} | {e[0]:.3f} -> {e[1]:.3f} | {e[3]:.2f} | {at20:.3f} | "
            f"{t[0]:.3f} -> {t[1]:.3f} | {r['wall_s'] / 60:.1f} min |"
        )
    lines += [
        "",
        "| run | entropy, first 10 -> last 10 steps (nats) | mean abs dlogp | max abs dlogp | k3 KL(sampler, trainer) "
        "| tokens beyond 0.1 | groups with zero reward std |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        h, m = r["entropy"], r["mismatch"]
        lines.append(
            f"| {r['name']} | {h[0]:.3f} -> {h[1]:.3f} | {m['logp_abs_mean']:.2e} | {m['logp_abs_max']:.2e} | "
            f"{m['kl_k3']:.2e} | {m['frac_beyond']:.2%} | {r.get('frac_reward_zero_std', float('nan')):.1%} |"
        )
    (out / "sweep.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "sweep.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        steps_, rewards = zip(*r["curve"])
        ax.plot(steps_, rewards, marker="o", label=r["name"])
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("held-out eval reward (best 1.0)")
    ax.set_title("tiny world: one knob at a time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "sweep.png", dpi=100)
    print(f"wrote {out / 'sweep.md'}, {out / 'sweep.png'}, {out / 'sweep.json'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="outputs/world")
    parser.add_argument("--out", default="outputs/sweep")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument(
        "--only", default="", help="comma-separated run names (default: all of " + ", ".join(VARIANTS) + ")"
    )
    args = parser.parse_args(argv)
    world, out = Path(args.world), Path(args.out)
    if not (world / "best.json").is_file():
        print(f"sweep_world: {world / 'best.json'} not found; run `glm-grpo tiny-world {world}` first", file=sys.stderr)
        return 2
    names = [n for n in args.only.split(",") if n] or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"sweep_world: unknown run {unknown[0]!r}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in names:
        print(f"[sweep] {name}: {VARIANTS[name][0]}", flush=True)
        results.append(run_one(name, VARIANTS[name][1], world, out, args.steps, args.procs))
        write_report(results, out, args.steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
