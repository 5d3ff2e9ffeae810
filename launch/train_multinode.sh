#!/usr/bin/env bash
# Multi-node GRPO training with the deepspeed launcher.
#
# (a) ssh mode - run once, on the first node of the hostfile; DeepSpeed ssh-es into the others:
#   HOSTFILE=launch/hostfile MASTER_ADDR=node-0 bash launch/train_multinode.sh model.path=/shared/GLM-Image
#   (DeepSpeed passes the overrides through each node's shell: one holding $ ` \ ; & | < > ( ), quotes without a
#   space or a {a,b} brace is refused; put such a value in CONFIG, or use no-ssh mode)
# (b) no-ssh mode - run on every node with its NODE_RANK (0 on the MASTER_ADDR node):
#   NODE_RANK=1 HOSTFILE=launch/hostfile MASTER_ADDR=node-0 bash launch/train_multinode.sh ...
#   bash launch/train_multinode.sh --help                # this text; nothing is launched
#
# Environment: HOSTFILE (required; see launch/hostfile.example), MASTER_ADDR (required: node 0's
# address as the other nodes reach it), MASTER_PORT (default 29500), NUM_NODES (default: the hosts in
# the hostfile), NODE_RANK (set -> no-ssh mode), CONFIG (default launch/configs/glm_image_lora.yaml),
# DS_CONFIG (default ds_configs/zero2.json: the fastest shipped stage the LoRA config fits on 8x80 GB;
# full fine-tuning, launch/configs/glm_image_full.yaml, fits only at ZeRO-3: DS_CONFIG=ds_configs/zero3.json),
# PREFLIGHT (default 1; 0 skips the preflight check, below), GPU_MEMORY_GB (GiB per GPU the check plans against;
# default: the smallest GPU nvidia-smi lists on the node that checks, else 80).
# The hostfile is read first, on every node, as the launcher reads it (glm_grpo_ds/runtime/hostfile.py): a
# missing file (the launcher would train on this node alone), no host in it, a bad line or a host listed twice
# is one line and exit 2 instead of the launcher's traceback.
# Preflight (ssh mode, or NODE_RANK=0): `python -m glm_grpo_ds.train --check` with the same config, DeepSpeed
# config, hostfile, node count and overrides checks every input (config, data, reward model files, resume path,
# output_dir and its disk room, the DeepSpeed config, the memory plan) in seconds without loading a model: one
# line and exit 2 on a bad input, exit 3 when the plan does not fit. In no-ssh mode start node 0 first: when its
# check fails, the other nodes' ranks would wait for it until their rendezvous times out.
# resume_from=auto: relaunching continues from output_dir's latest checkpoint (a first launch starts
# fresh); pass resume_from=null to refuse a used output_dir instead.
# NCCL settings (and HF_HOME on shared storage, so every node reads the model rank 0 downloaded) go in
# a `.deepspeed_env` file in $HOME or the working directory (DS_ENV_FILE names another file), one
# VAR=value per line, e.g.
#   NCCL_SOCKET_IFNAME=eth0
#   NCCL_IB_HCA=mlx5
#   NCCL_DEBUG=WARN
# This script exports them before it starts the launcher (launch/env.sh): DeepSpeed itself reads the
# file only when it ssh-es into the nodes, not with --no_ssh, and then is handed a copy holding only
# the VAR=value lines (comments and blank lines would break every node's command). In no-ssh mode each
# node reads its own file: put it on shared storage, or the same file on every node.
set -euo pipefail
for arg in "$@"; do # --help / -h: the comment block above, before anything runs
  if [[ $arg == -h || $arg == --help ]]; then awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0; fi
done
# shellcheck source=launch/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
export_deepspeed_env
fail() { echo "glm-grpo launch/train_multinode.sh: $*" >&2; exit 2; }
[ -n "${HOSTFILE:-}" ] || fail "set HOSTFILE to the hostfile, one 'HOST slots=N' line per node (see launch/hostfile.example)"
[ -n "${MASTER_ADDR:-}" ] || fail "set MASTER_ADDR to the address of the first node in the hostfile, as the others reach it"
summary=$(python -m glm_grpo_ds.runtime.hostfile "$HOSTFILE") || exit 2 # its one line is on stderr
read -r hosts _ <<<"$summary" # "2 nodes, 16 slots"
NUM_NODES=${NUM_NODES:-$hosts}
[[ $NUM_NODES =~ ^[1-9][0-9]*$ && $NUM_NODES -le $hosts ]] ||
  fail "NUM_NODES=$NUM_NODES: give a number of nodes from 1 to $hosts (the hosts in $HOSTFILE), or unset it to use them all"
[[ -z ${NODE_RANK:-} || ( $NODE_RANK =~ ^(0|[1-9][0-9]*)$ && $NODE_RANK -lt $NUM_NODES ) ]] ||
  fail "NODE_RANK=$NODE_RANK: give this node's rank, 0 to $((NUM_NODES - 1)) ($NUM_NODES nodes), 0 on MASTER_ADDR"
CONFIG=${CONFIG:-launch/configs/glm_image_lora.yaml}
DS_CONFIG=${DS_CONFIG:-ds_configs/zero2.json}
# ssh mode: DeepSpeed's pdsh runner hands the working directory and the arguments to a shell on every node, an
# argument in double quotes only when it holds a space: a $, a backquote or a backslash there, and outside quotes
# also ; & | < > ( ) quotes and a {a,b} brace, would run a command on every node or change the value it trains with.
if [ -z "${NODE_RANK:-}" ]; then
  [[ $PWD =~ ^[A-Za-z0-9_./+@:,=%~-]+$ ]] || fail "the working directory '$PWD' holds a space or a character the \
nodes' shell would read (ssh mode runs \`cd' to it unquoted): run from another path, or launch each node with its NODE_RANK"
  brace='\{[^}]*(,|\.\.)[^}]*\}'
  for arg in "$CONFIG" "$DS_CONFIG" "$@"; do
    if [[ $arg == *$'\n'* || $arg == *[\$\`\\]* ]] ||
      [[ $arg != *" "* && ( $arg == *[\;\&\|\<\>\(\)\"\']* || $arg =~ $brace ) ]]; then
      fail "'$arg' holds a character the nodes' shell would read (ssh mode passes it through one): put the value in \
the config file (CONFIG), or launch each node with its NODE_RANK (no-ssh mode passes arguments as they are)"
    fi
  done
  deepspeed_env_for_ssh || exit 2 # the launcher reads .deepspeed_env again: the lines taken above, nothing else
fi
# Node 0 checks for the job (the inputs live on shared storage); the same check on every node would only repeat it.
if [ "${PREFLIGHT:-1}" != 0 ] && [ "${NODE_RANK:-0}" = 0 ]; then
  # GPUs per node: the hostfile's slots, which the check reads (the launcher gives each node its slots)
  mem=$(gpu_memory_gb)
  python -m glm_grpo_ds.train --check --config "$CONFIG" --deepspeed "$DS_CONFIG" --hostfile "$HOSTFILE" \
    --num-nodes "$NUM_NODES" ${mem:+--gpu-memory-gb "$mem"} resume_from=auto "$@" || exit $?
fi
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
