"""Per-phase peak GPU memory measured on a GPU (:data:`glm_grpo_ds.memory.gpu_figures.MEASURED`: the card, the date
and the exact run) held against the memory planner (glm_grpo_ds/memory/plan.py): tests/unit/test_memory_plan_measured.py
asserts every plan at or above its measurement and within +30 %; `make slice-check` prints the table (the full
fine-tuning slice needs ~32 GiB of RAM to run on a CPU, so there the GPU's figures are the comparison).

    python -m glm_grpo_ds.testing.gpu_measurements        # measured vs planned, per phase

A measurement is ``memory/<phase>_peak_mb`` of metrics.jsonl (``torch.cuda.max_memory_allocated`` per phase);
the plan it is held against is the planner's phase total (:func:`glm_grpo_ds.memory.phases.phase_totals`), which
includes the 2 GiB runtime allowance (CUDA context, NCCL, allocator slack) that the allocator's counter does not
see. Every record is a one-step run: its rollout, decode and reward come before the optimizer's first step has
created its state (``first_step``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..memory.gpu_figures import MEASURED, Measured

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
GIB = 2**30


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
