# Sourced by launch/train.sh, launch/train_multinode.sh and launch/slurm.sbatch (not run on its own).
#
# export_deepspeed_env: export the VAR=value lines of DeepSpeed's environment file - `.deepspeed_env`,
# or the name in DS_ENV_FILE - from $HOME, then from the working directory: the files and the order
# DeepSpeed 0.19.8 reads (deepspeed/launcher/runner.py), where a later file's value wins and a file's
# value replaces one already in the environment, as on DeepSpeed's ssh (pdsh) path. DeepSpeed reads the
# file only when it ssh-es into several nodes; its --no_ssh path (one launcher per node, which
# launch/train_multinode.sh with NODE_RANK and every slurm.sbatch job use) and its one-node path ignore
# it, so NCCL_SOCKET_IFNAME, HF_HOME and the like written there would never reach the ranks.
# Blank lines and lines starting with # are skipped (DeepSpeed itself fails on them); a value is taken
# as written, surrounding spaces and one pair of matching quotes removed, nothing expanded. Prints
# the names it exported (never the values: a token may be among them) on stderr.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then # run, not sourced: --help prints the comment block above
  if [[ ${1:-} == -h || ${1:-} == --help ]]; then awk '!/^#/ {exit} {sub(/^# ?/, ""); print}' "$0"; exit 0; fi
  echo "glm-grpo launch/env.sh: sourced by the launch scripts, not run; see bash launch/env.sh --help" >&2
  exit 2
fi
export_deepspeed_env() {
  local name=${DS_ENV_FILE:-.deepspeed_env} file line key value number names
  local -a files=("$HOME/$name" "./$name")
  [[ $name == /* ]] && files=("$name")
  for file in "${files[@]}"; do
    [ -f "$file" ] || continue
    names=() number=0
    while IFS= read -r line || [ -n "$line" ]; do
      number=$((number + 1))
      line=${line%$'\r'}
      [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
      key=${line%%=*}
      key=${key#"${key%%[![:space:]]*}"} # trim
      key=${key%"${key##*[![:space:]]}"}
      if [[ $line != *=* || ! $key =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
        echo "glm-grpo: $file line $number: expected VAR=value, got: $line" >&2
        return 2
      fi
      value=${line#*=}
      value=${value#"${value%%[![:space:]]*}"}
      value=${value%"${value##*[![:space:]]}"}
      if [[ ${#value} -ge 2 && ( $value == \"*\" || $value == \'*\' ) && ${value:0:1} == "${value: -1}" ]]; then
        value=${value:1:${#value}-2}
      fi
      export "$key=$value"
      names+=("$key")
    done <"$file"
    [ ${#names[@]} -eq 0 ] || echo "glm-grpo: exported from $file: ${names[*]}" >&2
  done
  return 0
}

# gpu_memory_gb: the GiB per GPU the preflight plans against: GPU_MEMORY_GB when set, else the smallest GPU
# nvidia-smi lists on this node (as torch counts it: MiB / 1024), else nothing, and the check plans for 80 GiB (its
# line says which figure it used). Without it a 40 GB GPU passed a plan of 44.5 GiB, and an H200 was refused one
# that fits.
gpu_memory_gb() {
  if [ -n "${GPU_MEMORY_GB:-}" ]; then
    echo "$GPU_MEMORY_GB"
  else
    nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null |
      awk '$1 + 0 > 0 && (min == "" || $1 + 0 < min) {min = $1 + 0} END {if (min != "") printf "%.1f\n", min / 1024}' ||
      true
  fi
}
