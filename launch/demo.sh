#!/usr/bin/env bash
# The main job on the embedded tiny GLM-Image, offline, on CPU (what `make demo` runs).
#
#   bash launch/demo.sh            # writes outputs/tiny/ and outputs/demo/*.png
#   OUT=/tmp/demo bash launch/demo.sh
set -euo pipefail
export HF_HUB_OFFLINE=1
OUT=${OUT:-outputs}

glm-grpo tiny-model "$OUT/tiny" --seed 0
glm-grpo render --model "$OUT/tiny" --height 64 --width 96 --steps 4 --out "$OUT/demo" \
  --prompt "a red cube on a table" --prompt "a shop sign that says 'OPEN'"
