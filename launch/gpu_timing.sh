#!/usr/bin/env bash
# What the rollout costs on this GPU, in under 8 minutes on one H100 (issues #39, #51): the decode step timed variant
# by variant on the full-size AR with random weights (glm-grpo decode-timing: eager LoRA, LoRA merged, CUDA graph,
# graph + compiled layers, the fused exact sampler, HF generate; ms per step against the HBM roofline, tokens checked
# against the eager loop), then the fast variants' decode step at 16 / 32 / 64 / 128 rows (several prompts' groups in
# one captured batch: ms per step and rollout seconds per image), then two training steps of GLM-Image at its full
# real size (AR 40 + DiT 30 layers, built on the GPU; ZeRO-2, G=16, 1024², 8 guided DiT steps) with the exact fast
# rollout (LoRA unmerged, fused, layers compiled, captured): per phase, per image and images per GPU-second, with the
# planned times beside (issue #52).
#
#   bash launch/gpu_timing.sh                      # everything: decode timing + rows + two training steps (ZeRO-2)
#   TRAIN_STEP=0 bash launch/gpu_timing.sh         # the decode timing and the rows only
#   ROWS= bash launch/gpu_timing.sh                # no rows loop (ROWS=16,64: those rows only)
#   ROW_VARIANTS=graph bash launch/gpu_timing.sh   # the rows' variants (default graph_compiled,graph_fused_compiled)
#   MERGED=1 bash launch/gpu_timing.sh             # the training step samples merged (rollout.merge_lora) instead
#   DECODE_TIMING=0 bash launch/gpu_timing.sh      # the training step only (no decode timing, no rows)
#   bash launch/gpu_timing.sh --layers 8           # an 8-layer real-width slice (ms scaled to 40 layers shown)
#   MODEL=outputs/glm_image bash launch/gpu_timing.sh  # reuse a full-size model directory (built on the first run)
#   FULL_SIZE=0 bash launch/gpu_timing.sh          # the training step on the full-size AR with the tiny DiT
#   DIT_COMPILE=1 bash launch/gpu_timing.sh        # the training steps with the DiT's blocks compiled (decoder.compile)
#   ONE_STEP_OFF=1 TRAIN_STEPS=3 bash launch/gpu_timing.sh  # each next rollout beside the decode (rollout.one_step_off,
#                                                  # with grpo.sampler_correction=token_truncate); step 1 is serial
#   ONE_STEP_OFF=both bash launch/gpu_timing.sh    # the training steps serial (train/), then one step off
#                                                  # (train_one_step_off/), then the two compared on their steady steps
#   DIT_TIMING=0 bash launch/gpu_timing.sh         # no DiT decode timing (glm-grpo dit-timing, on the full-size model
#                                                  # before its training steps: compiled, cudnn, fp8, all)
#   DIT_VARIANTS=sdpa,compiled,fp8 bash launch/gpu_timing.sh  # the DiT timing's variants (all: glm-grpo dit-timing
#                                                  # --help; each loads the 14 GB DiT, ~40 s + its compile on an H200)
#   TRAIN_STEPS=3 bash launch/gpu_timing.sh        # training steps to time (default 2: the first compiles and captures)
#   MERGE_DRIFT_STEPS=50 bash launch/gpu_timing.sh     # then also merged vs exact sampling on the real-width slice,
#                                                      # bf16, N steps each (benchmarks/merge_drift.py; ~5-8 min more)
# Arguments go to every glm-grpo decode-timing run (the rows loop sets its own --group-size and --variants).
# Writes OUT (default outputs/gpu_timing): decode_timing.json, decode_timing_rows_N.json, dit_timing.json,
# estimate_train.json, train/ (ONE_STEP_OFF=both: estimate_train_one_step_off.json, train_one_step_off/ too),
# glm_image/ (the full-size model, 34 GB: delete it after, or keep it for MODEL=).
# Also runs on a CPU in its reduced form (the tests do: tests/integration/test_fast_rollout.py):
#   TRAIN_STEP=0 ROWS=2,4 ROW_VARIANTS=graph bash launch/gpu_timing.sh --tiny --steps 8 --group-size 4 --size 256
set -euo pipefail
for arg in "$@"; do # --help / -h: the comment block above, before anything runs
  if [[ $arg == -h || $arg == --help ]]; then awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0; fi
done
export HF_HUB_OFFLINE=1
OUT=${OUT:-outputs/gpu_timing}
ROWS=${ROWS-16,32,64,128}
ROW_VARIANTS=${ROW_VARIANTS:-graph_compiled,graph_fused_compiled}  # merged / exact, both captured with layers compiled
read -r -a row_list <<< "${ROWS//,/ }"
for n in "${row_list[@]}"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || {
    echo "gpu_timing.sh: ROWS=$ROWS: $n is not a number of rows; give e.g. ROWS=16,64 (or ROWS= for none)" >&2
    exit 2
  }
done
ONE_STEP_OFF=${ONE_STEP_OFF:-0}
[[ "$ONE_STEP_OFF" =~ ^(0|1|both)$ ]] || {
  echo "gpu_timing.sh: ONE_STEP_OFF=$ONE_STEP_OFF: give 0 (serial steps), 1 (one step off) or both (the two, compared)" >&2
  exit 2
}
MERGE_DRIFT_STEPS=${MERGE_DRIFT_STEPS:-0}
[[ "$MERGE_DRIFT_STEPS" =~ ^[0-9]+$ ]] || {
  echo "gpu_timing.sh: MERGE_DRIFT_STEPS=$MERGE_DRIFT_STEPS is not a number of steps; give e.g. MERGE_DRIFT_STEPS=50" >&2
  exit 2
}
mkdir -p "$OUT"
[ "${DECODE_TIMING:-1}" = 0 ] || glm-grpo decode-timing --out "$OUT/decode_timing.json" "$@"
if [ "${DECODE_TIMING:-1}" != 0 ] && [ "${#row_list[@]}" -gt 0 ]; then
  row_files=()
  for n in "${row_list[@]}"; do
    rows_json="$OUT/decode_timing_rows_$n.json"
    # where the default run already timed these variants at these rows, its figures are copied (one build of the
    # full-size AR and its compiles less: ~1 minute of the 8)
    copied=$(python - "$OUT/decode_timing.json" "$n" "$ROW_VARIANTS" "$rows_json" <<'PY'
import json, sys
path, rows, names, out = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
m = json.load(open(path))
if m["group_size"] == rows and all(v in m["variants"] for v in names):
    m["variants"] = {v: m["variants"][v] for v in names}
    m["failures"] = [f for f in m["failures"] if f.split(":")[0] in names]
    json.dump(m, open(out, "w"), indent=1)
    print("yes")
PY
)
    if [ "$copied" = yes ]; then
      echo "glm-grpo: the decode step at $n rows ($ROW_VARIANTS): the default run's, copied to $rows_json"
    else
      echo "glm-grpo: the decode step at $n rows ($ROW_VARIANTS)"
      glm-grpo decode-timing "$@" --group-size "$n" --variants "$ROW_VARIANTS" --out "$rows_json"
    fi
    row_files+=("$rows_json")
  done
  python - "${row_files[@]}" <<'PY'
import json, sys
# rollout s per image = ms per decode step x generated tokens per image / rows (all rows decode in one step)
reports = [json.load(open(path)) for path in sys.argv[1:]]
first = reports[0]
print(f"rows per decode step on {first['device']}: {first['layers']} layers, {first['size']}², "
      f"{first['decode_tokens']} tokens per image, {first['steps_timed']} steps timed")
print(f"{'rows':>5}  {'variant':<22}{'ms/step':>9}{'floor ms':>9}{'rollout s/image':>16}")
for m in reports:
    floor = f"{m['floor_ms_per_step']:.2f}" if m["floor_ms_per_step"] else "-"
    for name, r in m["variants"].items():
        per_image = r["ms_per_step"] / 1e3 * m["decode_tokens"] / m["group_size"]
        print(f"{m['group_size']:>5}  {name:<22}{r['ms_per_step']:>9.2f}{floor:>9}{per_image:>16.3f}")
PY
fi
if [ "$MERGE_DRIFT_STEPS" != 0 ]; then
  SLICE=${SLICE:-$OUT/slice}
  [ -f "$SLICE/model_index.json" ] || glm-grpo tiny-model "$SLICE" --real-width --ar-layers 1 --dit-layers 1
  python benchmarks/merge_drift.py --model "$SLICE" --out "$OUT/merge_drift" --steps "$MERGE_DRIFT_STEPS" --procs 1
fi
[ "${TRAIN_STEP:-1}" = 1 ] || exit 0
if [ "${FULL_SIZE:-1}" = 1 ]; then  # GLM-Image at its real size: AR 40 layers + DiT 30 layers, random weights
  MODEL=${MODEL:-$OUT/glm_image}
  [ -f "$MODEL/model_index.json" ] || {
    echo "glm-grpo: building GLM-Image at its full size on the GPU in $MODEL (~1 s, saved in ~1 min, 34 GB)"
    glm-grpo tiny-model "$MODEL" --real-width --ar-layers 40 --dit-layers 30 --device cuda
  }
  if [ "${DIT_TIMING:-1}" != 0 ]; then  # the frozen DiT decode per variant (kernel, compile, fp8); a few minutes
    # the reference, compiled, the lossless stack, FP8 eager and compiled, everything (estimated ~5-6 min: 4 compiles)
    DIT_VARIANTS=${DIT_VARIANTS:-sdpa,compiled,cudnn_compiled,fp8,fp8_compiled,fp8_cudnn_compiled}
    glm-grpo dit-timing --model "$MODEL" --out "$OUT/dit_timing.json" --variants "$DIT_VARIANTS" --repeats 1 ||
      echo "gpu_timing.sh: glm-grpo dit-timing exited $? (a variant failed, above); going on to the training steps" >&2
  fi
  DECODE="decoder.num_inference_steps=8 decoder.guidance_scale=1.5 decoder.batch_size=8"
else  # the full-size AR with the tiny DiT (the rollout and update at size; the decode is not)
  MODEL=${MODEL:-$OUT/model}
  [ -f "$MODEL/model_index.json" ] || { echo "glm-grpo: building the full-size AR pipeline in $MODEL"; glm-grpo tiny-model "$MODEL" --full-size-ar; }
  DECODE=""
fi
if [ "${MERGED:-0}" = 1 ]; then
  SAMPLER="rollout.fuse_lora=false rollout.merge_lora=true rollout.cuda_graph=true"  # merged: not exactly the policy
else  # the exact fast path: the adapter unmerged through the fused low-rank path, layers compiled, captured
  SAMPLER="rollout.fuse_lora=true rollout.compile=true rollout.compile_scope=layers rollout.cuda_graph=true"
fi
[ "${DIT_COMPILE:-0}" = 1 ] && DECODE="$DECODE decoder.compile=true"
OFF="rollout.one_step_off=true grpo.sampler_correction=token_truncate"  # the next rollout beside this step's decode
DS_CONFIG=${DS_CONFIG:-ds_configs/zero2.json}
MASTER_PORT=${MASTER_PORT:-$(python -m glm_grpo_ds.runtime.ports 29500 --for launch/gpu_timing.sh)}  # 29500 unless taken
train_steps() {  # $1: the run's directory under OUT; $2: extra settings. Planned, run, then its steps printed
  local settings="model.path=$MODEL max_steps=${TRAIN_STEPS:-2} grpo.group_size=16 $SAMPLER $DECODE $2 ${TRAIN_OVERRIDES:-}"
  glm-grpo estimate-memory --config launch/configs/gpu_check.yaml --deepspeed "$DS_CONFIG" --num-gpus 1 --json \
    --allow-over-budget $settings > "$OUT/estimate_$1.json"
  deepspeed --num_gpus 1 --master_port "$MASTER_PORT" --module glm_grpo_ds.train --config launch/configs/gpu_check.yaml \
    --deepspeed "$DS_CONFIG" output_dir="$OUT/$1" overwrite_output_dir=true $settings
  echo "training steps on this GPU, $1 (the first one compiles and captures; the plan: glm-grpo estimate-memory):"
  python -m glm_grpo_ds.memory.step_time "$OUT/$1" "$OUT/estimate_$1.json"
}
case "$ONE_STEP_OFF" in
  0) train_steps train "" ;;
  1) train_steps train "$OFF" ;;
  both)
    train_steps train ""
    train_steps train_one_step_off "$OFF"
    python -m glm_grpo_ds.memory.step_time --compare "$OUT/train" "$OUT/train_one_step_off"
    ;;
esac
