"""What carrying a checkpoint to another world size or ZeRO stage costs (issue #62): DeepSpeed's universal conversion
(glm_grpo_ds/ds/portable.py) of a checkpoint of GLM-Image's real-width slice, in time and disk.

    glm-grpo tiny-model outputs/slice --real-width --ar-layers 1 --dit-layers 1        # once: 3.4 GB, ~45 s
    python benchmarks/universal_conversion.py --model outputs/slice --out outputs/universal_conversion
    python benchmarks/universal_conversion.py --checkpoint RUN/checkpoints/step_000100   # an existing checkpoint

Trains the slice 1 step on 2 CPU ranks (launch/configs/glm_image_slice_cpu.yaml: bf16, ZeRO-3, LoRA r=64 on the
shipped targets, 8-bit AdamW; here at 64x64 with 1 decoder step) with a checkpoint, then converts it as a resume on
another shape does and prints: the DeepSpeed state's size, the universal folder's, the trainable parameters, bytes
per parameter, seconds and MiB/s of the conversion, and the planner's figures (portable.disk_plan) beside them.
Writes OUT/universal_conversion.json. docs/checkpoints.md "Resume on another cluster shape" quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from glm_grpo_ds.ds import portable  # noqa: E402
from glm_grpo_ds.runtime.local_launch import deepspeed_command  # noqa: E402

CONFIG = "launch/configs/glm_image_slice_cpu.yaml"
MIB = 2**20


def train_one_step(model: Path, out: Path, extra: list[str]) -> Path:
    """One step of the slice config on 2 ranks with a checkpoint; its path (the run's console in OUT.log)."""
    prompts = out.parent / "prompts.txt"
    prompts.write_text("a red cube on a wooden table\na blue ball in the grass\n")
    cmd = ["--module", "glm_grpo_ds.train", "--config", CONFIG, "--deepspeed", "ds_configs/zero3.json"]
    cmd += [f"model.path={model}", f"data.train_file={prompts}", f"output_dir={out}", "max_steps=1", "save_steps=1"]
    cmd += ["rollout.height=64", "rollout.width=64", "decoder.num_inference_steps=1", "overwrite_output_dir=true"]
    cmd, env = deepspeed_command(2, [*cmd, *extra], cpu=not torch.cuda.is_available())
    env.setdefault("OMP_NUM_THREADS", "1")
    with open(out.with_suffix(".log"), "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"universal_conversion: the training run failed ({rc}); see {out.with_suffix('.log')}")
    return out / "checkpoints" / "step_000001"


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(checkpoint: Path, eight_bit: bool) -> dict:
    ds_dir, universal = checkpoint / "ds", checkpoint / (portable.UNIVERSAL + ".benchmark")
    shutil.rmtree(universal, ignore_errors=True)
    size, kept, peak = portable.disk_plan(ds_dir, eight_bit)
    started = time.perf_counter()
    portable.convert(ds_dir, universal)
    seconds = time.perf_counter() - started
    written = folder_bytes(universal)
    params = sum(
        torch.load(p / "fp32.pt", weights_only=True)["param"].numel()
        for p in (universal / "zero").iterdir()
        if p.is_dir()
    )
    shutil.rmtree(universal)
    return {
        "checkpoint": str(checkpoint),
        "ds_state_mib": size / MIB,
        "universal_mib": written / MIB,
        "planned_kept_mib": kept / MIB,
        "planned_peak_mib": peak / MIB,
        "trainable_params": params,
        "universal_bytes_per_param": written / params,
        "seconds": seconds,
        "mib_per_s": size / MIB / seconds,
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("outputs/slice"))
    parser.add_argument("--out", type=Path, default=Path("outputs/universal_conversion"))
    parser.add_argument("--checkpoint", type=Path, help="convert this checkpoint instead of training one")
    parser.add_argument("--fp32-adamw", action="store_true", help="train with optimizer.name=adamw (default 8-bit)")
    args = parser.parse_args()
    extra = ["optimizer.name=adamw"] if args.fp32_adamw else []
    if args.checkpoint is None:
        args.out.mkdir(parents=True, exist_ok=True)
        args.checkpoint = train_one_step(args.model, args.out / "run", extra)
    state = json.loads((args.checkpoint / "trainer_state.json").read_text())
    result = measure(args.checkpoint, state["config"]["optimizer"]["name"] != "adamw")
    for key, value in result.items():
        print(f"{key}: {value:,.2f}" if isinstance(value, float) else f"{key}: {value}")
    if args.out.is_dir():
        (args.out / "universal_conversion.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
