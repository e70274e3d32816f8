#!/usr/bin/env bash
# tests/multihost/elastic.sh TRAIN PREPARE_DATA — tools/elastic.sh across two hosts
# (tools/cluster), one rank each, data.global_batch 8 (batch 4 × dp 2). After the step-4
# checkpoint host 1 dies (every process killed, its link down); the supervisor sees the job
# fail, finds that host 1 no longer answers, and relaunches on host 0 alone (dp 1) from the last
# checkpoint, where the global batch is kept (grad_accum 2) and the run completes its steps.
# Exit 77 (skipped, saying why) where no cluster can be made. ctest: multihost.elastic.
set -euo pipefail
train=$1 prepare=$2
name="elastic test"
source "$(dirname "$0")/two_hosts.sh"
steps=12
(cd "$root" && OMP_NUM_THREADS=1 "$root/tools/elastic.sh" --hosts "$h0 $h1" --ppn 1 \
  --probe-timeout 10 --head "$cluster run $id 0" \
  --mpirun-args "$("$cluster" mpirun-args "$id") -x OMP_NUM_THREADS=1" \
  -- "$train" "${train_args[@]}" --set data.global_batch=8 --set train.steps=$steps \
  --set parallel.comm_timeout_s=3 >"$log" 2>&1) &
supervisor=$!
wait_for_step_4 "$supervisor"
ip netns pids "$h1" | xargs -r kill -9  # host 1 dies
"$cluster" link "$id" 1 down
for _ in $(seq 1 900); do
  kill -0 "$supervisor" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$supervisor" 2>/dev/null && fail "the supervisor still runs 90 s after the failure"
wait "$supervisor" || fail "the supervisor failed"
grep -q "elastic: host $h1 does not answer: dropped" "$log" || fail "host 1 was not dropped"
grep -q "elastic: launching on 1 hosts ($h0): 1 ranks, parallel.dp 1" "$log" ||
  fail "no relaunch on host 0 alone"
grep -Eq "^resumed from $out/checkpoints/step_0000000[4-9] " "$log" ||
  fail "the relaunch did not resume the last checkpoint"
grep -q "global batch: 8 sequences = data.batch_size 4 × parallel.dp 1 × optim.grad_accum 2" \
  "$log" || fail "the global batch was not kept"
grep -q "^step $steps/$steps " "$log" || fail "the run did not complete its $steps steps"
grep -E "^elastic:|^resumed|^global batch|^step 12|^rank" "$log"
echo "elastic test: host 1 dropped, resumed on host 0 at dp 1 with the global batch kept," \
  "$steps steps done"
