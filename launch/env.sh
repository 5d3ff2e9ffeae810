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
#
# deepspeed_env_for_ssh: after export_deepspeed_env, for DeepSpeed's ssh path, which reads the file again itself and
# pastes each line into every node's command as `export KEY=value;` with no room for a comment or a blank line (a
# `# NCCL_SOCKET_IFNAME=eth0` line comments out the rest of that command: no node trains and the launch exits 0): the
# lines export_deepspeed_env took, written as VAR=value to a file of their own, named in DS_ENV_FILE for the launcher
# (removed when the script exits). A value the nodes' shell would read ($, a backquote, a backslash, a double quote)
# is refused in one line.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then # run, not sourced: --help prints the comment block above
  if [[ ${1:-} == -h || ${1:-} == --help ]]; then awk '!/^#/ {exit} {sub(/^# ?/, ""); print}' "$0"; exit 0; fi
  echo "glm-grpo launch/env.sh: sourced by the launch scripts, not run; see bash launch/env.sh --help" >&2
  exit 2
fi
DEEPSPEED_ENV_NAMES=()
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
      DEEPSPEED_ENV_NAMES+=("$key")
    done <"$file"
    [ ${#names[@]} -eq 0 ] || echo "glm-grpo: exported from $file: ${names[*]}" >&2
  done
  return 0
}

deepspeed_env_for_ssh() {
  local name value file
  file=$(mktemp "${TMPDIR:-/tmp}/glm-grpo-deepspeed-env.XXXXXX" 2>/dev/null) || {
    echo "glm-grpo: cannot write the copy of .deepspeed_env for ssh mode in ${TMPDIR:-/tmp}: set TMPDIR to a writable folder" >&2
    return 2
  }
  # shellcheck disable=SC2064  # the name now: the trap runs when the script exits
  trap "rm -f '$file'" EXIT
  for name in ${DEEPSPEED_ENV_NAMES[@]+"${DEEPSPEED_ENV_NAMES[@]}"}; do
    value=${!name}
    if [[ $value == *[\$\`\\\"]* ]]; then
      echo "glm-grpo: $name of .deepspeed_env holds a character the nodes' shell would read in ssh mode (\$, a backquote, a backslash or a double quote): set it another way, or launch each node with its NODE_RANK" >&2
      return 2
    fi
    printf '%s=%s\n' "$name" "$value" >>"$file"
  done
  export DS_ENV_FILE=$file
}

# gpu_memory_gb: the GiB per GPU the preflight plans against: GPU_MEMORY_GB when set, else the smallest GPU
# nvidia-smi lists on this node, its total less what the driver reserves (memory.reserved: the part torch never sees;
# drivers without that field: the total), in GiB, else nothing, and the check plans for 80 GiB (its line says which
# figure it used). Without it a 40 GB GPU passed a plan of 44.5 GiB, and an H200 was refused one that fits; with the
# total alone a plan within the driver's half GiB passed and could not load.
gpu_memory_gb() {
  if [ -n "${GPU_MEMORY_GB:-}" ]; then
    echo "$GPU_MEMORY_GB"
  else
    {
      nvidia-smi --query-gpu=memory.total,memory.reserved --format=csv,noheader,nounits 2>/dev/null ||
        nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null
    } | awk -F', *' '{mib = $1 - $2} $1 + 0 > 0 && (min == "" || mib < min) {min = mib}
      END {if (min != "") printf "%.1f\n", min / 1024}' || true
  fi
}
