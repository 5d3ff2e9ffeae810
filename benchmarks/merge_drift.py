"""Merged against exact sampling on GLM-Image's real-width slice at the shipped GPU configs' lr, r and optimizer
(issue #51, item 4a): how much of the adapter's delta a bf16 merge keeps, step by step, and what the samplers'
log-probs then differ from the trainer's.

    glm-grpo tiny-model outputs/slice --real-width --ar-layers 1 --dit-layers 1        # once: 3.4 GB, ~45 s
    python benchmarks/merge_drift.py --model outputs/slice --out outputs/merge_drift --steps 50
    python benchmarks/merge_drift.py --out outputs/merge_drift --report-only           # the table again

Trains the slice twice with launch/configs/glm_image_slice_cpu.yaml (bf16 AR, 2 CPU ranks under ZeRO-3, LoRA r=64
alpha 128 on the six projections, 8-bit AdamW at lr 1e-5, beta 0.04; here at 64x64 with 1 decoder step, which
changes the reward and the sequence lengths, not the optimizer's step sizes): once sampling with the adapters
fused and unmerged (``rollout.fuse_lora``, the exact sampler the GPU configs ship) and once with them merged into
the bf16 weights (``rollout.merge_lora``). Both save the adapter every step. Per step it prints:

- ``kept``: of the adapter's delta D = s·B·A over all adapted linears, the part a merge keeps,
  <bf16(W + D) - W, D> / <D, D> (1 = all of it), and the merge's error ||bf16(W + D) - W - D|| / ||D||;
  computed from the exact run's adapters (the adapter the merged run would merge at that step);
- each run's first-iteration ``mismatch/logp_abs_mean`` and ``mismatch/kl_k3`` (sampler against trainer, from
  its metrics.jsonl), and its reward.

Writes OUT/merge_drift.json; docs/memory-and-speed.md's table "Merged sampling at the real widths" comes from it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from glm_grpo_ds.runtime.local_launch import deepspeed_command  # noqa: E402

CONFIG = "launch/configs/glm_image_slice_cpu.yaml"
VARIANTS = {
    "exact": ["rollout.fuse_lora=true", "rollout.merge_lora=false"],
    "merged": ["rollout.fuse_lora=false", "rollout.merge_lora=true"],
}
PROMPT = "a red cube on a wooden table"
SHOW_STEPS = (1, 2, 3, 5, 10, 20, 30, 40, 50, 75, 100)


def train(model: Path, prompts: Path, out: Path, steps: int, variant: str, procs: int, extra: list[str]) -> None:
    """One run of the slice config on ``procs`` ranks, the adapter saved every step; its console in OUT.log."""
    cmd = [
        "--module",
        "glm_grpo_ds.train",
        "--config",
        CONFIG,
        "--deepspeed",
        "ds_configs/zero3.json",
        f"model.path={model}",
    ]
    cmd += [f"data.train_file={prompts}", f"output_dir={out}", f"max_steps={steps}", "save_steps=1"]
    cmd += ["save_total_limit=0", "rollout.height=64", "rollout.width=64", "decoder.num_inference_steps=1"]
    cmd += ["overwrite_output_dir=true", *VARIANTS[variant], *extra]
    cmd, env = deepspeed_command(procs, cmd, cpu=not torch.cuda.is_available())
    if not torch.cuda.is_available():
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // procs)))
    with open(out.with_suffix(".log"), "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"merge_drift: the {variant} run failed ({rc}); see {out.with_suffix('.log')}")


def base_weights(model: Path, names: set[str]) -> dict[str, torch.Tensor]:
    """The AR's weights ``names`` (the adapted linears), read from its safetensors without loading the model."""
    from safetensors import safe_open

    from glm_grpo_ds.model.glm_image import AR_DIR

    found: dict[str, torch.Tensor] = {}
    for file in sorted((model / AR_DIR).glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for key in set(f.keys()) & names:
                found[key] = f.get_tensor(key)
    missing = names - set(found)
    if missing:
        raise SystemExit(f"merge_drift: {model} has no base weight for {sorted(missing)[:3]}")
    return found


def adapter_deltas(adapter: Path) -> dict[str, torch.Tensor]:
    """``{base weight name: s * B @ A in fp32}`` of a peft adapter directory."""
    from safetensors.torch import load_file

    cfg = json.loads((adapter / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / (cfg["r"] ** 0.5 if cfg.get("use_rslora") else cfg["r"])
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    out = {}
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        b = tensors[key.replace(".lora_A.", ".lora_B.")]
        name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        out[name] = scale * (b.float() @ a.float())
    return out


def kept_fraction(base: dict[str, torch.Tensor], deltas: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(part of D a merge keeps, the merge's relative error) over all adapted linears together."""
    from glm_grpo_ds.rollout.merged_lora import kept_fraction as kept

    return kept((base[name], d) for name, d in deltas.items())


@contextlib.contextmanager
def merged_in_bf16(policy):
    """Inside: ``policy``'s adapted weights hold the bf16 merge ``bf16(W + D)`` (as fp32 values) and its adapters
    are off, so fp32 arithmetic on them shows the merge's rounding alone; restored on exit."""
    from glm_grpo_ds.rollout.merged_lora import lora_delta, lora_layers, merged_weight

    saved = []
    with torch.no_grad():
        for _, module, w in lora_layers(policy):
            saved.append((w, w.clone()))
            w.copy_(merged_weight(w.to(torch.bfloat16), lora_delta(module)).float())
    try:
        with policy.disable_adapter():
            yield
    finally:
        with torch.no_grad():
            for w, copy in saved:
                w.copy_(copy)


def merge_logprob_gap(model: Path, run: Path, steps: list[int], seed: int = 0) -> dict[int, dict]:
    """``{step: mean / max |dlogp|, k3}`` of a sampler whose weights are the bf16 merge against the trainer's
    unmerged adapter, both in fp32 arithmetic on the same tokens: 2 rows the exact policy samples at the last step
    (64x64). What the merge's rounding alone costs the sampler; the bf16 arithmetic both sides add is not in it
    (the two bf16 runs' mismatch/* give that, where bf16 is fast)."""
    from glm_grpo_ds.config import LoraConfig, SamplingConfig
    from glm_grpo_ds.logprobs import completion_logprobs
    from glm_grpo_ds.model.adapters import load_init_adapter
    from glm_grpo_ds.model.glm_image import load_processor
    from glm_grpo_ds.model.policy import load_policy
    from glm_grpo_ds.rollout import rollout

    dirs = step_dirs(run)
    cfg = json.loads((dirs[max(dirs)] / "adapter" / "adapter_config.json").read_text())
    policy = load_policy(model, torch.float32, "sdpa", LoraConfig(r=cfg["r"], alpha=cfg["lora_alpha"]), False).eval()
    sampling = SamplingConfig()
    load_init_adapter(policy, dirs[max(dirs)] / "adapter")
    with torch.no_grad():
        batch = rollout(
            policy, load_processor(model), [PROMPT], 2, 64, 64, sampling, torch.Generator().manual_seed(seed)
        )
    gaps = {}
    for step in steps:
        load_init_adapter(policy, dirs[step] / "adapter")
        with torch.no_grad():
            trainer = completion_logprobs(policy, batch, sampling)
            with merged_in_bf16(policy):
                sampler = completion_logprobs(policy, batch, sampling)
        d = sampler - trainer
        gaps[step] = {
            "abs_mean": float(d.abs().mean()),
            "abs_max": float(d.abs().max()),
            "k3": float((d.exp() - d - 1).mean()),
        }
        print(f"merge_drift: step {step}: merged-in-bf16 sampler vs trainer {gaps[step]}", flush=True)
    return gaps


def step_dirs(run: Path) -> dict[int, Path]:
    ckpt = run / "checkpoints"
    return {int(p.name.split("_")[-1]): p for p in ckpt.glob("step_*") if (p / "adapter").is_dir()}


def report(out: Path, model: Path, gap_steps: bool = True) -> dict:
    """The per-step table of OUT's runs (printed, and written to OUT/merge_drift.json); with ``gap_steps`` also
    :func:`merge_logprob_gap` at the SHOW_STEPS the exact run saved (kept from an earlier report when it has them)."""
    runs = {v: out / v for v in VARIANTS if (out / v / "metrics.jsonl").is_file()}
    if "exact" not in runs:
        raise SystemExit(f"merge_drift: {out} holds no exact run (its adapters give the merge's kept fraction)")
    metrics = {}
    for v, run in runs.items():
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        metrics[v] = {int(r["step"]): r for r in rows}
    steps = step_dirs(runs["exact"])
    shown = [k for k in sorted(steps) if k in SHOW_STEPS or k == max(steps)]
    earlier = out / "merge_drift.json"
    gaps = (
        {int(k): v for k, v in json.loads(earlier.read_text()).get("merge_gap", {}).items()}
        if earlier.is_file()
        else {}
    )
    if gap_steps and any(k not in gaps for k in shown):
        gaps = merge_logprob_gap(model, runs["exact"], shown)
    base = None
    table = []
    for step in sorted(steps):
        deltas = adapter_deltas(steps[step] / "adapter")
        if base is None:
            base = base_weights(model, set(deltas))
        kept, error = kept_fraction(base, deltas)
        row = {"step": step, "kept": kept, "error": error, "merge_gap": gaps.get(step)}
        for v in VARIANTS:
            m = metrics.get(v, {}).get(step, {})
            for key in ("mismatch/logp_abs_mean", "mismatch/logp_abs_max", "mismatch/kl_k3", "reward_mean"):
                row[f"{v}/{key}"] = m.get(key)
        table.append(row)
    result = {"model": str(model), "config": CONFIG, "variants": VARIANTS, "steps": table, "merge_gap": gaps}
    earlier.write_text(json.dumps(result, indent=1))

    def f(x, spec=".2e"):
        return "-" if x is None else format(x, spec)

    cols = ["step", "merge keeps of D", "merge error / abs D", "merge alone: mean abs dlogp", "max", "k3"]
    cols += [f"{v} run: mean abs dlogp" for v in runs] + [f"{v} run: k3" for v in runs]
    cols += [f"{v} run: reward" for v in runs]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---:|" * len(cols))
    for row in table:
        if row["step"] not in shown:
            continue
        gap = row["merge_gap"] or {}
        cells = [str(row["step"]), f"{row['kept']:.3f}", f"{row['error']:.3f}"]
        cells += [f(gap.get("abs_mean")), f(gap.get("abs_max")), f(gap.get("k3"))]
        cells += [f(row[f"{v}/mismatch/logp_abs_mean"]) for v in runs] + [f(row[f"{v}/mismatch/kl_k3"]) for v in runs]
        cells += [f(row[f"{v}/reward_mean"], ".3f") for v in runs]
        print("| " + " | ".join(cells) + " |")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="outputs/slice", help="the real-width slice (glm-grpo tiny-model --real-width)")
    p.add_argument("--out", default="outputs/merge_drift")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--procs", type=int, default=2, help="ranks (GPUs, or CPU processes)")
    p.add_argument("--only", default="exact,merged", help="the runs to train (comma-separated)")
    p.add_argument("--report-only", action="store_true", help="print the table of the runs already in --out")
    p.add_argument(
        "--no-gap", action="store_true", help="skip the merge-alone log-prob gap (a rollout + 2 passes a step)"
    )
    p.add_argument("overrides", nargs="*", help="more key=value settings for both runs")
    a = p.parse_args(argv)
    model, out = Path(a.model).resolve(), Path(a.out).resolve()
    if not (model / "model_index.json").is_file():
        raise SystemExit(
            f"merge_drift: {model} is not a pipeline directory; build it with: glm-grpo tiny-model "
            f"{a.model} --real-width --ar-layers 1 --dit-layers 1"
        )
    if not a.report_only:
        out.mkdir(parents=True, exist_ok=True)
        prompts = out / "prompts.jsonl"
        prompts.write_text(
            json.dumps({"prompt": PROMPT}) + "\n" + json.dumps({"prompt": "a sign that says OPEN"}) + "\n"
        )
        for variant in a.only.split(","):
            if variant not in VARIANTS:
                raise SystemExit(f"merge_drift: --only names {variant!r}; choose from {', '.join(VARIANTS)}")
            train(model, prompts, out / variant, a.steps, variant, a.procs, a.overrides)
    report(out, model, gap_steps=not a.no_gap)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
