#!/usr/bin/env bash
# tools/bench/diloco_failure_bench.sh BUILD_DIR [STEPS [RATE]] — the long version of
# tests/multihost/diloco.sh's failure run (docs/performance.md, "DiLoCo"): 3 islands of 1 rank on
# 3 test-bed hosts (links at RATE, default 144mbit), gpt2-tiny, H 10, outer average; island 2 is
# killed (kill -9) a third of the way through and started again (no checkpoint) at two thirds.
# Prints the rounds' membership over time and every island's validation losses, and island 0's
# mean seconds per step before, during and after the outage. Needs root; benchmark, not a test.
set -euo pipefail
build=${1:?usage: diloco_failure_bench.sh BUILD_DIR [STEPS [RATE]]}
steps=${2:-300}
rate=${3:-144mbit}
root=$(cd "$(dirname "$0")/../.." && pwd)
cluster="$root/tools/cluster/cluster.sh"
train="$(cd "$build" && pwd)/bin/train"
prepare="$(cd "$build" && pwd)/bin/prepare_data"
work=$(mktemp -d /tmp/loom_diloco_fail_XXXXXX)
id=$(printf 'f%x' $(($$ % 65536)))
cleanup() {
  "$cluster" down "$id" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
"$cluster" check >/dev/null || { echo "diloco_failure_bench: $("$cluster" check)" >&2; exit 1; }
"$prepare" --input /usr/share/games/fortunes --format fortunes --out-dir "$work/data" >/dev/null 2>&1
LOOM_CLUSTER_OWNER=$$ "$cluster" up "$id" 3 "$rate"
island() {  # K OUT LOG
  "$cluster" run "$id" "$1" env OMP_NUM_THREADS=1 "$train" --config "$root/configs/gpt2-tiny.yaml" \
    --set data.train="$work/data/train_*.bin" --set data.val="$work/data/val_*.bin" \
    --set data.batch_size=4 --set train.steps="$steps" --set train.val_every=10 \
    --set train.val_steps=4 --set train.sample_every=0 --set train.log_every=1 \
    --set checkpoint.every=0 --set checkpoint.at_end=false --set train.peak_flops=1e10 \
    --set parallel.comm_timeout_s=20 --set parallel.diloco.islands=3 \
    --set parallel.diloco.island="$1" --set parallel.diloco.rendezvous="$work/rv" \
    --set parallel.diloco.inner_steps=10 --set parallel.diloco.outer=average \
    --set parallel.diloco.quorum_timeout_s=5 --set train.out_dir="$2" >"$3" 2>&1 &
}
at_step() {  # LOG STEP: waits until the log has reached STEP
  until grep -q "^step $2/" "$1" 2>/dev/null; do sleep 0.2; done
}
island 0 "$work/o0" "$work/i0.log"; p0=$!
island 1 "$work/o1" "$work/i1.log"; p1=$!
island 2 "$work/o2" "$work/i2.log"
at_step "$work/i0.log" $((steps / 3))
t_kill=$(date +%s.%N)
ip netns pids "$("$cluster" host "$id" 2)" | xargs -r kill -9
echo "killed island 2 at island 0's step $((steps / 3))"
at_step "$work/i0.log" $((2 * steps / 3))
t_back=$(date +%s.%N)
island 2 "$work/o2b" "$work/i2b.log"; p2=$!
echo "restarted island 2 at island 0's step $((2 * steps / 3))"
wait "$p0" "$p1" "$p2"
echo
echo "rounds (island 0's log), where the membership or outcome changes:"
sed -n 's/^diloco: round [0-9f-]* (step \([0-9]*\), fragment 0): islands \([0-9,]*\) (\([0-9]*\) contributing), \([a-z]*\).*/\1 \2 \3 \4/p' \
  "$work/i0.log" | awk '{k = $2 " " $3 " " $4; if (k != last) {printf "  from step %s: islands %s (%s contributing), %s\n", $1, $2, $3, $4; last = k}}'
grep -h "joined the running islands" "$work/i2b.log" | sed 's/^/  /'
echo
echo "| step | island 0 val | island 1 val | island 2 val (killed, then restarted) |"
echo "| --- | --- | --- | --- |"
for s in $(seq 10 10 "$steps"); do
  v0=$(sed -n "s/^step $s | val loss //p" "$work/i0.log")
  v1=$(sed -n "s/^step $s | val loss //p" "$work/i1.log")
  v2=$(sed -n "s/^step $s | val loss //p" "$work/i2.log" "$work/i2b.log" 2>/dev/null | head -1)
  echo "| $s | $v0 | $v1 | ${v2:-—} |"
done
python3 - "$work/o0/metrics.jsonl" "$steps" <<'PY'
import json, sys
n = int(sys.argv[2])
ms = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "perf/ms_per_step" in r:
        ms[r["step"]] = r["perf/ms_per_step"]
def mean(a, b):
    v = [ms[s] for s in range(a, b) if s in ms]
    return sum(v) / len(v) / 1e3
print(f"\nisland 0, s/step: 3 islands {mean(2, n // 3):.3f}; island 2 gone {mean(n // 3 + 1, 2 * n // 3):.3f}; "
      f"after the rejoin {mean(2 * n // 3 + 1, n + 1):.3f}")
PY
