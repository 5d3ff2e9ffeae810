"""``glm-grpo estimate-memory``: print the per-GPU memory plan of a run before launch (no weights needed),
and the host RAM per node.

    glm-grpo estimate-memory --config launch/configs/glm_image_lora_zero3.yaml \\
        --deepspeed ds_configs/zero3.json --num-gpus 8 [--num-nodes 1] [--gpu-memory-gb 80] [--json] [key=value ...]

The arithmetic and its sources are in glm_grpo_ds/memory_plan.py. Exit 0 with a WARNING on stderr
when the plan does not fit; 2 on a bad config.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..config import ConfigError, load_config, parse_with_overrides
from ..ds.ds_config import DeepSpeedConfigError, read_ds_config
from ..memory_plan import GIB, EstimateConfig, format_plan, plan


def parse_args(argv):
    d = EstimateConfig()
    ap = argparse.ArgumentParser(
        prog="glm-grpo estimate-memory", description="per-GPU memory plan of a GRPO run (no weights needed)"
    )
    ap.add_argument("--config", required=True, help="training YAML (the one you will launch)")
    ap.add_argument("--deepspeed", required=True, help="ds_configs/zero{1,2,3}.json or your own")
    ap.add_argument("--num-gpus", type=int, default=d.num_gpus, help="GPUs per node")
    ap.add_argument("--num-nodes", type=int, default=d.num_nodes)
    ap.add_argument("--gpu-memory-gb", type=float, default=d.gpu_memory_gb, help="GiB per GPU")
    ap.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens, help="longest prompt in tokens (KV cache)")
    ap.add_argument(
        "--device", choices=["cuda", "cpu"], default=d.device, help="cpu: dtype auto = fp32, as on CPU runs"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object (bytes per component, total_bytes)")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides, as for `glm-grpo train`")
    return parse_with_overrides(ap, argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if a.num_gpus < 1 or a.num_nodes < 1:
            raise ConfigError("--num-gpus and --num-nodes must be >= 1")
        cfg = load_config(a.config, a.overrides)
        est = EstimateConfig(a.num_gpus, a.num_nodes, a.gpu_memory_gb, a.prompt_tokens, a.device)
        p = plan(cfg, read_ds_config(a.deepspeed), est)
    except (ConfigError, DeepSpeedConfigError, OSError) as err:
        print(f"glm-grpo estimate-memory: {err}", file=sys.stderr)
        return 2
    if a.json:
        print(
            json.dumps(
                {
                    **p["components"],
                    "total_bytes": p["total_bytes"],
                    "gpu_memory_bytes": p["gpu_memory_bytes"],
                    "headroom_bytes": p["headroom_bytes"],
                    "phases": p["phases"],
                    "host_bytes": p["host_bytes"],
                    "host_node": p["host_node"],
                    "model_states": p["model_states"],
                    "setup": p["setup"],
                }
            )
        )
    else:
        print(format_plan(p))
    if p["headroom_bytes"] < 0:
        print(
            f"WARNING: the plan needs {p['total_bytes'] / GIB:.1f} GiB per GPU, "
            f"{-p['headroom_bytes'] / GIB:.1f} GiB more "
            f"than --gpu-memory-gb {a.gpu_memory_gb:g}; lower batch.micro_batch_size, use LoRA, ZeRO-3, "
            "more GPUs, or decoder.offload=true",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
