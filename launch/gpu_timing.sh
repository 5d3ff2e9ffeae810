#!/usr/bin/env bash
# What a training step of GLM-Image costs on this GPU and where its time goes, in one lease: at most 9 minutes of wall
# clock on one H100 or H200, every build and compile included (issue #63). Four parts, in order of value, each writing
# its JSON under OUT as it ends, so a run cut short keeps what it measured:
#   1. train.json: the full-size training step (GLM-Image, AR 40 + DiT 30 layers, random weights built on the GPU:
#      model.path=random:glm-image), ZeRO-2, G=16, 1024², 8 guided DiT steps, every lossless lever on (the exact fused
#      sampler captured, the DiT's blocks compiled), 3 steps: each phase's seconds, per image, images per GPU-second;
#   2. train_one_step_off.json: the same, one step off (rollout.one_step_off), 2 steps, compared with part 1's;
#   3. dit_timing.json: the DiT per guided image-step (glm-grpo profile dit-timing, one process, its JSON rewritten
#      after each variant): sdpa, compiled, fp8, and guidance on the first half of the steps only;
#   4. decode_timing.json: the decode step per sampler (glm-grpo profile decode-timing: exact eager, exact fused graph,
#      merged graph) at 16 and 64 rows, each captured one after its eager loop (fused, merged): the graph's tokens and
#      log-probs must be that loop's bit for bit on this GPU (exit 1 and the part failed when not).
# Before anything runs each part's seconds are planned from the figures glm_grpo_ds/memory/gpu_figures.py holds and the
# one-off costs glm_grpo_ds/memory/timing_budget.py states, and printed (part, planned s); a part that would not fit
# what is left of the budget when it starts is skipped with one line, and one still running when the budget ends is
# stopped (a training part's finished steps and the DiT's finished variants are still reported; a training part's step
# in progress is lost: timeout signals the launcher too, which kills its ranks 30 s later, and the next part waits for
# them to be gone, at most 40 s). Then one command turns the JSONs
# into every figure a user reads: docs/memory-and-speed.md's tables, the README's time per step and the planner's
# anchors:
#   python -m glm_grpo_ds.memory.step_time --write-docs outputs/gpu_timing
#
#   bash launch/gpu_timing.sh                                  # the lease: the four parts, 540 s of wall clock
#   BUDGET_S=900 bash launch/gpu_timing.sh                     # another budget, in seconds
#   PARTS=dit_timing,decode_timing bash launch/gpu_timing.sh   # some parts (run in the order above)
#   ONE_STEP_OFF=0 bash launch/gpu_timing.sh                   # part 1 only of the two training parts (1: part 2 only)
#   TRAIN_STEPS=3 OFF_STEPS=2 bash launch/gpu_timing.sh        # the training parts' steps (the first compiles, captures)
#   DIT_VARIANTS=sdpa,compiled,fp8,guidance_half DIT_BATCH=8   # part 3 (all: glm-grpo profile dit-timing --help)
#   ROWS=16,64 ROW_VARIANTS=eager,fused,graph_fused,merged,graph DECODE_STEPS=64  # part 4 (ROWS= : none; the
#                                                              # variants: glm-grpo profile decode-timing --help)
#   MODEL=zai-org/GLM-Image bash launch/gpu_timing.sh          # every part on another model (default random:glm-image;
#                                                              # random:glm-image,ar_layers=8,dit_layers=2: a slice)
#   SIZE=1024 TRAIN_OVERRIDES="key=value ..."                  # the image size of every part; more training settings
#   DS_CONFIG=ds_configs/zero2.json MASTER_PORT=29500          # the training parts' DeepSpeed config and port
#   MERGE_DRIFT_STEPS=50 bash launch/gpu_timing.sh             # then merged vs exact sampling on the real-width slice,
#                                                              # bf16 (benchmarks/merge_drift.py), outside the budget
# Writes OUT (default outputs/gpu_timing): plan.json, env.txt (glm-grpo env), train.json + train/,
# train_one_step_off.json + train_one_step_off/, estimate_*.json, dit_timing.json, decode_timing.json +
# decode_timing_rows_N.json.
# Its CPU form (tests/integration/test_gpu_timing_lease.py; DS_ACCELERATOR=cpu):
#   MODEL=random:tiny SIZE=64 ROWS=2,4 DECODE_STEPS=4 DIT_BATCH=2 TRAIN_STEPS=2 BUDGET_S=3600 bash launch/gpu_timing.sh
set -euo pipefail
for arg in "$@"; do # --help / -h: the comment block above, before anything runs
  if [[ $arg == -h || $arg == --help ]]; then awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0; fi
done
refuse() { echo "gpu_timing.sh: $*" >&2; exit 2; }
[ $# -eq 0 ] || refuse "$1: takes no arguments, its settings are environment variables; see bash launch/gpu_timing.sh --help"
export HF_HUB_OFFLINE=1
OUT=${OUT:-outputs/gpu_timing}
MODEL=${MODEL:-random:glm-image}
SIZE=${SIZE:-1024}
BUDGET_S=${BUDGET_S:-540}
ALL_PARTS=(train train_one_step_off dit_timing decode_timing)
PARTS=${PARTS:-train,train_one_step_off,dit_timing,decode_timing}
ONE_STEP_OFF=${ONE_STEP_OFF:-both}
TRAIN_STEPS=${TRAIN_STEPS:-3}
OFF_STEPS=${OFF_STEPS:-2}
DIT_VARIANTS=${DIT_VARIANTS:-sdpa,compiled,fp8,guidance_half}
DIT_BATCH=${DIT_BATCH:-8}
ROWS=${ROWS-16,64}
# exact eager; exact fused, then captured; merged, then captured (a graph's reference before it: bitwise checked)
ROW_VARIANTS=${ROW_VARIANTS:-eager,fused,graph_fused,merged,graph}
DECODE_STEPS=${DECODE_STEPS:-64}
MERGE_DRIFT_STEPS=${MERGE_DRIFT_STEPS:-0}
DS_CONFIG=${DS_CONFIG:-ds_configs/zero2.json}
CONFIG=launch/configs/gpu_check.yaml
# every setting checked before anything runs or is written: one line naming it and the fix, exit 2
for pair in "BUDGET_S 540" "TRAIN_STEPS 3" "DIT_BATCH 8" "DECODE_STEPS 64" "SIZE 1024"; do
  read -r name example <<< "$pair"
  [[ "${!name}" =~ ^[1-9][0-9]*$ ]] || refuse "$name=${!name} is not a positive number; give e.g. $name=$example"
done
[[ "$OFF_STEPS" =~ ^[1-9][0-9]*$ && "$OFF_STEPS" -ge 2 ]] ||
  refuse "OFF_STEPS=$OFF_STEPS: give 2 steps or more (the first is serial), e.g. OFF_STEPS=2"
(( SIZE % 32 == 0 )) || refuse "SIZE=$SIZE is not a multiple of 32 pixels; give e.g. SIZE=1024"
read -r -a row_list <<< "${ROWS//,/ }"
for n in "${row_list[@]}"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || refuse "ROWS=$ROWS: $n is not a number of rows; give e.g. ROWS=16,64 (or ROWS= for none)"
done
[[ "$ONE_STEP_OFF" =~ ^(0|1|both)$ ]] ||
  refuse "ONE_STEP_OFF=$ONE_STEP_OFF: give 0 (serial steps), 1 (one step off) or both (the two, compared; the default)"
[[ "$MERGE_DRIFT_STEPS" =~ ^[0-9]+$ ]] ||
  refuse "MERGE_DRIFT_STEPS=$MERGE_DRIFT_STEPS is not a number of steps; give e.g. MERGE_DRIFT_STEPS=50"
read -r -a asked <<< "${PARTS//,/ }"
for part in "${asked[@]}"; do
  [[ " ${ALL_PARTS[*]} " == *" $part "* ]] ||
    refuse "PARTS=$PARTS: $part is not a part; choose from $(IFS=,; echo "${ALL_PARTS[*]}")"
done
parts=()
for part in "${ALL_PARTS[@]}"; do  # the asked parts in order of value, less those the other settings leave out
  [[ " ${asked[*]} " == *" $part "* ]] || continue
  [[ $part == train && $ONE_STEP_OFF == 1 ]] && continue
  [[ $part == train_one_step_off && $ONE_STEP_OFF == 0 ]] && continue
  [[ $part == decode_timing && ${#row_list[@]} -eq 0 ]] && continue
  parts+=("$part")
done

# the training parts: launch/configs/gpu_check.yaml at full size, the exact fast sampler (LoRA unmerged through the
# fused low-rank path, the step captured: bitwise its eager loop) and the DiT's blocks compiled (lossless in fp32)
common="grpo.group_size=16 rollout.height=$SIZE rollout.width=$SIZE rollout.fuse_lora=true rollout.cuda_graph=true"
common="$common decoder.num_inference_steps=8 decoder.guidance_scale=1.5 decoder.batch_size=8 decoder.compile=true"
off="rollout.one_step_off=true grpo.sampler_correction=token_truncate"  # the next rollout beside this step's decode
declare -A settings=(
  [train]="model.path=$MODEL max_steps=$TRAIN_STEPS $common ${TRAIN_OVERRIDES:-}"
  [train_one_step_off]="model.path=$MODEL max_steps=$OFF_STEPS $common $off ${TRAIN_OVERRIDES:-}"
)
mkdir -p "$OUT"
SECONDS=0  # the lease's wall clock, from here
python -m glm_grpo_ds.memory.timing_budget plan --out "$OUT/plan.json" --budget "$BUDGET_S" \
  --parts "$(IFS=,; echo "${parts[*]}")" --config "$CONFIG" --deepspeed "$DS_CONFIG" --size "$SIZE" \
  --train "${settings[train]}" --off "${settings[train_one_step_off]}" --dit-variants "$DIT_VARIANTS" \
  --dit-batch "$DIT_BATCH" --rows "$ROWS" --row-variants "$ROW_VARIANTS" --decode-steps "$DECODE_STEPS"
# what the figures were measured with (GPU, driver, CUDA, NCCL, every package), kept beside them; a dependency outside
# its supported range is said, not refused: a lease is too rare to lose to, say, an old torchmetrics it never uses
glm-grpo env > "$OUT/env.txt" 2>&1 ||
  echo "gpu_timing.sh: glm-grpo env: a dependency missing or outside its range ($OUT/env.txt); measuring anyway" >&2

within() {  # the command, stopped (SIGTERM, then SIGKILL 30 s later) when the lease's budget runs out: exit 124
  local left=$((BUDGET_S - SECONDS))
  (( left > 0 )) || return 124
  timeout -k 30 "$left" "$@"
}
settle() {  # $1: a training part cut at the budget. The launcher's runner ends at SIGTERM at once (timeout returns); its
  # ranks, signalled too, outlive it until their step ends or the launcher kills them 30 s later: what runs next must
  # not meet them on the GPU
  local pattern="output_dir=$OUT/$1 " i
  command -v pgrep > /dev/null || return 0
  for i in $(seq 40); do pgrep -f -- "$pattern" > /dev/null || return 0; sleep 1; done
  echo "gpu_timing.sh: $1's ranks still running 40 s after the cut: killed" >&2
  pkill -9 -f -- "$pattern" || true
}
train_part() {  # $1: the part. Its plan beside (estimate-memory, on the CPU while the GPU trains), then its steps
  local part=$1 estimate=() serial=() pid rc=0
  # shellcheck disable=SC2086  # the settings are words
  glm-grpo estimate-memory --config "$CONFIG" --deepspeed "$DS_CONFIG" --num-gpus 1 --json --allow-over-budget \
    ${settings[$part]} > "$OUT/estimate_$part.json" 2> "$OUT/estimate_$part.log" &
  pid=$!
  # shellcheck disable=SC2086
  # cut by the budget (124): the steps it finished are still reported below; another failure ends the part
  within deepspeed --num_gpus 1 --master_port "$MASTER_PORT" --module glm_grpo_ds.train --config "$CONFIG" \
    --deepspeed "$DS_CONFIG" output_dir="$OUT/$part" overwrite_output_dir=true ${settings[$part]} || rc=$?
  [ "$rc" = 124 ] && settle "$part"
  if [ "$rc" != 0 ] && { [ "$rc" != 124 ] || ! grep -qs time/rollout "$OUT/$part/metrics.jsonl"; }; then
    wait "$pid" || true
    return "$rc"
  fi
  [ "$rc" = 124 ] && echo "gpu_timing.sh: $part cut at the budget; its finished steps follow" >&2
  if wait "$pid"; then estimate=("$OUT/estimate_$part.json"); else
    echo "gpu_timing.sh: glm-grpo estimate-memory failed ($OUT/estimate_$part.log): $part without its plan" >&2
  fi
  [[ $part == train_one_step_off && -f "$OUT/train.json" ]] && serial=(--serial "$OUT/train")
  echo "training steps of $part on this machine (the first one compiles and captures; plan: glm-grpo estimate-memory):"
  python -m glm_grpo_ds.memory.step_time "$OUT/$part" "${estimate[@]}" --json "$OUT/$part.json" "${serial[@]}" || return
  return "$rc"
}
dit_part() {  # the DiT's variants in one process, its JSON rewritten after each; a variant that fails is listed in it
  local rc=0
  within glm-grpo profile dit-timing --model "$MODEL" --out "$OUT/dit_timing.json" --variants "$DIT_VARIANTS" \
    --batch "$DIT_BATCH" --size "$SIZE" --repeats 1 || rc=$?
  if [ "$rc" = 124 ] && [ -f "$OUT/dit_timing.json" ]; then
    echo "gpu_timing.sh: dit_timing cut at the budget; the variants it finished are in $OUT/dit_timing.json" >&2
  fi
  [ "$rc" = 0 ] || [ -f "$OUT/dit_timing.json" ]
}
decode_part() {  # one process per rows; the rows measured are kept if a later one fails
  local files=() n rc status=0
  for n in "${row_list[@]}"; do
    echo "glm-grpo: the decode step at $n rows ($ROW_VARIANTS)"
    rc=0
    within glm-grpo profile decode-timing --model "$MODEL" --group-size "$n" --size "$SIZE" --steps "$DECODE_STEPS" \
      --variants "$ROW_VARIANTS" --out "$OUT/decode_timing_rows_$n.json" || rc=$?
    [ "$rc" = 0 ] || { echo "gpu_timing.sh: decode-timing at $n rows exited $rc (above)" >&2; status=$rc; }
    # its JSON written: measured (a failed bitwise check is said in it and above), the next rows still run; none: it
    # broke or ran out of budget, and the next rows would too
    if [ -f "$OUT/decode_timing_rows_$n.json" ]; then files+=("$OUT/decode_timing_rows_$n.json"); else break; fi
  done
  if [ "${#files[@]}" -gt 0 ]; then
    python -m glm_grpo_ds.memory.timing_budget rows "$OUT/decode_timing.json" "${files[@]}" || return
  fi
  [ "$status" = 0 ]
}

if [[ " ${parts[*]} " == *" train"* ]]; then  # 29500 unless taken
  MASTER_PORT=${MASTER_PORT:-$(python -m glm_grpo_ds.runtime.ports 29500 --for launch/gpu_timing.sh)}
fi
measured=() skipped=() failed=()
for part in "${parts[@]}"; do
  rc=0
  python -m glm_grpo_ds.memory.timing_budget fits "$OUT/plan.json" "$part" "$SECONDS" || rc=$?
  [ "$rc" = 2 ] && exit 2
  [ "$rc" = 1 ] && { skipped+=("$part"); continue; }
  echo "gpu_timing.sh: part $part, at $SECONDS s of $BUDGET_S"
  rm -f "$OUT/$part.json" "$OUT/estimate_$part.json"  # an earlier run's figures are not this run's
  [[ $part == decode_timing ]] && rm -f "$OUT"/decode_timing_rows_*.json
  start=$SECONDS rc=0
  case $part in
    train*) train_part "$part" || rc=$? ;;
    dit_timing) dit_part || rc=$? ;;
    decode_timing) decode_part || rc=$? ;;
  esac
  if [ -f "$OUT/$part.json" ]; then  # its plan and its wall seconds beside its figures (without them: still measured)
    python -m glm_grpo_ds.memory.timing_budget done "$OUT/plan.json" "$part" $((SECONDS - start)) "$OUT/$part.json" ||
      echo "gpu_timing.sh: $part: its planned and wall seconds not added to $OUT/$part.json (above)" >&2
  fi
  if [ "$rc" = 0 ]; then measured+=("$part"); else
    echo "gpu_timing.sh: $part failed (exit $rc, above); going on to the next part" >&2
    failed+=("$part")
  fi
done
echo "gpu_timing.sh: $SECONDS s of $BUDGET_S; measured: ${measured[*]:-none}; skipped: ${skipped[*]:-none};" \
  "failed: ${failed[*]:-none}. Next: python -m glm_grpo_ds.memory.step_time --write-docs $OUT"
if [ "$MERGE_DRIFT_STEPS" != 0 ]; then
  echo "gpu_timing.sh: merged vs exact sampling, $MERGE_DRIFT_STEPS steps each, outside the budget"
  SLICE=${SLICE:-$OUT/slice}
  [ -f "$SLICE/model_index.json" ] || glm-grpo tiny-model "$SLICE" --real-width --ar-layers 1 --dit-layers 1
  python benchmarks/merge_drift.py --model "$SLICE" --out "$OUT/merge_drift" --steps "$MERGE_DRIFT_STEPS" --procs 1
fi
[ "${#failed[@]}" = 0 ]
