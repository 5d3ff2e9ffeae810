#!/usr/bin/env bash
# Single-node GRPO training with the deepspeed launcher.
#
#   NUM_GPUS=8 bash launch/train.sh data.train_file=/data/prompts.jsonl          # LoRA at ZeRO-2 (the defaults)
#   CONFIG=launch/configs/glm_image_full.yaml DS_CONFIG=ds_configs/zero3.json bash launch/train.sh  # full fine-tuning
#   CUDA_VISIBLE_DEVICES=4,5 CONFIG=... bash launch/train.sh            # a shared node: GPUs 4 and 5 only
#   DS_ACCELERATOR=cpu NUM_GPUS=2 CONFIG=launch/configs/tiny_cpu.yaml bash launch/train.sh max_steps=10  # CPU ranks
#     (the tiny model and its prompts first: glm-grpo tiny-model outputs/tiny && glm-grpo tiny-data --config CONFIG)
#   bash launch/train.sh --help                                          # this text; nothing is launched
#
# Environment: NUM_GPUS (ranks; default: the entries of CUDA_VISIBLE_DEVICES when set, else every GPU
# nvidia-smi lists), CUDA_VISIBLE_DEVICES (honoured: those GPU ids, never others), DS_ACCELERATOR=cpu
# (CPU ranks on purpose, NUM_GPUS of them, default 1), CONFIG (default launch/configs/glm_image_lora.yaml),
# DS_CONFIG (default ds_configs/zero2.json: the fastest shipped stage the LoRA config fits on 8x80 GB, 44.5 GiB
# per GPU; full fine-tuning, launch/configs/glm_image_full.yaml, fits only at ZeRO-3: DS_CONFIG=ds_configs/zero3.json),
# MASTER_PORT (default 29500, or a free port when another run on this node holds it:
# glm_grpo_ds/runtime/ports.py), PREFLIGHT (default 1; 0 skips the preflight check, below), GPU_MEMORY_GB (GiB
# per GPU the check plans against; default: the smallest GPU nvidia-smi lists, else 80); .deepspeed_env is exported
# (launch/env.sh). Arguments are key=value config overrides.
# Preflight: before the launcher, `python -m glm_grpo_ds.train --check` with the same config, DeepSpeed config,
# overrides and rank count checks every input (config, data, reward model files, resume path, output_dir and its
# disk room, the DeepSpeed config, the memory plan) in seconds, without loading a model: a bad input stops here
# with one line (exit 2), a plan that does not fit with exit 3 and the stage that does, instead of after the model
# loads.
# GPUs that torch cannot use (a torch CUDA build newer than the driver) stop the launch with one line
# (exit 2) instead of a silent run on the CPU; a node without NVIDIA GPUs runs 1 CPU rank and says so.
# resume_from=auto: relaunching the same command continues from output_dir's latest checkpoint (a
# first launch starts fresh); pass resume_from=null to refuse a used output_dir instead.
set -euo pipefail
for arg in "$@"; do # --help / -h: the comment block above, before anything runs
  if [[ $arg == -h || $arg == --help ]]; then awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0; fi
done
# shellcheck source=launch/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
export_deepspeed_env
fail() { echo "glm-grpo launch/train.sh: $*" >&2; exit 2; }
[[ -z ${NUM_GPUS:-} || $NUM_GPUS =~ ^[1-9][0-9]*$ ]] ||
  fail "NUM_GPUS=$NUM_GPUS: give a number of ranks, e.g. NUM_GPUS=8 (or unset it: every GPU of this node)"

case "${DS_ACCELERATOR:-}" in
  cpu) mode=cpu ;;
  "") # cuda, cpu (no NVIDIA GPU here and none asked), or one line on stderr and exit 2
    mode=$(python -m glm_grpo_ds.runtime.cuda_check ${NUM_GPUS:+NUM_GPUS=$NUM_GPUS} \
      ${CUDA_VISIBLE_DEVICES:+CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES}) || exit 2
    if [ "$mode" = cpu ]; then
      echo "glm-grpo launch/train.sh: no NVIDIA GPU on this node: 1 CPU rank (DS_ACCELERATOR=cpu)" >&2
      export DS_ACCELERATOR=cpu
    fi ;;
  *) mode=gpu ;; # DS_ACCELERATOR=cuda (or another accelerator): each rank checks torch can use it
esac

if [ "$mode" = cpu ]; then
  n=${NUM_GPUS:-1}
  where=(--num_gpus "$n")
elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  # The launcher replaces CUDA_VISIBLE_DEVICES with 0..N-1 for --num_gpus N (the wrong GPUs on a shared
  # node); --include localhost:IDS makes it give the ranks exactly those ids.
  IFS=, read -ra ids <<<"$CUDA_VISIBLE_DEVICES"
  for id in "${ids[@]}"; do
    [[ $id =~ ^[0-9]+$ ]] || fail "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES: the deepspeed launcher takes GPU indices (0,1,...), not '$id'; give the indices nvidia-smi -L prints"
  done
  n=${NUM_GPUS:-${#ids[@]}}
  [ "$n" -ge 1 ] && [ "$n" -le "${#ids[@]}" ] ||
    fail "NUM_GPUS=$n but CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES gives ${#ids[@]} GPU(s): ask for at most ${#ids[@]}, or unset NUM_GPUS to use them all"
  where=(--include "localhost:$(IFS=,; echo "${ids[*]:0:$n}")")
  unset CUDA_VISIBLE_DEVICES # the launcher counts the node's GPUs to check the ids, then sets it per rank
else
  n=${NUM_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)}
  [ "${n:-0}" -ge 1 ] || fail "nvidia-smi lists no GPU: set NUM_GPUS, or DS_ACCELERATOR=cpu for CPU ranks"
  where=(--num_gpus "$n")
fi
CONFIG=${CONFIG:-launch/configs/glm_image_lora.yaml}
DS_CONFIG=${DS_CONFIG:-ds_configs/zero2.json}
if [ "${PREFLIGHT:-1}" != 0 ]; then # the check's own line says what is wrong; its status is this script's
  mem=$(gpu_memory_gb)
  device=cuda
  if [ "$mode" = cpu ]; then device=cpu; fi # CPU ranks: planned as they run (model.dtype auto = fp32)
  python -m glm_grpo_ds.train --check --config "$CONFIG" --deepspeed "$DS_CONFIG" --num-gpus "$n" --device "$device" \
    ${mem:+--gpu-memory-gb "$mem"} resume_from=auto "$@" || exit $?
fi
# HF_HUB_OFFLINE and HF_HOME are yours: model.path=zai-org/GLM-Image downloads once into the Hugging Face
# cache unless HF_HUB_OFFLINE=1, which reads the cache only (glm_grpo_ds/model/source.py).
# SIGTERM / SIGINT to this script go to the training ranks, not the launcher (launch/signals.sh): they
# finish the step, save a checkpoint and exit 143 / 130, however long that takes.
MASTER_PORT=${MASTER_PORT:-$(python -m glm_grpo_ds.runtime.ports 29500 --for launch/train.sh)}
# shellcheck source=launch/signals.sh
source "$(dirname "${BASH_SOURCE[0]}")/signals.sh"
run_deepspeed "${where[@]}" --master_port "$MASTER_PORT" \
  --module glm_grpo_ds.train --config "$CONFIG" --deepspeed "$DS_CONFIG" resume_from=auto "$@"
