# Sourced by launch/train.sh and launch/train_multinode.sh: `run_deepspeed ARGS...` runs `deepspeed ARGS...`
# and exits with its status, passing SIGTERM / SIGINT to the training ranks instead of the launcher.
#
# Why: the deepspeed launcher answers SIGTERM / SIGINT by terminating its ranks and SIGKILLs them 30 s
# later, too soon for a full-size step plus a checkpoint save. A rank that gets the signal itself
# records it, finishes its step, and every rank saves and exits 143 (SIGTERM) / 130 (SIGINT)
# (glm_grpo_ds/lifecycle/preempt.py); the launcher then exits with that status and so does this script.
#
# The ranks: this user's `python -u -m glm_grpo_ds.train --local_rank=N` processes on this node whose
# environment has this run's MASTER_PORT (set it before sourcing). That also finds node 0's ranks in ssh
# mode, which pdsh starts through ssh; signalling some ranks is enough, the ranks agree after the step.
# Before the ranks exist (the launcher's first seconds) the signal goes to the launcher's process
# group instead: nothing is saved yet, so it only stops the run.
# SIGHUP (the terminal closed) is passed on as SIGTERM: checkpoint and stop.
# The launcher runs in its own process group (set -m), so a Ctrl-C at the terminal reaches this
# script only, and each rank sees each Ctrl-C once (a second one aborts at once, as without the script).
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then # run, not sourced: --help prints the comment block above
  if [[ ${1:-} == -h || ${1:-} == --help ]]; then awk '!/^#/ {exit} {sub(/^# ?/, ""); print}' "$0"; exit 0; fi
  echo "glm-grpo launch/signals.sh: sourced by the launch scripts, not run; see bash launch/signals.sh --help" >&2
  exit 2
fi

forward_to_ranks() { # SIGNAL
  local pid found=""
  for pid in $(pgrep -u "$(id -u)" -f 'glm_grpo_ds[.]train --local_rank='); do
    if grep -qz "^MASTER_PORT=$MASTER_PORT\$" "/proc/$pid/environ" 2>/dev/null; then
      kill -"$1" "$pid" 2>/dev/null && found=1
    fi
  done
  [ -n "$found" ] || kill -"$1" -- "-$launcher" 2>/dev/null || true
}

run_deepspeed() { # ARGS of deepspeed
  set -m # the launcher in a process group of its own
  deepspeed "$@" &
  launcher=$!
  set +m
  trap 'forward_to_ranks INT' INT
  trap 'forward_to_ranks TERM' TERM HUP
  set +e
  wait "$launcher" # returns early when a trap ran: wait again while the ranks save
  while kill -0 "$launcher" 2>/dev/null; do wait "$launcher"; done
  wait "$launcher" # it has ended: its exit status (bash keeps it)
  exit $?
}
