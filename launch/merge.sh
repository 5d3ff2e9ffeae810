#!/usr/bin/env bash
# Merge a trained LoRA adapter (or a checkpoint) into GLM-Image and write a complete pipeline.
#
#   bash launch/merge.sh /models/GLM-Image outputs/run/final_adapter /models/GLM-Image-grpo [bf16|fp32]
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 BASE_PIPELINE_DIR ADAPTER_OR_CHECKPOINT OUT_DIR [bf16|fp32]" >&2
  exit 2
fi
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
exec glm-grpo merge --base "$1" --adapter "$2" --out "$3" --dtype "${4:-fp32}"
