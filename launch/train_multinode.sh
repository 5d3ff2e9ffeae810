#!/usr/bin/env bash
# Multi-node GRPO training with the deepspeed launcher.
#
# (a) ssh mode - run once, on the first node of the hostfile; DeepSpeed ssh-es into the others:
#   HOSTFILE=launch/hostfile MASTER_ADDR=node-0 CONFIG=launch/configs/glm_image_lora_zero3.yaml \
#     bash launch/train_multinode.sh model.path=/shared/GLM-Image
# (b) no-ssh mode - run on every node with its NODE_RANK (0 on the MASTER_ADDR node):
#   NODE_RANK=1 HOSTFILE=launch/hostfile MASTER_ADDR=node-0 bash launch/train_multinode.sh ...
#
# Environment: HOSTFILE (required; see launch/hostfile.example), MASTER_ADDR (required: node 0's
# address as the other nodes reach it), MASTER_PORT (default 29500), NUM_NODES (default: lines in
# the hostfile), NODE_RANK (set -> no-ssh mode), CONFIG, DS_CONFIG (default ds_configs/zero3.json).
# resume_from=auto: relaunching continues from output_dir's latest checkpoint (a first launch starts
# fresh); pass resume_from=null to refuse a used output_dir instead.
# NCCL settings (and HF_HOME on shared storage, so every node reads the model rank 0 downloaded) go in
# a `.deepspeed_env` file in $HOME or the working directory (DS_ENV_FILE names another file), one
# VAR=value per line, e.g.
#   NCCL_SOCKET_IFNAME=eth0
#   NCCL_IB_HCA=mlx5
#   NCCL_DEBUG=WARN
# This script exports them before it starts the launcher (launch/env.sh): DeepSpeed itself reads the
# file only when it ssh-es into the nodes, not with --no_ssh. In no-ssh mode each node reads its own
# file: put it on shared storage, or the same file on every node.
set -euo pipefail
# shellcheck source=launch/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
export_deepspeed_env
: "${HOSTFILE:?set HOSTFILE (see launch/hostfile.example)}"
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node in the hostfile}"
NUM_NODES=${NUM_NODES:-$(grep -cvE '^\s*(#|$)' "$HOSTFILE")}
CONFIG=${CONFIG:-launch/configs/glm_image_lora_zero3.yaml}
DS_CONFIG=${DS_CONFIG:-ds_configs/zero3.json}
# HF_HUB_OFFLINE and HF_HOME are yours: model.path=zai-org/GLM-Image downloads once into the Hugging Face
# cache unless HF_HUB_OFFLINE=1, which reads the cache only (glm_grpo_ds/model/source.py).
MASTER_PORT=${MASTER_PORT:-29500}
args=(--hostfile "$HOSTFILE" --num_nodes "$NUM_NODES" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT")
if [ -n "${NODE_RANK:-}" ]; then
  args+=(--no_ssh --node_rank "$NODE_RANK")
fi
# SIGTERM / SIGINT to this script go to this node's training ranks, not the launcher (launch/signals.sh):
# the ranks agree after the step, save a checkpoint on every node and exit 143 / 130.
# shellcheck source=launch/signals.sh
source "$(dirname "${BASH_SOURCE[0]}")/signals.sh"
run_deepspeed "${args[@]}" --module glm_grpo_ds.train --config "$CONFIG" --deepspeed "$DS_CONFIG" \
  resume_from=auto "$@"
