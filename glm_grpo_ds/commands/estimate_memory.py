"""``glm-grpo estimate-memory``: print the per-GPU memory plan of a run before launch (no weights needed),
the reward models it counts, and the host RAM per node.

    glm-grpo estimate-memory --config launch/configs/glm_image_lora_zero3.yaml \\
        --deepspeed ds_configs/zero3.json --num-gpus 8 [--num-nodes 1] [--gpu-memory-gb 80] [--json] \\
        [--allow-over-budget] [key=value ...]

The arithmetic and its sources are in glm_grpo_ds/memory/plan.py (reward models: memory/reward_models.py, host
RAM: memory/host.py). After the plan, one line names the fastest of the shipped ``ds_configs/*.json`` that
fits the same run (:func:`fastest_that_fits`). Exit status: 0 when the plan fits in ``--gpu-memory-gb``; 3 when
it does not (the plan is still printed, with a WARNING on stderr saying what to change), unless
``--allow-over-budget`` (then 0); 2 on a bad config or command line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import ConfigError, load_config, parse_with_overrides
from ..ds.ds_config import DeepSpeedConfigError, offloads, read_ds_config
from ..memory.plan import GIB, EstimateConfig, grid_tokens, plan
from ..memory.sizes import model_sizes
from ..memory.step_time import describe, step_time
from .cli import parser_for

OVER_BUDGET = 3  # exit status when the plan does not fit (2 is a bad config)
SHIPPED = Path(__file__).resolve().parents[2] / "ds_configs"  # the checkout's DeepSpeed configs
# Why the order: ZeRO-2 against ZeRO-3, the LoRA config (r=64 on every projection), one H200, world size 1
# (issue #39). ZeRO-1 runs DeepSpeed's same optimizer as ZeRO-2 (which also partitions the gradients): one speed
# class, the smaller plan preferred. Offloading moves state over PCIe every step: slower than without.
MEASURED = (
    "ZeRO-3 gathers the weights again for every forward and backward: measured on one H200 (world size 1, LoRA, "
    "G=16 at 1024x1024), the update 4.85 s at ZeRO-2 against 20.2 s at ZeRO-3 and the rollout 17.3 against 18.3 s; "
    "the image decode is the same at every stage"
)


def build_parser() -> argparse.ArgumentParser:
    d = EstimateConfig()
    ap = parser_for("estimate-memory")
    ap.add_argument("--config", required=True, help="training YAML (the one you will launch)")
    ap.add_argument("--deepspeed", required=True, help="ds_configs/zero{1,2,3}.json or your own")
    ap.add_argument("--num-gpus", type=int, default=d.num_gpus, help="GPUs per node (default: %(default)s)")
    ap.add_argument("--num-nodes", type=int, default=d.num_nodes, help="nodes (default: %(default)s)")
    ap.add_argument(
        "--gpu-memory-gb",
        type=float,
        default=d.gpu_memory_gb,
        help="GiB per GPU to plan against (default: %(default)s)",
    )
    ap.add_argument(
        "--prompt-tokens",
        type=int,
        default=d.prompt_tokens,
        help="longest prompt in tokens, chat template included; sizes the KV cache (default: %(default)s)",
    )
    ap.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default=d.device,
        help="cuda: model.dtype auto = bf16; cpu: auto = fp32, as on CPU runs (default: %(default)s)",
    )
    ap.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (bytes per component, total_bytes, fits, rewards, host_node) (default: off)",
    )
    ap.add_argument(
        "--allow-over-budget",
        action="store_true",
        help=f"exit 0 even when the plan does not fit in --gpu-memory-gb (default: off: exit {OVER_BUDGET})",
    )
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides, as for `glm-grpo train`")
    return ap


def parse_args(argv):
    return parse_with_overrides(build_parser(), argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if a.num_gpus < 1 or a.num_nodes < 1:
            raise ConfigError("--num-gpus and --num-nodes must be >= 1")
        cfg = load_config(a.config, a.overrides)
        est = EstimateConfig(a.num_gpus, a.num_nodes, a.gpu_memory_gb, a.prompt_tokens, a.device)
        sizes = model_sizes(cfg)
        p = plan(cfg, read_ds_config(a.deepspeed), est, sizes)
    except (ConfigError, DeepSpeedConfigError, OSError) as err:
        print(f"glm-grpo estimate-memory: {err}", file=sys.stderr)
        return 2
    fits = p["headroom_bytes"] >= 0
    fastest = fastest_that_fits(cfg, a.deepspeed, p, est, sizes)
    timed = step_time(
        cfg, p["setup"]["zero_stage"], grid_tokens(cfg.rollout.height, cfg.rollout.width), est.prompt_tokens
    )
    if a.json:
        print(
            json.dumps(
                {
                    **p["components"],
                    "total_bytes": p["total_bytes"],
                    "gpu_memory_bytes": p["gpu_memory_bytes"],
                    "headroom_bytes": p["headroom_bytes"],
                    "fits": fits,
                    "phases": p["phases"],
                    "rewards": p["rewards"],
                    "host_bytes": p["host_bytes"],
                    "host_node": p["host_node"],
                    "model_states": p["model_states"],
                    "merge_copy": p["merge_copy"],
                    "setup": p["setup"],
                    "fastest_that_fits": fastest,
                    "step_time": {
                        "total_s": timed.total_s,
                        "rollout_s": timed.rollout_s,
                        "decode_s": timed.decode_s,
                        "update_s": timed.update_s,
                        "line": describe(timed),
                    },
                }
            )
        )
    else:
        print(format_plan(p))
        print(describe(timed))
        print(fastest["line"])
    if fits:
        return 0
    print(
        f"WARNING: the plan needs {p['total_bytes'] / GIB:.1f} GiB per GPU, "
        f"{-p['headroom_bytes'] / GIB:.1f} GiB more "
        f"than --gpu-memory-gb {a.gpu_memory_gb:g}; lower batch.micro_batch_size, use LoRA, ZeRO-3, "
        "more GPUs, decoder.offload=true or offload: true on the reward models"
        + ("" if a.allow_over_budget else f" (exit {OVER_BUDGET}; --allow-over-budget exits 0)"),
        file=sys.stderr,
    )
    return 0 if a.allow_over_budget else OVER_BUDGET


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


def format_plan(p: dict) -> str:
    """The plan as the table this command prints (components, phases, reward models, host RAM)."""
    s = p["setup"]
    lines = [
        f"memory plan per GPU: {s['world_size']} GPU(s) on {s['nodes']} node(s), ZeRO-{s['zero_stage']}, "
        f"{'LoRA' if s['lora'] else 'full fine-tuning'}, {s['optimizer']}, {s['dtype']}, {s['sequences_per_gpu']} "
        f"sequences/GPU, micro-batch {s['micro_batch']}, {s['size']}",
        f"sizes from {s['sizes_from']}",
        "",
        f"  {'component':<22}{'GiB':>9}  note",
    ]
    for name, value in p["components"].items():
        tag = "" if name in p["persistent"] else "  [transient]"
        lines.append(f"  {name:<22}{value / GIB:>9.2f}  {p['notes'][name]}{tag}")
    lines.append("")
    phases = ", ".join(f"{k} {v / GIB:.2f}" for k, v in p["phases"].items())
    lines.append(f"  transient peak by phase (GiB): {phases}; largest: {p['peak_phase']}")
    lines.append(
        f"  {'total (peak)':<22}{p['total_bytes'] / GIB:>9.2f}  of {p['gpu_memory_bytes'] / GIB:.0f} GiB, "
        f"headroom {p['headroom_bytes'] / GIB:.2f} GiB"
    )
    lines.append("  reward models (the config's rewards; glm_grpo_ds/memory/reward_models.py):")
    for r in p["rewards"]:
        lines.append(f"    {r['name']:<20}{r['bytes'] / GIB:>9.2f}  {r['where']}: {r['note']}")
    lines.append("")
    for name, value in p["host_bytes"].items():
        lines.append(f"  host RAM per GPU: {name} {value / GIB:.2f} GiB")
    h = p["host_node"]
    per_rank = ", ".join(f"{k} {v / GIB:.2f}" for k, v in h["per_rank"].items() if v)
    loading = ", ".join(f"{k} {v / GIB:.2f}" for k, v in h["loading_per_rank"].items() if v)
    rank0 = f"; + rank 0: one AR tensor {h['loading_rank0_bytes'] / GIB:.2f}" if h["loading_rank0_bytes"] else ""
    lines.append(
        f"  host RAM per node ({h['ranks']} ranks): steady {h['steady_bytes'] / GIB:.1f} GiB "
        f"(per rank: {per_rank or 'nothing counted'}), peak while loading {h['loading_peak_bytes'] / GIB:.1f} GiB "
        f"(+ per rank: {loading or 'nothing'}{rank0}); ask for {h['request_bytes'] / GIB:.0f} GiB "
        f"(SLURM --mem={h['request_bytes'] // GIB}G); plus up to {h['page_cache_bytes'] / GIB:.0f} GiB of page "
        "cache for the weight files (shared, reclaimable)"
    )
    lines.append(f"  AR on the host while loading: {h['ar_whole_basis']}")
    lines.append("  vs DeepSpeed's estimate_zero2/zero3_model_states_mem_needs: same weights, gradients, fp32 master,")
    lines.append(
        "  moments and fp32 step-time gradients; not in theirs: the reduce bucket, ZeRO-2's straddling tensor,"
    )
    lines.append("  ZeRO-3's bf16 gradient partition; their ZeRO-3 largest-layer term (4 bytes x largest layer) is the")
    lines.append("  transient zero3_update_gather here, and ZeRO-3's fp32 gradients are one sub_group_size at a time")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
