"""Knob sweep on the learnable tiny world (the `make demo` task): one short GRPO run per setting, each
changing one knob from launch/configs/tiny_world.yaml, then a Markdown table and a plot of the
held-out eval reward per run (the table and plot in docs/sweep.md come from this script).

    glm-grpo tiny-world outputs/world
    python benchmarks/sweep_world.py [--world outputs/world] [--out outputs/sweep] [--steps 60] [--only g4,beta]

Every run: 2 CPU ranks, ZeRO-3, LoRA, 8-bit AdamW, the same seed and the same eval (8 held-out
rephrasings, fixed sampling seeds, every 20 steps). Progress is the fraction of the way from the start
eval reward to the best (`glm-grpo progress`); in a run with a second reward (the hack variants), of the world's
own reward, the first. Runs go one after the other (each uses every core).

Over seeds (issue #51): ``--seeds 0,1,2,3,4`` runs each variant once per seed (override ``seed=N``; the eval's
sampling seeds stay fixed, so every run starts from the same eval reward), ``--lr 3e-4`` runs them at another
learning rate (``optimizer.lr``; the lr and the seed are in the run names, so runs at two lrs or seeds never
share a directory), ``--append`` adds this invocation's runs to the report already in --out (a run of the same
name is replaced), ``--report-only`` rewrites the report from --out's sweep.json without running anything.
Where a configuration (variant x lr) has two or more seeds the report adds, per configuration, the mean
fraction of the way over seeds with its 95 % Student t interval and the per-seed values, and the paired
differences (variant - ``--baseline``, same lr and seed) with their interval and whether it holds 0:

    python benchmarks/sweep_world.py --out outputs/sweep51 --only bf16,bf16_merged --seeds 0,1,2 --append
    python benchmarks/sweep_world.py --out outputs/sweep51 --only bf16,bf16_merged --seeds 0,1,2 --lr 3e-4 --append
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from glm_grpo_ds.runtime.local_launch import deepspeed_command

# the world's reward and one hacked by design (testing/tiny_data.py darkness: 1 - the mean pixel)
HACKED = "rewards=[{name: colour_layout}, {name: 'python:glm_grpo_ds.testing.tiny_data:darkness', label: dark}]"
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
    # the objectives (grpo.objective) differ from the clip only where a ratio leaves 1: with reused rollouts
    "iters2_cispo": (
        "num_iterations 2, CISPO (the ratio capped at 5 and detached)",
        ["grpo.num_iterations=2", "grpo.objective=cispo"],
    ),
    "iters2_sapo": (
        "num_iterations 2, SAPO (the soft gate, temperatures 1 / 1.05)",
        ["grpo.num_iterations=2", "grpo.objective=sapo"],
    ),
    "iters2_vespo": (
        "num_iterations 2, VESPO (each sequence's A log pi weighted by phi(w), TRL's k / lambda)",
        ["grpo.num_iterations=2", "grpo.objective=vespo"],
    ),
    # GARDO's diversity-aware shaping of the positive advantages (grpo.diversity_features), against base
    "diversity_pixels": (
        "GARDO's diversity shaping of the positive advantages, pixel features",
        ["grpo.diversity_features=pixels"],
    ),
    # GARDO's disagreement gate (grpo.disagreement_gate) against a second reward hacked by design (it pays for dark
    # images whatever the prompt asks): the world's reward first (the main one), then the hacked one
    "hack": ("the world's reward plus a reward paying for dark images (weight 1 each)", [HACKED]),
    "hack_gate1.5": (
        "the same, advantages of samples whose rewards disagree by over 1.5 within-group std set to 0",
        [HACKED, "grpo.disagreement_gate=1.5"],
    ),
    # more updates per rollout by splitting it (batch.mini_batches), against num_iterations 2 (iters2)
    "mb2": (
        "2 mini-batches per rollout (two optimizer steps of 4 sequences)",
        ["batch.mini_batches=2", "batch.micro_batch_size=4"],
    ),
    # the adaptive entropy coefficient (grpo.entropy_target): the bonus from when the entropy falls to 1 nat
    "entropy_target1": ("adaptive entropy coefficient, target 1 nat (from 0, 0.005 a step)", ["grpo.entropy_target=1"]),
    # the KL's reference reset to the policy every 10 steps (grpo.ref_sync_steps), against beta0.04 without resets
    "beta0.04_reset10": (
        "KL beta 0.04, the reference reset every 10 steps",
        ["grpo.beta=0.04", "grpo.ref_sync_steps=10"],
    ),
    # the evaluations on the adapter's moving average (lora.ema_decay), against base
    "ema0.9": ("evaluations on the adapter's moving average, decay 0.9", ["lora.ema_decay=0.9"]),
    # 0.25, not the paper's 0.2: the world's 4 target-grid tokens a sequence make 0.2 keep under one (refused since
    # 2026-11-27; docs/sweep.md's rows at 0.2 were measured before)
    "top_entropy0.25": ("train on the top 25 % of tokens by entropy", ["grpo.top_entropy_quantile=0.25"]),
    "entropy0.01": ("entropy bonus 0.01", ["grpo.entropy_coef=0.01"]),
    "tis": ("sampler correction token_truncate (cap 3)", ["grpo.sampler_correction=token_truncate"]),
    "win_rate": ("advantages from within-group win rates", ["grpo.reward_combination=win_rate"]),
    "bf16": ("model.dtype bf16 (the mismatch metrics in bf16)", ["model.dtype=bf16"]),
    "bf16_tis": (
        "bf16 with sampler correction token_truncate",
        ["model.dtype=bf16", "grpo.sampler_correction=token_truncate"],
    ),
    "top_entropy0.25_entropy0.01": (
        "top 25 % of tokens by entropy, with an entropy bonus 0.01 on them",
        ["grpo.top_entropy_quantile=0.25", "grpo.entropy_coef=0.01"],
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
    # issue #51: the exact sampler at graph speed (the adapter unmerged, its low-rank path fused); on a CPU the
    # decode step is compiled, not captured
    "bf16_fused": (
        "bf16, the rollout samples with LoRA unmerged through the fused low-rank path, compiled (rollout.fuse_lora "
        "+ compile)",
        ["model.dtype=bf16", "rollout.fuse_lora=true", "rollout.compile=true"],
    ),
    # what the GPU configs sample: a CUDA graph replays the eager fused step bitwise; on a CPU the step runs eager
    # (the compiled one above adds inductor's bf16 rounding: benchmarks/sampler_gap.py)
    "bf16_fused_eager": (
        "bf16, the rollout samples with LoRA unmerged through the fused low-rank path, eager (rollout.fuse_lora "
        "+ cuda_graph, uncaptured on a CPU)",
        ["model.dtype=bf16", "rollout.fuse_lora=true", "rollout.cuda_graph=true"],
    ),
    # issue #52: the rollout of step t+1 sampled with step t's weights (beside step t's decode), corrected by the
    # sampler correction; ZeRO-2 (one_step_off refuses ZeRO-3), against the same run on-policy
    "tis_zero2": (
        "sampler correction token_truncate, ZeRO-2 (one_step_off's on-policy baseline)",
        ["grpo.sampler_correction=token_truncate"],
    ),
    "one_step_off": (
        "one step off policy (rollout.one_step_off), sampler correction token_truncate, ZeRO-2",
        ["rollout.one_step_off=true", "grpo.sampler_correction=token_truncate"],
    ),
    # off-policy sequence masking on the one-step-off samples (a mean log pi_sampler - log pi above 0.02 with a
    # negative advantage leaves the policy term)
    "one_step_off_opsm": (
        "one step off policy, sampler correction token_truncate, off-policy sequence mask 0.02, ZeRO-2",
        ["rollout.one_step_off=true", "grpo.sampler_correction=token_truncate", "grpo.off_policy_mask_threshold=0.02"],
    ),
}
ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "launch" / "configs" / "tiny_world.yaml"
DS_CONFIG = ROOT / "ds_configs" / "zero3.json"
VARIANT_DS_CONFIG = dict.fromkeys(("tis_zero2", "one_step_off", "one_step_off_opsm"), "zero2.json")  # else DS_CONFIG
LEVEL = 0.95


def t_interval(values: list[float], level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean, low, high)``: Student's t interval of the mean of ``values``, mean +- t(0.5 + level / 2, n - 1) x
    sd / sqrt(n) with the sample sd (n - 1); low = high = nan for fewer than two values."""
    from scipy.stats import t

    n = len(values)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def paired_difference(variant: dict[int, float], baseline: dict[int, float], level: float = LEVEL) -> dict:
    """Per-seed ``variant - baseline`` over the seeds both have (``{seed: value}`` each): the differences, their
    mean with its t interval and whether the interval holds 0 (None without an interval)."""
    seeds = sorted(set(variant) & set(baseline))
    diffs = [variant[s] - baseline[s] for s in seeds]
    mean, low, high = t_interval(diffs, level)
    return {
        "seeds": seeds,
        "diffs": diffs,
        "mean": mean,
        "ci": [low, high],
        "holds_0": None if math.isnan(low) else bool(low <= 0 <= high),
    }


def run_name(variant: str, lr: float | None, seed: int | None) -> str:
    """The run's name and directory: the variant, then the lr and the seed where given (so runs at two lrs or
    seeds never overwrite each other); a bare variant name where neither is (the single-seed sweep)."""
    return variant + (f"_lr{lr:g}" if lr is not None else "") + (f"_seed{seed}" if seed is not None else "")


def seed_summary(results: list[dict], baseline: str | None, level: float = LEVEL) -> dict:
    """Per configuration (variant x lr, in first-seen order) with two or more seeds: the per-seed fractions of
    the way, their mean with its t interval, the mean |dlogp| and k3 mismatch over seeds; and the paired
    differences of each other variant against ``baseline`` at the same lr (the seeds both ran)."""
    configs: dict[tuple[str, float], list[dict]] = {}
    for r in results:
        configs.setdefault((r.get("variant", r["name"]), r["lr"]), []).append(r)
    rows = []
    for (variant, lr), runs in configs.items():
        seen: dict[int, str] = {}
        for r in runs:  # e.g. a run at --lr 3e-3 and one at the config's own 3e-3: one configuration, two names
            if seen.setdefault(r["seed"], r["name"]) != r["name"]:
                raise ValueError(
                    f"runs {seen[r['seed']]} and {r['name']} are both {variant} at lr {lr:g}, seed {r['seed']}: "
                    "report them from separate --out directories"
                )
        if len(seen) < 2:
            continue
        fractions = {r["seed"]: r["eval"][3] for r in sorted(runs, key=lambda r: r["seed"])}
        mean, low, high = t_interval(list(fractions.values()), level)

        rows.append(
            {
                "variant": variant,
                "lr": lr,
                "fractions": fractions,
                "mean": mean,
                "ci": [low, high],
                "logp_abs_mean": sum(r["mismatch"]["logp_abs_mean"] for r in runs) / len(runs),
                "kl_k3": sum(r["mismatch"]["kl_k3"] for r in runs) / len(runs),
                "wall_s": sum(r["wall_s"] for r in runs) / len(runs),
            }
        )
    paired = []
    by_key = {(row["variant"], row["lr"]): row for row in rows}
    for row in rows:
        base = by_key.get((baseline, row["lr"]))
        if base is None or row["variant"] == baseline:
            continue
        paired.append(
            {"variant": row["variant"], "baseline": baseline, "lr": row["lr"]}
            | paired_difference(row["fractions"], base["fractions"], level)
        )
    return {"level": level, "configurations": rows, "paired": paired}


def deepspeed_launch(args: list[str], procs: int, log) -> int:
    """``deepspeed --num_gpus PROCS --master_port FREE ARGS``, its output to ``log``; the exit status."""
    cmd, env = deepspeed_command(procs, args, cpu=False)  # CPU ranks: the caller's DS_ACCELERATOR, as before
    return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode


def run_one(
    variant: str,
    world: Path,
    out: Path,
    steps: int,
    procs: int,
    lr: float | None = None,
    seed: int | None = None,
    extra: tuple[str, ...] = (),
    launch=None,
) -> dict:
    """One run of ``variant`` (at ``lr`` / ``seed`` where given, else the config's), started by ``launch(args,
    procs, log)`` (default :func:`deepspeed_launch`), and its row of the report."""
    name = run_name(variant, lr, seed)
    overrides = list(VARIANTS[variant][1])
    overrides += [f"optimizer.lr={lr!r}"] if lr is not None else []
    overrides += [f"seed={seed}"] if seed is not None else []
    run_dir = out / name
    args = [
        "--module",
        "glm_grpo_ds.train",
        "--config",
        str(CONFIG),
        "--deepspeed",
        str(ROOT / "ds_configs" / VARIANT_DS_CONFIG[variant] if variant in VARIANT_DS_CONFIG else DS_CONFIG),
        f"model.path={world / 'model'}",
        f"data.train_file={world / 'train.jsonl'}",
        f"eval.file={world / 'heldout.jsonl'}",
        f"max_steps={steps}",
        f"output_dir={run_dir}",
        "overwrite_output_dir=true",  # a re-run of the sweep replaces its runs
        "logging.progress_bar=false",
        "logging.gallery_steps=0",
        *overrides,
        *extra,
    ]
    t0 = time.time()
    with open(out / f"{name}.log", "w") as log:
        status = (launch or deepspeed_launch)(args, procs, log)
    if status != 0:
        raise subprocess.CalledProcessError(status, args)
    return collect(run_dir, name, variant, world, steps, time.time() - t0)


def collect(run_dir: Path, name: str, variant: str, world: Path, steps: int, wall: float) -> dict:
    """One finished run's row of the report, from its output_dir (config.json, eval.jsonl, metrics.jsonl)."""
    from glm_grpo_ds.commands.progress import run_progress

    # the training reward's first and last 10 steps (fewer in a run of under 20 steps, as in the test's smoke)
    train_cfg = json.loads((run_dir / "config.json").read_text())["train"]
    # with a second reward (the hack variants) the way is the world's own reward's, the first
    world_reward = f"reward/{train_cfg['rewards'][0]['label'] or train_cfg['rewards'][0]['name']}"
    key = "reward_mean" if len(train_cfg["rewards"]) == 1 else world_reward
    res = run_progress(run_dir, world / "best.json", window=max(1, min(10, steps // 2)), key=key)
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    steps_ = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    def values(key):
        return [r[key] for r in steps_ if r.get(key) is not None]

    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")

    return {
        "name": name,
        "variant": variant,
        # what the run trained with (its config.json), also where the config's own lr or seed was kept
        "lr": train_cfg["optimizer"]["lr"],
        "seed": train_cfg["seed"],
        "wall_s": wall,
        "eval": res["eval"],
        "train": res["train"],
        "measured_on": key,
        "curve": [(r["step"], r[f"eval/{key}"]) for r in evals],
        # the share of dark images at the first and the last evaluation (what the hack variants' second reward pays)
        "dark_fraction": (evals[0]["eval/images/dark_fraction"], evals[-1]["eval/images/dark_fraction"]),
        # policy entropy over the first and last 10 steps; the sampler-vs-trainer mismatch over all steps
        "entropy": (mean(values("entropy")[:10]), mean(values("entropy")[-10:])),
        "frac_reward_zero_std": mean(values("frac_reward_zero_std")),
        "off_policy_masked": mean(values("off_policy/masked_fraction")),  # grpo.off_policy_mask_threshold; else NaN
        "mismatch": {
            "logp_abs_mean": mean(values("mismatch/logp_abs_mean")),
            "logp_abs_max": max(values("mismatch/logp_abs_max"), default=float("nan")),
            "kl_k3": mean(values("mismatch/kl_k3")),
            "frac_beyond": mean(values("mismatch/frac_beyond")),
        },
    }


def _fmt_lr(lr: float) -> str:
    return f"{lr:g}"


def seed_tables(summary: dict) -> list[str]:
    """The Markdown of :func:`seed_summary`: the configurations' fractions of the way, then the paired differences."""
    pct = round(summary["level"] * 100)
    lines = [
        f"| variant | lr | seeds | fraction of the way per seed | mean fraction [{pct} % t interval] | "
        "mean abs dlogp | k3 KL(sampler, trainer) | wall time per run |",
        "|---|---|---:|---|---|---:|---:|---:|",
    ]
    for c in summary["configurations"]:
        per_seed = ", ".join(f"{s}: {f:.3f}" for s, f in c["fractions"].items())
        lines.append(
            f"| {c['variant']} | {_fmt_lr(c['lr'])} | {len(c['fractions'])} | {per_seed} | {c['mean']:.3f} "
            f"[{c['ci'][0]:.3f}, {c['ci'][1]:.3f}] | {c['logp_abs_mean']:.2e} | {c['kl_k3']:.2e} | "
            f"{c['wall_s'] / 60:.1f} min |"
        )
    if summary["paired"]:
        lines += [
            "",
            f"| variant - baseline | lr | seeds paired | difference per seed | mean difference [{pct} % t interval] "
            "| interval holds 0 |",
            "|---|---|---:|---|---|---|",
        ]
        for d in summary["paired"]:
            per_seed = ", ".join(f"{s}: {x:+.3f}" for s, x in zip(d["seeds"], d["diffs"]))
            holds = {None: "-", True: "yes", False: "**no**"}[d["holds_0"]]
            lines.append(
                f"| {d['variant']} - {d['baseline']} | {_fmt_lr(d['lr'])} | {len(d['seeds'])} | {per_seed} | "
                f"{d['mean']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}] | {holds} |"
            )
    return lines


def write_report(results: list[dict], out: Path, steps: int, baseline: str | None = None) -> dict:
    """sweep.md (the tables), sweep.json (every run), sweep.png (the eval curves); with seeds also the
    per-configuration tables of :func:`seed_summary` and sweep_seeds.json. Returns the seed summary."""
    lines = [
        f"| run | change | eval reward start -> end ({steps} steps) | fraction of the way | "
        "eval at step 20 | train reward first 10 -> last 10 | wall time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        e, t = r["eval"], r["train"]
        at20 = dict(r["curve"]).get(20, float("nan"))
        lines.append(
            f"| {r['name']} | {VARIANTS[r.get('variant', r['name'])][0]} | {e[0]:.3f} -> {e[1]:.3f} | {e[3]:.2f} | "
            f"{at20:.3f} | {t[0]:.3f} -> {t[1]:.3f} | {r['wall_s'] / 60:.1f} min |"
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
    # runs of sweeps before the seeds (a sweep.json read by --append) carry no lr / seed: not configurations
    summary = seed_summary([r for r in results if "seed" in r], baseline)
    if summary["configurations"]:
        lines += ["", *seed_tables(summary)]
        (out / "sweep_seeds.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    (out / "sweep.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "sweep.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    # with seeds, one colour per configuration (variant x lr) and its label once; else one line per run
    colours: dict = {}
    for r in results:
        steps_, rewards = zip(*r["curve"])
        key = (r.get("variant", r["name"]), r.get("lr")) if summary["configurations"] else r["name"]
        first = key not in colours
        colours.setdefault(key, f"C{len(colours) % 10}")
        label = (f"{key[0]} lr {_fmt_lr(key[1])}" if isinstance(key, tuple) else key) if first else None
        alpha = 0.6 if isinstance(key, tuple) else 1.0
        ax.plot(steps_, rewards, marker="o", color=colours[key], label=label, alpha=alpha)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("held-out eval reward (best 1.0)")
    ax.set_title("tiny world: one knob at a time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "sweep.png", dpi=100)
    plt.close(fig)
    print(f"wrote {out / 'sweep.md'}, {out / 'sweep.png'}, {out / 'sweep.json'}")
    return summary


def _fail(message: str) -> int:
    print(f"sweep_world: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None, launch=None) -> int:
    """The command line; ``launch`` starts each run (default :func:`deepspeed_launch`; the test's smoke starts the
    same ranks without the launcher's processes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="outputs/world")
    parser.add_argument("--out", default="outputs/sweep")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument(
        "--only", default="", help="comma-separated run names (default: all of " + ", ".join(VARIANTS) + ")"
    )
    parser.add_argument(
        "--seeds", default="", help="comma-separated seeds, e.g. 0,1,2,3,4: each variant once per seed (seed=N)"
    )
    parser.add_argument("--lr", default="", help="run every variant at this optimizer.lr (default: the config's)")
    parser.add_argument(
        "--baseline", default="", help="the variant the paired differences are against (default: bf16 when run)"
    )
    parser.add_argument(
        "--append", action="store_true", help="keep the runs of --out's sweep.json; a run of the same name is replaced"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the report from --out's sweep.json; run nothing"
    )
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="more overrides for every run, not in the run names (e.g. eval.num_prompts=2 for a quick check)",
    )
    args = parser.parse_args(argv)
    world, out = Path(args.world), Path(args.out)
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        return _fail(f"--seeds {args.seeds!r} is not a comma-separated list of integers; e.g. --seeds 0,1,2,3,4")
    if any(x < 0 for x in seeds) or len(set(seeds)) != len(seeds):
        return _fail(f"--seeds {args.seeds!r}: give distinct seeds >= 0, e.g. --seeds 0,1,2,3,4")
    try:
        lr = float(args.lr) if args.lr else None
    except ValueError:
        return _fail(f"--lr {args.lr!r} is not a number; e.g. --lr 3e-4")
    if lr is not None and not (math.isfinite(lr) and lr > 0):
        return _fail(f"--lr {args.lr!r} must be a positive number; e.g. --lr 3e-4")
    if args.steps < 2:
        return _fail(f"--steps {args.steps} leaves no eval after the first; give --steps 2 or more")
    bad_set = [kv for kv in args.set if "=" not in kv]
    if bad_set:
        return _fail(f"--set {bad_set[0]!r} is not KEY=VALUE; e.g. --set eval.num_prompts=2")
    names = [n for n in args.only.split(",") if n] or list(VARIANTS)
    unknown = [n for n in names + ([args.baseline] if args.baseline else []) if n not in VARIANTS]
    if unknown:
        return _fail(f"unknown run {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    previous: list[dict] = []
    if args.append or args.report_only:
        if (out / "sweep.json").is_file():
            previous = json.loads((out / "sweep.json").read_text(encoding="utf-8"))
        elif args.report_only:
            return _fail(f"--report-only: {out / 'sweep.json'} not found; run the sweep into --out {out} first")
    baseline = args.baseline or (
        "bf16" if "bf16" in names or any(r.get("variant") == "bf16" for r in previous) else None
    )
    if args.report_only:
        try:
            write_report(previous, out, args.steps, baseline)
        except ValueError as err:
            return _fail(str(err))
        return 0
    if not (world / "best.json").is_file():
        return _fail(f"{world / 'best.json'} not found; run `glm-grpo tiny-world {world}` first")
    try:  # two runs of one configuration and seed under two names (--append) refused before anything runs
        seed_summary([r for r in previous if "seed" in r], baseline)
    except ValueError as err:
        return _fail(str(err))
    out.mkdir(parents=True, exist_ok=True)
    results = previous
    for name in names:
        for seed in seeds or [None]:
            run = run_name(name, lr, seed)
            print(f"[sweep] {run}: {VARIANTS[name][0]}", flush=True)
            result = run_one(name, world, out, args.steps, args.procs, lr, seed, tuple(args.set), launch)
            results = [r for r in results if r["name"] != run] + [result]
            write_report(results, out, args.steps, baseline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
