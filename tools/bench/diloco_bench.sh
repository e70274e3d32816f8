#!/usr/bin/env bash
# tools/bench/diloco_bench.sh BUILD_DIR ISLANDS RATE [STEPS [RUNS]] — DiLoCo against synchronous
# data parallelism across islands that talk over slow links (docs/performance.md, "DiLoCo"): a
# test-bed cluster (tools/cluster) of ISLANDS hosts, 2 ranks each, every host's link limited to
# RATE (a tc rate: the scale model's 144mbit for two ranks, tools/bench/multihost_bench.sh, or a
# much slower cross-region one). Prints one markdown row per method: the training time (the sum
# of the trainer's own step times, validation excluded), the time and inter-island bytes to reach
# the target validation loss, the validation loss after STEPS, the bytes that left the hosts
# (every host link's tc counters: all inter-island traffic, control included) and the largest
# round an island sent (DiLoCo's own count). Validation is island 0's model every 50 steps.
#
# Synchronous DDP (dp = 2·ISLANDS over all hosts) is the baseline and sets the target: its
# validation loss at STEPS/2. Its trajectory does not depend on the link, so at a slow RATE it
# runs LOOM_BENCH_DDP_STEPS (default 12) steps for its step time and bytes per step, and its
# loss curve comes from the same run on an unlimited link (10gbit): the row says so. RUNS: the
# methods, space-separated (default all): ddp h10 h50 h100 s1 s2 s1q s2q (s: Streaming DiLoCo,
# 4 fragments, H 100, overlap 1 or 2 steps; q: 4-bit outer gradients). Needs root; takes
# ~2-5 minutes a method at 2 islands on 2 cores; benchmark, not a test. LOOM_BENCH_DILOCO_ARGS:
# more train arguments for every DiLoCo run (e.g. the outer optimizer's). Logs: $LOOM_BENCH_LOGS
# (default /tmp/loom_diloco_bench_logs).
set -euo pipefail
build=${1:?usage: diloco_bench.sh BUILD_DIR ISLANDS RATE [STEPS [RUNS]]}
islands=${2:?islands}
rate=${3:?rate}
steps=${4:-200}
runs=${5:-ddp h10 h50 h100 s1 s2 s1q s2q}
logs=${LOOM_BENCH_LOGS:-/tmp/loom_diloco_bench_logs}
ddp_steps=${LOOM_BENCH_DDP_STEPS:-12}
mkdir -p "$logs"
root=$(cd "$(dirname "$0")/../.." && pwd)
cluster="$root/tools/cluster/cluster.sh"
train="$(cd "$build" && pwd)/bin/train"
prepare="$(cd "$build" && pwd)/bin/prepare_data"
work=$(mktemp -d /tmp/loom_diloco_bench_XXXXXX)
id=$(printf 'g%x' $(($$ % 65536)))
cleanup() {
  "$cluster" down "$id" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
"$cluster" check >/dev/null || { echo "diloco_bench: $("$cluster" check)" >&2; exit 1; }
"$prepare" --input /usr/share/games/fortunes --format fortunes --out-dir "$work/data" \
  >/dev/null 2>&1
LOOM_CLUSTER_OWNER=$$ "$cluster" up "$id" "$islands" "$rate"
hosts=$islands
# gpt2-tiny (7.3M parameters: a 29 MB gradient) at 4 × 64 tokens a rank: the gradient's all-reduce
# dominates a step at the scale model's rates.
base=(--config "$root/configs/gpt2-tiny.yaml" --set data.train="$work/data/train_*.bin"
  --set data.val="$work/data/val_*.bin" --set data.batch_size=4 --set train.val_every=50 --set train.val_steps=8
  --set train.sample_every=0 --set train.log_every=50 --set checkpoint.every=0
  --set checkpoint.at_end=false --set train.peak_flops=1e10 --set parallel.comm_timeout_s=600
  --set optim.warmup_steps=20)

link_bytes() {  # bytes sent by every host onto its link so far
  local k total=0 b
  for k in $(seq 0 $((hosts - 1))); do
    b=$(ip netns exec "$("$cluster" host "$id" "$k")" tc -s qdisc show dev "lc${id}p${k}" |
      awk '/Sent/ {print $2; exit}')
    total=$((total + ${b:-0}))
  done
  echo "$total"
}
set_rate() {
  local k
  for k in $(seq 0 $((hosts - 1))); do "$cluster" rate "$id" "$k" "$1"; done
}

# The training seconds (Σ step times) up to each step, and the validation losses, of a run's
# metrics.jsonl: prints "step seconds val" for every validation step.
curve() {
  python3 - "$1" <<'PY'
import json, sys
t = 0.0
for line in open(sys.argv[1]):
    r = json.loads(line)
    t += r.get("perf/ms_per_step", 0.0) / 1e3
    if "val/loss" in r:
        print(r["step"], round(t, 2), r["val/loss"])
PY
}

# ddp STEPS OUT ARGS…: synchronous data parallelism over every host.
ddp() {
  local n=$1 out=$2
  shift 2
  "$cluster" mpirun "$id" 2 -x OMP_NUM_THREADS=1 "$train" "${base[@]}" --set train.steps="$n" \
    --set parallel.dp=$((2 * islands)) --set train.out_dir="$out" "$@" >"$out.log" 2>&1
}

# diloco OUT ARGS…: the islands, one per host, 2 ranks each (dp 2 inside).
diloco() {
  local out=$1 k pids=()
  shift
  for k in $(seq 0 $((islands - 1))); do
    "$cluster" run "$id" "$k" mpirun --allow-run-as-root -np 2 --oversubscribe --bind-to none \
      -x OMP_NUM_THREADS=1 "$train" "${base[@]}" --set train.steps="$steps" --set parallel.dp=2 \
      --set parallel.diloco.islands="$islands" --set parallel.diloco.island="$k" \
      --set parallel.diloco.rendezvous="$out.rv" --set parallel.diloco.quorum_timeout_s=600 \
      --set train.out_dir="$out.i$k" "$@" ${LOOM_BENCH_DILOCO_ARGS:-} >"$out.i$k.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
}

echo "| method | islands × ranks | link | s training (steps) | s to target | MB to target | val @ $steps | MB sent (tc) | largest round/island |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
target=""
# row NAME CURVE_FILE TOTAL_S MB PEAK [ISLAND_LOG]: the bytes to the target are the share of
# the rounds (from the island's log) or, without one, of the steps up to the target's step.
row() {
  local name=$1 c=$2 total=$3 mb=$4 peak=$5 rounds=${6:-}
  local hit hit_step val frac
  hit=$(awk -v t="$target" '$3 <= t {print $2; exit}' "$c")
  hit_step=$(awk -v t="$target" '$3 <= t {print $1; exit}' "$c")
  val=$(tail -1 "$c" | awk '{printf "%.4f", $3}')
  local mb_hit="—" s_hit="not reached"
  if [ -n "$hit" ]; then
    s_hit=$hit
    if [ -n "$rounds" ]; then
      frac=$(sed -n 's/^diloco: round .*(step \([0-9]*\),.*/\1/p' "$rounds" |
        awk -v s="$hit_step" '{n++; if ($1 <= s) k++} END {print (n ? k / n : 0)}')
    else
      frac=$(echo "$hit_step / $steps" | bc -l)
    fi
    mb_hit=$(echo "$mb * $frac" | bc -l | xargs printf '%.1f')
  fi
  echo "| $name | $islands × 2 | $rate | $(printf '%.0f' "$total") ($steps) | $s_hit | $mb_hit | $val | $(printf '%.1f' "$mb") | $peak |"
}

for m in $runs; do
  out="$logs/$m-${islands}x2-$rate"
  if [ "$m" = ddp ] && [ -n "${LOOM_BENCH_TARGET:-}" ]; then  # a target given: no baseline run
    target=$LOOM_BENCH_TARGET
    continue
  fi
  rm -rf "$out" "$out".*
  case "$m" in
    ddp)
      set_rate 10gbit
      ddp "$steps" "$out.full"
      curve "$out.full/metrics.jsonl" >"$out.curve"
      target=$(awk -v s=$((steps / 2)) '$1 == s {print $3}' "$out.curve")
      set_rate "$rate"
      b0=$(link_bytes)
      ddp "$ddp_steps" "$out" --set optim.warmup_steps=1  # timing only
      b1=$(link_bytes)
      # Step time and bytes per step at RATE (after the first two steps), scaled to STEPS.
      per_step=$(python3 -c "
import json; r=[json.loads(l) for l in open('$out/metrics.jsonl')]
t=[x['perf/ms_per_step'] for x in r if 'perf/ms_per_step' in x][2:]
print(sum(t)/len(t)/1e3)")
      awk -v p="$per_step" '{print $1, $1 * p, $3}' "$out.curve" >"$out.curve.rate"
      total=$(echo "$per_step * $steps" | bc -l)
      mb=$(echo "($b1 - $b0) / $ddp_steps * $steps / 1000000" | bc -l)
      row "DDP (target: val $(printf '%.4f' "$target") at step $((steps / 2)); $ddp_steps steps timed)" \
        "$out.curve.rate" "$total" "$mb" "—"
      ;;
    h10 | h50 | h100 | s1 | s2 | s1q | s2q)
      [ -n "$target" ] || { echo "diloco_bench: run ddp first (it sets the target)" >&2; exit 1; }
      args=()
      case "$m" in
        h10) args=(--set parallel.diloco.inner_steps=10) name="DiLoCo H 10" ;;
        h50) args=(--set parallel.diloco.inner_steps=50) name="DiLoCo H 50" ;;
        h100) args=(--set parallel.diloco.inner_steps=100) name="DiLoCo H 100" ;;
        s1 | s2 | s1q | s2q)
          tau=${m:1:1}
          args=(--set parallel.diloco.inner_steps=100 --set parallel.diloco.fragments=4
            --set parallel.diloco.overlap_steps="$tau")
          name="Streaming H 100, P 4, τ $tau"
          if [ "${m:2:1}" = q ]; then
            args+=(--set parallel.diloco.quantize=int4)
            name="$name, int4"
          fi
          ;;
      esac
      set_rate "$rate"
      b0=$(link_bytes)
      diloco "$out" "${args[@]}"
      b1=$(link_bytes)
      curve "$out.i0/metrics.jsonl" >"$out.curve"
      total=$(tail -1 "$out.curve" | awk '{print $2}')
      peak=$(sed -n 's/.*MiB sent to other islands by this island (at most \([0-9.]*\) MiB in one round.*/\1/p' \
        "$out.i0.log" | head -1)
      row "$name" "$out.curve" "$total" "$(echo "($b1 - $b0) / 1000000" | bc -l)" \
        "$(printf '%.2f MiB' "${peak:-0}")" "$out.i0.log"
      ;;
    *) echo "diloco_bench: unknown method $m" >&2; exit 1 ;;
  esac
done
