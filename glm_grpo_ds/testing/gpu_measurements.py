"""Per-phase peak GPU memory measured on a GPU, with the card, the date and the exact run, held against the memory
planner (glm_grpo_ds/memory/plan.py): tests/unit/test_memory_plan_measured.py asserts every plan at or above its
measurement and within +30 %; `make slice-check` prints the table (the full fine-tuning slice needs ~32 GiB of RAM
to run on a CPU, so there the GPU's figures are the comparison).

    python -m glm_grpo_ds.testing.gpu_measurements        # measured vs planned, per phase

A measurement is ``memory/<phase>_peak_mb`` of metrics.jsonl (``torch.cuda.max_memory_allocated`` per phase);
the plan it is held against is the planner's phase total (:func:`glm_grpo_ds.memory.phases.phase_totals`), which
includes the 2 GiB runtime allowance (CUDA context, NCCL, allocator slack) that the allocator's counter does not
see. Every record is a one-step run: its rollout, decode and reward come before the optimizer's first step has
created its state (``first_step``).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class Measured:
    name: str
    card: str
    date: str
    model: tuple[int, int]  # (AR layers, DiT layers) at GLM-Image's real widths; (40, 30) = full size
    config: str  # launch/configs/*.yaml
    deepspeed: str  # ds_configs/*.json
    overrides: tuple[str, ...]
    phases_mb: dict[str, float]  # memory/<phase>_peak_mb of the run's (only) step
    world_size: int = 1
    notes: str = ""
    first_step: bool = True


MEASURED = (
    Measured(
        name="full fine-tuning, real-width slice",
        card="one H200 (torch 2.11.0+cu130, sdpa)",
        date="2026-11 (issue #50)",
        model=(1, 1),  # AR 1 layer (vision tower at depth 1) + DiT 1 layer: 1.05 B AR parameters, 0.96 B trainable
        config="launch/configs/glm_image_full.yaml",
        deepspeed="ds_configs/zero3.json",
        overrides=("grpo.group_size=2", "decoder.dtype=bf16"),
        phases_mb={"rollout": 10.72 * 1024, "decode": 14.75 * 1024, "reward": 10.74 * 1024, "update": 25.67 * 1024},
        notes="issue #50: AdamW, a frozen reference engine (beta 0.04), 1024x1024",
    ),
    Measured(
        name="LoRA, GLM-Image at full size",
        card="one H200 (torch 2.11.0+cu130, sdpa)",
        date="2026-11 (issues #51, #52)",
        model=(40, 30),  # AR 40 layers (vision tower at depth 1) 9.01 B + DiT 30 layers 6.93 B
        config="launch/configs/gpu_check.yaml",
        deepspeed="ds_configs/zero2.json",
        overrides=(
            "grpo.group_size=16",
            "decoder.batch_size=8",
            "decoder.num_inference_steps=8",
            "decoder.guidance_scale=1.5",
            "rollout.fuse_lora=false",  # gpu_check.yaml samples fused since; this run sampled merged
            "rollout.merge_lora=true",
            "rollout.cuda_graph=true",
        ),
        phases_mb={"decode": 64633.0},
        notes="issues #51/#52: LoRA r=64, 8-bit AdamW, the merge copy on the GPU, 1024x1024; the decode peak",
    ),
)


def planned(record: Measured, model_dir: Path) -> dict[str, float]:
    """The planner's bytes per measured phase for ``record``'s run (``model_dir``: its model's configs)."""
    from ..config import load_config
    from ..ds.ds_config import read_ds_config
    from ..memory.plan import EstimateConfig, phase_totals, plan
    from ..memory.sizes import model_sizes

    cfg = load_config(ROOT / record.config, [f"model.path={model_dir}", *record.overrides])
    est = EstimateConfig(num_gpus=record.world_size, gpu_memory_gb=80.0)
    return phase_totals(plan(cfg, read_ds_config(ROOT / record.deepspeed), est, model_sizes(cfg)), record.first_step)


def compare(records=MEASURED, workdir: Path | None = None) -> list[dict]:
    """One row per (record, measured phase): measured and planned GiB and their ratio planned / measured."""
    from .slice import write_slice_configs

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(workdir or tmp)
        for record in records:
            ar, dit = record.model
            model_dir = base / f"configs_{ar}_{dit}"
            if not (model_dir / "model_index.json").is_file():
                write_slice_configs(model_dir, ar, dit)
            plan_bytes = planned(record, model_dir)
            for phase, mb in record.phases_mb.items():
                gib = plan_bytes[phase] / GIB
                rows.append(
                    dict(
                        run=record.name,
                        card=record.card,
                        date=record.date,
                        phase=phase,
                        measured_gib=mb / 1024,
                        planned_gib=gib,
                        ratio=gib / (mb / 1024),
                    )
                )
    return rows


def main() -> int:
    """Print the table; exit 1 when a phase is planned below its measurement."""
    print(f"{'run':<36}{'phase':<9}{'measured GiB':>13}{'planned GiB':>12}{'plan/measured':>15}  card, date")
    rows = compare()
    for r in rows:
        print(
            f"{r['run']:<36}{r['phase']:<9}{r['measured_gib']:>13.2f}{r['planned_gib']:>12.2f}{r['ratio']:>15.3f}"
            f"  {r['card']}, {r['date']}"
        )
    return 0 if all(r["ratio"] >= 1 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
