#!/usr/bin/env bash
# tests/multihost/elastic.sh TRAIN PREPARE_DATA — tools/elastic.sh across two hosts
# (tools/cluster), one rank each, data.global_batch 8 (batch 4 × dp 2). After the step-4
# checkpoint host 1 dies (every process killed, its link down); the supervisor sees the job
# fail, finds that host 1 no longer answers, and relaunches on host 0 alone (dp 1) from the last
# checkpoint, where the global batch is kept (grad_accum 2) and the run completes its steps.
# Exit 77 (skipped, saying why) where no cluster can be made. ctest: multihost.elastic.
set -euo pipefail
train=$1 prepare=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cluster="$root/tools/cluster/cluster.sh"
fail() {
  echo "elastic test: $*" >&2
  [ -f "${log:-}" ] && sed 's/^/  | /' "$log" >&2
  exit 1
}
if ! why=$("$cluster" check 2>&1); then
  echo "multihost: skipped: $why"
  exit 77
fi
"$cluster" sweep
id=$(printf '%x' $$)
work=$(mktemp -d "${TMPDIR:-/tmp}/loom_elastic_XXXXXX")
cleanup() {
  "$cluster" down "$id"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
LOOM_CLUSTER_OWNER=$$ "$cluster" up "$id" 2
h0=$("$cluster" host "$id" 0)
h1=$("$cluster" host "$id" 1)

"$prepare" --input "$root/data/samples/chat_sample.jsonl" --format chat --out-dir "$work/data" \
  >/dev/null 2>&1
out="$work/run"
log="$work/elastic.log"
steps=12
(cd "$root" && OMP_NUM_THREADS=1 "$root/tools/elastic.sh" --hosts "$h0 $h1" --ppn 1 \
  --probe-timeout 10 --head "$cluster run $id 0" --mpirun-args "$("$cluster" mpirun-args "$id") -x OMP_NUM_THREADS=1" \
  -- "$train" --config "$root/configs/gpt2-tiny.yaml" --set model.n_layer=2 --set model.n_embd=64 \
  --set model.n_head=2 --set data.train="$work/data/train_*.bin" --set "data.val=''" \
  --set data.batch_size=4 --set data.global_batch=8 --set train.steps=$steps \
  --set train.peak_flops=1e10 --set train.log_every=1 --set train.val_every=0 \
  --set train.sample_every=0 --set optim.warmup_steps=1 --set checkpoint.every=2 \
  --set checkpoint.keep=0 --set parallel.comm_timeout_s=3 --set train.out_dir="$out" \
  >"$log" 2>&1) &
supervisor=$!
for _ in $(seq 1 600); do
  grep -q "^checkpoint: .*step_00000004 " "$log" 2>/dev/null && break
  kill -0 "$supervisor" 2>/dev/null || fail "the run ended before its step-4 checkpoint"
  sleep 0.1
done
grep -q "^checkpoint: .*step_00000004 " "$log" || fail "no step-4 checkpoint within 60 s"
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
