#!/usr/bin/env bash
# The main job on the embedded tiny GLM-Image, offline, on CPU (what `make demo` runs):
# build the tiny model and a learnable prompt set, then GRPO-train the AR on 2 CPU ranks under
# ZeRO-3 with LoRA and the bitsandbytes 8-bit optimizer.
#
#   bash launch/demo.sh                       # outputs/tiny, outputs/tiny_data, outputs/tiny_run
#   NUM_PROCS=1 bash launch/demo.sh max_steps=10
set -euo pipefail
export HF_HUB_OFFLINE=1
NUM_PROCS=${NUM_PROCS:-2}
CONFIG=${CONFIG:-launch/configs/tiny_cpu.yaml}
DS_CONFIG=${DS_CONFIG:-ds_configs/zero3.json}

glm-grpo tiny-model outputs/tiny --seed 0
glm-grpo tiny-data --config "$CONFIG" "$@"
# galleries every 20 steps and a fixed-seed eval of 4 prompts (at 0, 20, 40, 60); "$@" can override
deepspeed --num_gpus "$NUM_PROCS" --module glm_grpo_ds.train --config "$CONFIG" --deepspeed "$DS_CONFIG" \
  logging.gallery_steps=20 eval.file=outputs/tiny_data/prompts.jsonl eval.steps=20 eval.num_prompts=4 "$@"
