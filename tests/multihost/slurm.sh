#!/usr/bin/env bash
# tests/multihost/slurm.sh TRAIN PREPARE_DATA CONTEXT_TEST — Slurm across two hosts
# (tools/cluster/slurm.sh: slurmctld and a slurmd per host, jobs launched by `srun --mpi=pmix`):
#   1. CONTEXT_TEST (parallel_context_mpi_test) under srun, 2 nodes × 2 tasks: the ranks per
#      host from MPI agree with Slurm's;
#   2. tools/slurm/train.sbatch, 2 nodes × 2 tasks, dp 2 inside a host × pp 2 across the hosts,
#      data.global_batch 16, 6 steps stopped after step 4 (`--stop-at`), a checkpoint every 2;
#   3. the same script on 1 node × 2 tasks (pp 2, dp 1) resuming the latest checkpoint for steps
#      5-6 at the same global batch;
# passes when every step's loss and gradient norm equal one process's run of the 6 steps.
# Exit 77 (skipped, saying why) where no cluster can be made or Slurm is not installed.
# ctest: multihost.slurm.
set -euo pipefail
train=$1 prepare=$2 context_test=$3
name="slurm test"
here=$(cd "$(dirname "$0")" && pwd)
slurm="$here/../../tools/cluster/slurm.sh"
if ! why=$("$slurm" check 2>&1); then
  echo "multihost: skipped: $why"
  exit 77
fi
source "$here/two_hosts.sh"
"$slurm" up "$id"

log="$work/context.log"
"$slurm" run "$id" srun --mpi=pmix --nodes=2 --ntasks-per-node=2 --time=2 \
  --export=ALL,OMP_NUM_THREADS=1 "$context_test" >"$log" 2>&1 ||
  fail "the launch test failed under srun"

config=${train_args[1]}  # train_args: --config FILE --set …; the script takes FILE first
common=("${train_args[@]:2}" --set data.global_batch=16 --set checkpoint.every=2)
export LOOM_BUILD_DIR
LOOM_BUILD_DIR=$(cd "$(dirname "$train")/.." && pwd)
# sbatch --wait: the job's exit status; the CPU nodes override the script's GPU lines.
job() {
  log="$work/job$1.out"
  shift
  (cd "$root" && "$slurm" run "$id" sbatch --wait --quiet --output="$log" --gpus-per-node=0 \
    --cpus-per-task=1 --time=5 "$@") || fail "the Slurm job failed"
}
job 1 --nodes=2 --ntasks-per-node=2 tools/slurm/train.sbatch "$config" "${common[@]}" \
  --set parallel.dp=2 --set parallel.pp=2 --set train.steps=6 --stop-at 4
grep -q "^topology: 2 hosts: $h0 ranks 0-1, $h1 ranks 2-3; dp 2 inside a host, pp 2 across 2 hosts" \
  "$log" || fail "the job's topology line is not dp inside a host and pp across the two"
grep -q "^step 4/6 " "$log" || fail "the two-node job did not run its 4 steps"
job 2 --nodes=1 --ntasks-per-node=2 tools/slurm/train.sbatch "$config" "${common[@]}" \
  --set parallel.dp=1 --set parallel.pp=2 --set train.steps=6 --resume latest
grep -Eq "^resumed from $out/checkpoints/step_00000004 " "$log" ||
  fail "the one-node job did not resume the step-4 checkpoint"

log="$work/one.log"
OMP_NUM_THREADS=1 "$train" --config "$config" "${common[@]}" --set train.steps=6 --set train.out_dir="$work/one" \
  >"$log" 2>&1 || fail "the one-process run failed"
python3 - "$out/metrics.jsonl" "$work/one/metrics.jsonl" <<'PY' || fail "the runs differ"
import json, sys
def steps(path):
    rows = {}
    for line in open(path):
        r = json.loads(line)
        if "train/loss" in r:
            rows[r["step"]] = (r["train/loss"], r["train/grad_norm"])
    return rows
slurm, one = steps(sys.argv[1]), steps(sys.argv[2])
assert sorted(one) == list(range(1, 7)), f"one process: steps {sorted(one)}"
assert sorted(slurm) == sorted(one), f"Slurm jobs: steps {sorted(slurm)}"
for s in sorted(one):
    (l, n), (l1, n1) = slurm[s], one[s]
    print(f"step {s}: loss {l:.7f} vs {l1:.7f}, norm {n:.6f} vs {n1:.6f}")
    assert abs(l - l1) <= 2e-5 * abs(l1), f"step {s}: loss {l} != {l1}"
    assert abs(n - n1) <= 2e-4 * abs(n1), f"step {s}: gradient norm {n} != {n1}"
PY
echo "slurm test: 2 nodes (dp 2 × pp 2) then 1 node (resumed, pp 2) under sbatch/srun --mpi=pmix" \
  "equal one process over 6 steps"
