"""The fastest of the shipped DeepSpeed configs (``ds_configs/*.json``) that fits a run: the same run planned at
each ZeRO stage (glm_grpo_ds/memory/plan.py), ranked by what was measured (:data:`MEASURED`). ``glm-grpo
estimate-memory`` prints its line; ``glm-grpo train --check`` names it when the given config does not fit.
"""

from __future__ import annotations

from pathlib import Path

from ..ds.ds_config import DeepSpeedConfigError, offloads, read_ds_config
from .plan import GIB, plan

SHIPPED = Path(__file__).resolve().parents[2] / "ds_configs"  # the checkout's DeepSpeed configs
# Why the order: ZeRO-2 against ZeRO-3, the LoRA config (r=64 on every projection), one H200, world size 1
# (issue #39). ZeRO-1 runs DeepSpeed's same optimizer as ZeRO-2 (which also partitions the gradients): one speed
# class, the smaller plan preferred. Offloading moves state over PCIe every step: slower than without.
MEASURED = (
    "ZeRO-3 gathers the weights again for every forward and backward: measured on one H200 (world size 1, LoRA, "
    "G=16 at 1024x1024), the update 4.85 s at ZeRO-2 against 20.2 s at ZeRO-3 and the rollout 17.3 against 18.3 s; "
    "the image decode is the same at every stage"
)


def _row(path, ds_raw: dict, planned: dict | None, given: bool, refused: str | None = None) -> dict:
    """One DeepSpeed config's line in :func:`fastest_that_fits`."""
    zero = ds_raw.get("zero_optimization", {})
    stage = int(zero.get("stage", 0))
    offload = offloads(zero, "offload_optimizer") or offloads(zero, "offload_param")
    try:
        shown = str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(path)
    row = dict(deepspeed=shown, zero_stage=stage, offload=offload, label=f"ZeRO-{stage}" + (" + offload" * offload))
    row.update(given=given, total_bytes=None if planned is None else planned["total_bytes"])
    row.update(fits=planned is not None and planned["headroom_bytes"] >= 0)
    return {**row, "refused": refused} if refused else row


def _speed(row: dict) -> tuple[bool, bool]:
    """Sorts fastest first: ZeRO-0/1/2 before ZeRO-3, no offload before offload (:data:`MEASURED`)."""
    return row["zero_stage"] == 3, row["offload"]


def fastest_that_fits(cfg, ds_path, given: dict, est, sizes, shipped: Path = SHIPPED) -> dict:
    """The same run planned at each of ``shipped``'s DeepSpeed configs beside ``given`` (the plan for ``ds_path``),
    and the fastest that fits: ``{"deepspeed": its path or None, "given_is_fastest": bool, "candidates": [one row
    per config], "line": the sentence estimate-memory prints}``. Fastest first: ZeRO-0/1/2, then ZeRO-3, each
    without offload before with; in one class, the smaller plan. The given config counts as the fastest when it
    fits and nothing of a faster class does. A shipped config the run's settings refuse (8-bit AdamW with an
    offloaded optimizer) is listed with the reason."""
    gpu = given["gpu_memory_bytes"]
    rows = [_row(ds_path, read_ds_config(ds_path), given, given=True)]
    for path in sorted(shipped.glob("*.json")) if shipped.is_dir() else []:
        if path.resolve() == Path(ds_path).resolve():
            continue
        raw = read_ds_config(path)
        try:
            rows.append(_row(path, raw, plan(cfg, raw, est, sizes), given=False))
        except DeepSpeedConfigError as err:
            rows.append(_row(path, raw, None, given=False, refused=str(err)))
    planned = sorted((r for r in rows if r["total_bytes"] is not None), key=lambda r: (_speed(r), r["total_bytes"]))
    fitting = [r for r in planned if r["fits"]]
    mine = rows[0]
    if not fitting:
        smallest = min(planned, key=lambda r: r["total_bytes"])
        line = (
            f"fastest that fits: none at {gpu / GIB:.0f} GiB per GPU (the smallest plan: {smallest['deepspeed']}, "
            f"{smallest['label']}, {smallest['total_bytes'] / GIB:.1f} GiB)"
        )
        return {"deepspeed": None, "given_is_fastest": False, "candidates": rows, "line": line}
    mine_fastest = mine["fits"] and _speed(mine) <= _speed(fitting[0])
    best = mine if mine_fastest else fitting[0]
    why = [] if mine["fits"] else ["this one does not fit"]
    if _speed(best)[0] < _speed(mine)[0]:
        why.append(MEASURED)
    elif _speed(best) < _speed(mine):
        why.append("without offload no optimizer state or parameters cross PCIe each step")
    faster = [r for r in planned if _speed(r) < _speed(best)]
    if faster:
        why.append(
            "nothing faster fits: "
            + ", ".join(f"{r['deepspeed']} ({r['label']}) needs {r['total_bytes'] / GIB:.1f} GiB" for r in faster[:2])
        )
    where = "this one" if mine_fastest else best["deepspeed"]
    line = f"fastest that fits: {where} ({best['label']}, {best['total_bytes'] / GIB:.1f} GiB of {gpu / GIB:.0f})"
    return {
        "deepspeed": best["deepspeed"],
        "given_is_fastest": mine_fastest,
        "candidates": rows,
        "line": line + "".join(f"; {w}" for w in why),
    }
