#!/usr/bin/env bash
# The main job on the embedded tiny GLM-Image, offline, on CPU (what `make demo` runs): build the
# learnable tiny world (glm_grpo_ds/testing/world.py), GRPO-train its AR on 2 CPU ranks under ZeRO-3
# with LoRA and the bitsandbytes 8-bit optimizer (launch/configs/tiny_world.yaml: 80 steps, ~4 min),
# print how far the reward got from its start to the best achievable one, then evaluate the final adapter
# against the base on the held-out prompts with paired seeds (glm-grpo evaluate, under a minute: the
# README's evaluate table; docs/evaluate.md).
#
#   bash launch/demo.sh                       # outputs/world, outputs/world_run
#   NUM_PROCS=1 bash launch/demo.sh max_steps=20
#   bash launch/demo.sh --help                # this text; nothing runs
# Look at: outputs/world_run/reward_curve.png, outputs/world_run/samples/eval_step_*.png (held-out
# prompts, fixed seeds), samples/step_*.png (training groups) and evaluate/ (report.html, the page to open: its path
# is the last line printed; gallery.png, evaluate.json); checkpoints/ (steps 60 and 80) to try resuming on
# (docs/checkpoints.md#resume-the-demo).
set -euo pipefail
for arg in "$@"; do # --help / -h: the comment block above, before anything runs
  if [[ $arg == -h || $arg == --help ]]; then awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0; fi
done
export HF_HUB_OFFLINE=1
export DS_ACCELERATOR=cpu # a CPU demo, said explicitly: on a GPU node too, and never refused as a CPU fallback
NUM_PROCS=${NUM_PROCS:-2}
CONFIG=${CONFIG:-launch/configs/tiny_world.yaml}
DS_CONFIG=${DS_CONFIG:-ds_configs/zero3.json}
OUT=${OUT:-outputs/world_run}

glm-grpo tiny-world outputs/world --seed 0
# overwrite_output_dir=true: every `make demo` starts the demo run over (a real run would be refused
# in an output_dir holding an earlier run; see docs/checkpoints.md)
# the launcher's port 29500, or a free one when another run holds it (a second demo on this machine)
MASTER_PORT=${MASTER_PORT:-$(python -m glm_grpo_ds.runtime.ports 29500 --for launch/demo.sh)}
deepspeed --num_gpus "$NUM_PROCS" --master_port "$MASTER_PORT" --module glm_grpo_ds.train --config "$CONFIG" --deepspeed "$DS_CONFIG" \
  output_dir="$OUT" overwrite_output_dir=true "$@"
glm-grpo progress "$OUT" --best outputs/world/best.json
# --fresh: every demo trains a new adapter, which the progress store of the last demo's evaluation would refuse;
# --batch-prompts 8: the 8 held-out prompts in one rollout (the figures do not depend on it; it is faster)
glm-grpo evaluate --config "$CONFIG" model.path=outputs/world/model --adapter "$OUT/final_adapter" \
  --prompts outputs/world/heldout.jsonl --samples-per-prompt 4 --batch-prompts 8 --out "$OUT/evaluate" --fresh
