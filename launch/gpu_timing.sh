#!/usr/bin/env bash
# What the rollout costs on this GPU, in under 8 minutes on one H100 (issue #39): the decode step timed variant
# by variant on the full-size AR with random weights (glm-grpo decode-timing: eager LoRA, LoRA merged, CUDA graph,
# graph + compiled layers, HF generate; ms per step against the HBM roofline, tokens checked against the eager
# loop), then one training step of that AR with the fast rollout settings and its per-phase times.
#
#   bash launch/gpu_timing.sh                      # everything: decode timing + one training step (ZeRO-2)
#   TRAIN_STEP=0 bash launch/gpu_timing.sh         # the decode timing only (~2 minutes)
#   DECODE_TIMING=0 bash launch/gpu_timing.sh      # the training step only
#   bash launch/gpu_timing.sh --layers 8           # an 8-layer real-width slice (ms scaled to 40 layers shown)
#   MODEL=outputs/glm_full bash launch/gpu_timing.sh   # reuse a `glm-grpo tiny-model DIR --full-size-ar` directory
# Arguments go to glm-grpo decode-timing. Writes OUT (default outputs/gpu_timing): decode_timing.json, train/.
# Also runs on a CPU in its reduced form (the tests do: tests/integration/test_decode_timing.py):
#   TRAIN_STEP=0 bash launch/gpu_timing.sh --tiny --steps 8 --group-size 4 --size 256
set -euo pipefail
export HF_HUB_OFFLINE=1
OUT=${OUT:-outputs/gpu_timing}
mkdir -p "$OUT"
[ "${DECODE_TIMING:-1}" = 0 ] || glm-grpo decode-timing --out "$OUT/decode_timing.json" "$@"
[ "${TRAIN_STEP:-1}" = 1 ] || exit 0
MODEL=${MODEL:-$OUT/model}
[ -f "$MODEL/model_index.json" ] || { echo "glm-grpo: building the full-size AR pipeline in $MODEL"; glm-grpo tiny-model "$MODEL" --full-size-ar; }
MASTER_PORT=${MASTER_PORT:-$(python -m glm_grpo_ds.runtime.ports 29500 --for launch/gpu_timing.sh)}  # 29500 unless taken
deepspeed --num_gpus 1 --master_port "$MASTER_PORT" --module glm_grpo_ds.train --config launch/configs/gpu_check.yaml \
  --deepspeed "${DS_CONFIG:-ds_configs/zero2.json}" model.path="$MODEL" output_dir="$OUT/train" overwrite_output_dir=true \
  max_steps=1 grpo.group_size=16 rollout.merge_lora=true rollout.cuda_graph=true ${TRAIN_OVERRIDES:-}
python - "$OUT/train/metrics.jsonl" <<'PY'
import json, sys
record = [json.loads(line) for line in open(sys.argv[1])][-1]
times = {k: v for k, v in record.items() if k.startswith("time/")}
print("one training step: " + ", ".join(f"{k[5:]} {v:.2f} s" for k, v in times.items()))
PY
