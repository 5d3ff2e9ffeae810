#!/usr/bin/env bash
# One command that checks, on one GPU (or N, --num-gpus), the paths a multi-GPU bf16 run takes: a short
# training run (launch/configs/gpu_check.yaml: bf16, flash-attention when installed, NCCL collectives
# forced on at world size 1, top-k 8 / top-p 0.75 sampling, LoRA, 8-bit AdamW, ZeRO-3), then
# verify-logprobs in bf16 with the same cuts, then PASS/FAIL lines (glm-grpo check-run): no non-finite
# step, every step run, sampler-vs-trainer parity within 5e-2, measured peak vs the memory planner (the
# first-iteration ratio is INFO: 1 by construction at the config's grpo.num_iterations=1).
#
#   glm-grpo tiny-model outputs/glm_full --full-size-ar   # the real AR size, random weights
#   bash launch/gpu_check.sh outputs/glm_full                # or a real GLM-Image pipeline directory
#   bash launch/gpu_check.sh outputs/glm_full rollout.height=512 rollout.width=512 max_steps=2
#   bash launch/gpu_check.sh --num-gpus 8 outputs/glm_full  # N ranks: ZeRO-3's real gathers across GPUs
#   bash launch/gpu_check.sh --help                          # this text; nothing is launched
# --num-gpus N (default 1): the training run's ranks (deepspeed --num_gpus N). At world size 1 ZeRO-3
# partitions nothing, so its gathers and reduce-scatters are trivial; N > 1 runs them for real (and
# needs no forcing of the collectives).
# ZeRO-3 (DS_CONFIG, default ds_configs/zero3.json) on purpose, unlike train.sh's ZeRO-2 default: its gathers and
# partitioned parameters are the paths a CPU test sees least.
# Duration: not timed end to end as the script is now. Measured on one H200 (full-size AR, random weights; the
# numbers in docs/memory-and-speed.md): before the captured rollout (#39), this script's ZeRO-3 steps took 123 s
# each (eager decode), ~8 min for the 4 steps; since then a G=16 ZeRO-3 step's rollout takes 18.3 s and its
# update 20.2 s, so the 4 steps at G=8 should take ~2-3 min, plus loading the model for training and again for
# verify-logprobs (eager sampling, 2 x 2 images at 1024x1024): ~5-10 min in all, an estimate. --num-gpus 8: not
# measured. On a CPU with the tiny model at 64x64, 2 steps (tests/integration/test_gpu_check.py): ~1 min a run.
# Also runs on a CPU (gloo, bf16 on CPU; the tests do: tests/integration/test_gpu_check.py).
set -euo pipefail
for arg in "$@"; do # --help / -h: the comment block above, before anything runs
  if [[ $arg == -h || $arg == --help ]]; then awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0; fi
done
export HF_HUB_OFFLINE=1
USAGE="usage: bash launch/gpu_check.sh [--num-gpus N] MODEL_DIR [key=value ...]"
NUM_GPUS=1
if [ "${1:-}" = --num-gpus ]; then
  NUM_GPUS=${2:-}
  shift 2 || true
fi
[[ $NUM_GPUS =~ ^[1-9][0-9]*$ ]] || { echo "glm-grpo launch/gpu_check.sh: --num-gpus takes a positive number; $USAGE" >&2; exit 2; }
MODEL=${1:?$USAGE}
shift
FORCE=()
[ "$NUM_GPUS" -eq 1 ] || FORCE=(force_collectives=false) # every collective runs anyway at world size > 1
OUT=${OUT:-outputs/gpu_check}
DS_CONFIG=${DS_CONFIG:-ds_configs/zero3.json}
VERIFY_SIZE=${VERIFY_SIZE:-1024}
ATTN=$(python -c "import importlib.util, torch; print('flash_attention_2' if torch.cuda.is_available() and importlib.util.find_spec('flash_attn') else 'sdpa')")
MASTER_PORT=${MASTER_PORT:-$(python -m glm_grpo_ds.runtime.ports 29500 --for launch/gpu_check.sh)}  # 29500 unless taken

deepspeed --num_gpus "$NUM_GPUS" --master_port "$MASTER_PORT" --module glm_grpo_ds.train --config launch/configs/gpu_check.yaml --deepspeed "$DS_CONFIG" \
  model.path="$MODEL" output_dir="$OUT" overwrite_output_dir=true ${FORCE[@]+"${FORCE[@]}"} "$@"  # each check starts over
glm-grpo verify-logprobs --model "$MODEL" --dtype bf16 --attn "$ATTN" --temperature 0.9 --top-k 8 --top-p 0.75 \
  --height "$VERIFY_SIZE" --width "$VERIFY_SIZE" --group-size 2 --num-prompts 2 --tolerance 1 | tee "$OUT/verify.txt" || true
glm-grpo check-run "$OUT" --verify "$OUT/verify.txt"
