#!/usr/bin/env bash
# tools/elastic.sh — a supervisor that keeps a training run going when hosts fail: it launches
# `train` with mpirun over the hosts, and when the job fails it asks each host whether it still
# answers (a one-rank mpirun there, with a deadline), drops those that do not, and relaunches on
# the rest with `--resume latest` at the new world size. Checkpoints reshard on load, and with
# data.global_batch set the global batch — so the data each step sees — stays what it was
# (Note [Global batch] in train/config.cpp); without it the trainer says the batches change.
#
#   tools/elastic.sh --hosts "node1 node2 node3" --ppn 8 [--model-parallel 4] \
#     [--max-restarts 3] [--probe-timeout 20] [--head "CMD"] [--mpirun-args "ARGS"] \
#     -- build/bin/train --config run.yaml --set data.global_batch=512
#
# parallel.dp is set to hosts × ppn / model-parallel (tp·pp·cp) at every launch. --head runs
# mpirun through a command (tools/cluster: `cluster.sh run ID 0`); --mpirun-args are added to
# every mpirun (MCA settings). Exit: 0 when a launch completes, 1 when restarts or hosts run out.
set -euo pipefail

hosts="" ppn=1 model_parallel=1 max_restarts=3 probe_timeout=20 head="" mpirun_args=""
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --ppn) ppn=$2; shift 2 ;;
    --model-parallel) model_parallel=$2; shift 2 ;;
    --max-restarts) max_restarts=$2; shift 2 ;;
    --probe-timeout) probe_timeout=$2; shift 2 ;;
    --head) head=$2; shift 2 ;;
    --mpirun-args) mpirun_args=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "elastic: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "elastic: no train command after --" >&2; exit 2; }
read -r -a alive <<<"$hosts"
[ ${#alive[@]} -gt 0 ] || { echo "elastic: --hosts is empty" >&2; exit 2; }
flags=()
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
read -r -a extra <<<"$mpirun_args"
read -r -a head_cmd <<<"$head"
hostfile=$(mktemp)
trap 'rm -f "$hostfile"' EXIT

say() { echo "elastic: $*" >&2; }

# mpirun over the hosts in `alive`, ppn ranks each, with parallel.dp for that world.
launch() {
  local resume=("$@")
  local world=$((${#alive[@]} * ppn))
  if ((world % model_parallel != 0)); then
    say "$world ranks do not divide by --model-parallel $model_parallel"
    return 1
  fi
  : >"$hostfile"
  for h in "${alive[@]}"; do echo "$h slots=$ppn" >>"$hostfile"; done
  say "launching on ${#alive[@]} hosts (${alive[*]}): $world ranks, parallel.dp $((world / model_parallel))"
  "${head_cmd[@]}" mpirun "${flags[@]}" -np "$world" --hostfile "$hostfile" --map-by slot \
    "${extra[@]}" "${train[@]}" --set parallel.dp=$((world / model_parallel)) "${resume[@]}"
}

# Whether host h still answers: one rank there, within the deadline.
answers() {
  timeout -k 2 "$probe_timeout" "${head_cmd[@]}" mpirun "${flags[@]}" -np 1 --host "$1" \
    "${extra[@]}" true >/dev/null 2>&1
}

train=("$@")
restarts=0
resume=()
while :; do
  if launch "${resume[@]}"; then
    say "the run completed"
    exit 0
  fi
  if ((restarts >= max_restarts)); then
    say "the job failed and $max_restarts restarts are spent"
    exit 1
  fi
  restarts=$((restarts + 1))
  kept=()
  for h in "${alive[@]}"; do
    if answers "$h"; then kept+=("$h"); else say "host $h does not answer: dropped"; fi
  done
  if [ ${#kept[@]} -eq 0 ]; then
    say "no host answers"
    exit 1
  fi
  alive=("${kept[@]}")
  resume=(--resume latest)
  say "restart $restarts of $max_restarts from the last checkpoint"
done
