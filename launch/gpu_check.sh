#!/usr/bin/env bash
# One command that checks, on ONE GPU, the paths a multi-GPU bf16 run takes: a short training run
# (launch/configs/gpu_check.yaml: bf16, flash-attention when installed, NCCL collectives forced on at
# world size 1, top-k 8 / top-p 0.75 sampling, LoRA, 8-bit AdamW, ZeRO-3), then verify-logprobs in
# bf16 with the same cuts, then PASS/FAIL lines (glm-grpo check-run): no non-finite step, ratio 1 on
# the first iteration, sampler-vs-trainer parity within 5e-2, measured peak vs the memory planner.
#
#   glm-grpo tiny-model outputs/glm_full --full-size-ar   # the real AR size, random weights
#   bash launch/gpu_check.sh outputs/glm_full                # or a real GLM-Image pipeline directory
#   bash launch/gpu_check.sh outputs/glm_full rollout.height=512 rollout.width=512 max_steps=2
# Also runs on a CPU (gloo, bf16 on CPU; the tests do: tests/integration/test_gpu_check.py).
set -euo pipefail
export HF_HUB_OFFLINE=1
MODEL=${1:?usage: bash launch/gpu_check.sh MODEL_DIR [key=value ...]}
shift
OUT=${OUT:-outputs/gpu_check}
DS_CONFIG=${DS_CONFIG:-ds_configs/zero3.json}
VERIFY_SIZE=${VERIFY_SIZE:-1024}
ATTN=$(python -c "import importlib.util, torch; print('flash_attention_2' if torch.cuda.is_available() and importlib.util.find_spec('flash_attn') else 'sdpa')")

deepspeed --num_gpus 1 --master_port "${MASTER_PORT:-29500}" --module glm_grpo_ds.train --config launch/configs/gpu_check.yaml --deepspeed "$DS_CONFIG" \
  model.path="$MODEL" output_dir="$OUT" overwrite_output_dir=true "$@"  # each check starts over
glm-grpo verify-logprobs --model "$MODEL" --dtype bf16 --attn "$ATTN" --temperature 0.9 --top-k 8 --top-p 0.75 \
  --height "$VERIFY_SIZE" --width "$VERIFY_SIZE" --group-size 2 --num-prompts 2 --tolerance 1 | tee "$OUT/verify.txt" || true
glm-grpo check-run "$OUT" --verify "$OUT/verify.txt"
