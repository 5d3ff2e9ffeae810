#!/usr/bin/env bash
# Single-node GRPO training with the deepspeed launcher.
#
#   NUM_GPUS=8 CONFIG=launch/configs/glm_image_lora_zero3.yaml bash launch/train.sh data.train_file=/data/prompts.jsonl
#   NUM_GPUS=2 CONFIG=launch/configs/tiny_cpu.yaml bash launch/train.sh max_steps=10      # CPU ranks, no GPU needed
#
# Environment: NUM_GPUS (default: all visible GPUs, else 1 CPU rank), CONFIG, DS_CONFIG (default
# ds_configs/zero3.json), MASTER_PORT (default 29500). Arguments are key=value config overrides.
# resume_from=auto: relaunching the same command continues from output_dir's latest checkpoint (a
# first launch starts fresh); pass resume_from=null to refuse a used output_dir instead.
set -euo pipefail
if [ -z "${NUM_GPUS:-}" ]; then
  NUM_GPUS=$(nvidia-smi -L 2>/dev/null | wc -l || true)
  [ "${NUM_GPUS:-0}" -gt 0 ] || NUM_GPUS=1
fi
CONFIG=${CONFIG:-launch/configs/glm_image_lora_zero3.yaml}
DS_CONFIG=${DS_CONFIG:-ds_configs/zero3.json}
# HF_HUB_OFFLINE and HF_HOME are yours: model.path=zai-org/GLM-Image downloads once into the Hugging Face
# cache unless HF_HUB_OFFLINE=1, which reads the cache only (glm_grpo_ds/model_source.py).
# SIGTERM / SIGINT to this script go to the training ranks, not the launcher (launch/signals.sh): they
# finish the step, save a checkpoint and exit 143 / 130, however long that takes.
MASTER_PORT=${MASTER_PORT:-29500}
# shellcheck source=launch/signals.sh
source "$(dirname "${BASH_SOURCE[0]}")/signals.sh"
run_deepspeed --num_gpus "$NUM_GPUS" --master_port "$MASTER_PORT" \
  --module glm_grpo_ds.train --config "$CONFIG" --deepspeed "$DS_CONFIG" resume_from=auto "$@"
