#!/usr/bin/env bash
# Merge a trained LoRA adapter (or a checkpoint) into GLM-Image and write a complete pipeline.
#
#   bash launch/merge.sh zai-org/GLM-Image outputs/run/final_adapter /models/GLM-Image-grpo [bf16|fp32|fp16]
set -euo pipefail
for arg in "$@"; do # --help / -h: the comment block above, before anything runs
  if [[ $arg == -h || $arg == --help ]]; then awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0; fi
done
if [ $# -lt 3 ] || [ $# -gt 4 ]; then # a fifth word (`... fp32 --dtype bf16`) was dropped: the merge ran as fp32
  echo "usage: $0 BASE_PIPELINE_DIR_OR_HUB_ID ADAPTER_OR_CHECKPOINT OUT_DIR [bf16|fp32|fp16] (got $# arguments;" \
    "glm-grpo merge takes the flags)" >&2
  exit 2
fi
exec glm-grpo merge --base "$1" --adapter "$2" --out "$3" --dtype "${4:-bf16}"
