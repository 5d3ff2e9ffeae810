#!/usr/bin/env bash
# GLM-Image's real-width slice (docs/real-width.md: the real layer widths, vocabularies and token ids, 1 AR
# and 1 DiT layer) trained on this CPU at 1024x1024 the way the shipped configs train the real model, then
# each run's per-phase peak memory against the planner (`glm-grpo check-run`). What `make slice-check` runs.
#
#   bash launch/slice_check.sh                 # outputs/slice_check/{model,lora,full}
#   OUT=/tmp/sc SKIP_FULL=1 bash launch/slice_check.sh
#
# 1. LoRA: launch/configs/glm_image_slice_cpu.yaml (= glm_image_lora_zero3.yaml in bf16: ZeRO-3 on 2 ranks,
#    LoRA r=64 on the real targets, 8-bit AdamW, gradient checkpointing, chunked log-probs, the adapter-off
#    reference, CFG 1.5) at 1024x1024 (1 280 AR tokens per image), G=2, 1 step, 2 decoder steps.
# 2. Full fine-tuning: launch/configs/glm_image_full_zero3.yaml (ZeRO-3, the frozen reference engine of
#    beta > 0, gradient checkpointing) at 1024x1024, G=2, 1 step, on ONE rank with 8-bit AdamW: the shipped
#    AdamW on 2 ranks plans 2 x 15.2 GiB here, more than a 24 GiB machine holds (docs/real-width.md).
# Each run ends with finite loss and a first-iteration ratio of exactly 1, or check-run exits 1.
# Needs ~17 GiB of free RAM (the full run; the LoRA run ~2 x 8 GiB); times are in docs/real-width.md.
set -euo pipefail
export HF_HUB_OFFLINE=1
export DS_ACCELERATOR=cpu
OUT=${OUT:-outputs/slice_check}
SIZE=${SIZE:-1024}
mkdir -p "$OUT"

if [ ! -f "$OUT/model/model_index.json" ]; then
  glm-grpo tiny-model "$OUT/model" --real-width --ar-layers 1 --dit-layers 1
fi
printf '{"prompt": "a red cube on a wooden table"}\n{"prompt": "a sign that says OPEN"}\n' >"$OUT/prompts.jsonl"
common=(model.path="$OUT/model" data.train_file="$OUT/prompts.jsonl" rollout.height="$SIZE" rollout.width="$SIZE"
  overwrite_output_dir=true max_steps=1 save_steps=0)

start=$(date +%s)
deepspeed --num_gpus 2 --module glm_grpo_ds.train \
  --config launch/configs/glm_image_slice_cpu.yaml --deepspeed ds_configs/zero3.json \
  "${common[@]}" output_dir="$OUT/lora"
lora_s=$(($(date +%s) - start))

full_s=skipped
if [ -z "${SKIP_FULL:-}" ]; then
  start=$(date +%s)
  deepspeed --num_gpus 1 --module glm_grpo_ds.train \
    --config launch/configs/glm_image_full_zero3.yaml --deepspeed ds_configs/zero3.json \
    "${common[@]}" output_dir="$OUT/full" grpo.group_size=2 optimizer.name=adamw_8bit decoder.dtype=bf16 \
    decoder.num_inference_steps=2 decoder.guidance_scale=1.5 logging.gallery_steps=0 \
    logging.progress_bar=false logging.plot=false \
    'rewards=[{name: "python:glm_grpo_ds.testing.tiny_data:mean_brightness"}]'
  full_s=$(($(date +%s) - start))
fi

status=0
echo "== LoRA, 2 ranks, ${SIZE}x${SIZE}: ${lora_s} s"
glm-grpo check-run "$OUT/lora" || status=1
if [ -z "${SKIP_FULL:-}" ]; then
  echo "== full fine-tuning, 1 rank, ${SIZE}x${SIZE}: ${full_s} s"
  glm-grpo check-run "$OUT/full" || status=1
fi
exit $status
