"""What carrying a checkpoint to another world size or ZeRO stage costs (issue #62): DeepSpeed's universal conversion
(glm_grpo_ds/ds/portable.py) of an existing checkpoint, in time and disk, as a resume on another shape runs it.

    python benchmarks/universal_conversion.py RUN/checkpoints/step_000100 [--json OUT.json]

Prints the DeepSpeed state's size, the universal folder's, the trainable parameters, bytes per parameter, seconds and
MiB/s of the conversion, and the planner's figures (portable.disk_plan) beside them; the converted folder is written
beside the checkpoint's as ``universal.benchmark/`` and removed. docs/checkpoints.md "Resume on another cluster shape"
quotes it. (GLM-Image's real-width slice could not give a checkpoint on the 2-core, 24 GiB CPU machine: its one bf16
step ran past 20 minutes, in fp32 a rank was killed for memory; run this on a GPU run's checkpoint.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from glm_grpo_ds.ds import portable  # noqa: E402

MIB = 2**20


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
    parser.add_argument("checkpoint", type=Path, help="a checkpoint directory (holds ds/ and trainer_state.json)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    state = json.loads((args.checkpoint / "trainer_state.json").read_text())
    result = measure(args.checkpoint, state["config"]["optimizer"]["name"] != "adamw")
    for key, value in result.items():
        print(f"{key}: {value:,.2f}" if isinstance(value, float) else f"{key}: {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
