"""``glm-grpo estimate-memory``: print the per-GPU memory plan of a run before launch (no weights needed),
the reward models it counts, and the host RAM per node.

    glm-grpo estimate-memory --config launch/configs/glm_image_lora.yaml \\
        --deepspeed ds_configs/zero2.json --num-gpus 8 [--num-nodes 1] [--gpu-memory-gb 80] [--json] \\
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

from ..config import ConfigError, load_config, parse_with_overrides
from ..config.arguments import gib
from ..ds.ds_config import DeepSpeedConfigError, read_ds_config
from ..lifecycle.disk_space import disk_line
from ..memory.levers import lever_text, replanned
from ..memory.plan import GIB, EstimateConfig, grid_tokens, plan
from ..memory.sizes import model_sizes
from ..memory.stages import fastest_that_fits
from ..memory.step_time import describe, step_time
from ..rewards import RewardError
from ..rewards.registry import check_reward_name
from ..testing.random_model import materialize
from .cli import parser_for

OVER_BUDGET = 3  # exit status when the plan does not fit (2 is a bad config)


def build_parser() -> argparse.ArgumentParser:
    d = EstimateConfig()
    ap = parser_for("estimate-memory")
    ap.add_argument("--config", required=True, help="training YAML (the one you will launch)")
    ap.add_argument("--deepspeed", required=True, help="ds_configs/zero{1,2,3}.json or your own")
    ap.add_argument("--num-gpus", type=int, default=d.num_gpus, help="GPUs per node (default: %(default)s)")
    ap.add_argument("--num-nodes", type=int, default=d.num_nodes, help="nodes (default: %(default)s)")
    ap.add_argument(
        "--gpu-memory-gb",
        type=gib,
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
        for i, spec in enumerate(cfg.rewards):  # the plan counts each reward's model: an unknown name is no plan
            check_reward_name(spec.name, f"rewards[{i}].name: ")
        est = EstimateConfig(a.num_gpus, a.num_nodes, a.gpu_memory_gb, a.prompt_tokens, a.device)
        materialize(cfg.model.path)  # a random: model's configs (glm_grpo_ds/model/random_weights.py)
        sizes = model_sizes(cfg)
        raw = read_ds_config(a.deepspeed)
        p = plan(cfg, raw, est, sizes)
    except (ConfigError, DeepSpeedConfigError, OSError, RewardError) as err:
        print(f"glm-grpo estimate-memory: {err}", file=sys.stderr)
        return 2
    fits = p["headroom_bytes"] >= 0
    fastest = fastest_that_fits(cfg, a.deepspeed, p, est, sizes)
    advice = None if fits else lever_text(p, replanned(cfg, p, lambda changed: plan(changed, raw, est, sizes)))
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
                    "disk": p["disk"],  # what output_dir holds (memory/disk.py)
                    "fastest_that_fits": fastest,
                    "levers": advice,  # when it does not fit: the settings that plan less (memory/levers.py)
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
        f"than --gpu-memory-gb {a.gpu_memory_gb:g}; planned again with one change each: {advice}"
        + ("" if a.allow_over_budget else f" (exit {OVER_BUDGET}; --allow-over-budget exits 0)"),
        file=sys.stderr,
    )
    return 0 if a.allow_over_budget else OVER_BUDGET


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
    writing = h["writing_rank0_bytes"]  # full fine-tuning's end
    end = f", at the end {(h['steady_bytes'] + writing) / GIB:.1f} GiB (+ rank 0: one file of final_model/ "
    end = end + f"{writing / GIB:.2f})" if writing else ""
    lines.append(
        f"  host RAM per node ({h['ranks']} ranks): steady {h['steady_bytes'] / GIB:.1f} GiB "
        f"(per rank: {per_rank or 'nothing counted'}), peak while loading {h['loading_peak_bytes'] / GIB:.1f} GiB "
        f"(+ per rank: {loading or 'nothing'}{rank0}){end}; ask for {h['request_bytes'] / GIB:.0f} GiB "
        f"(SLURM --mem={h['request_bytes'] // GIB}G){_page_cache(h['page_cache_bytes'])}"
    )
    lines.append(f"  AR on the host while loading: {h['ar_whole_basis']}")
    lines.append(f"  disk in output_dir (glm_grpo_ds/memory/disk.py): {disk_line(p['disk'])}")
    lines.append("  vs DeepSpeed's estimate_zero2/zero3_model_states_mem_needs: same weights, gradients, fp32 master,")
    lines.append(
        "  moments and fp32 step-time gradients; not in theirs: the reduce bucket, ZeRO-2's straddling tensor,"
    )
    lines.append("  ZeRO-3's bf16 gradient partition; their ZeRO-3 largest-layer term (4 bytes x largest layer) is the")
    lines.append("  transient zero3_update_gather here, and ZeRO-3's fp32 gradients are one sub_group_size at a time")
    return "\n".join(lines)


def _page_cache(nbytes: int) -> str:
    """The weight files' page cache beside the host request; none for a ``random:`` model, built from no file."""
    if nbytes < GIB / 2:
        return ""
    return f"; plus up to {nbytes / GIB:.0f} GiB of page cache for the weight files (shared, reclaimable)"


if __name__ == "__main__":
    raise SystemExit(main())
