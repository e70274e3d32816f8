#!/usr/bin/env bash
# tools/bench/multihost_bench.sh BUILD_DIR [SCALE [RUNS]] — training across hosts where the network
# costs (docs/performance.md, "Across hosts"): a cluster of network namespaces on this machine
# (tools/cluster), each host's link rate-limited so that compute : network matches a GPU
# cluster, and the layouts whose point is communication run on it. Prints one markdown row per
# run: layout, hosts × ranks, link rate, ms per step, tokens/s and exposed communication (the
# trainer's own `comm exposed`, Note [Exposed comm]; pipelines also their idle fraction), means over
# the steps after the first two. Needs root. Takes ~10 minutes; benchmark, not a test.
#
# The scale (SCALE, default 1): an H100 does ~700e12 bf16 FLOP/s on a 400 Gb/s (50e9 B/s)
# InfiniBand port, 14,000 FLOP per byte. One rank here (one thread) does the measured f32 GEMM
# rate R (the trainer logs it; ~125e9 on the reference machine), so a rank's share of a link is
# R / 14,000 ≈ 9 MB/s = 72 Mbit/s, and a host link carries ranks-per-host × that. SCALE 0.1 is
# a link 10× slower (across racks, or a cloud network). The compute side is scaled too: 8192
# tokens per rank and step (batch 128 × 64), so that a step's FLOP per gradient byte (1.5 ×
# tokens ≈ 12,000) is near the 14,000 of the GPU side — gpt2-tiny at the quick-start's 512
# tokens per rank would be 18× more network-bound than any real run. RUNS: all (default) or
# the groups to run, space-separated: dp (one host, DDP overlap on and off: the slow scale's
# rows), zero (dp 4, ZeRO-3, MiCS), model (a larger model, ~15 minutes), model-zero (its
# ZeRO-3 and MiCS on 2 × 2, ~15 minutes), sft (packed SFT, ZeRO-3 and ODC), skew (the same on
# skewed lengths), pp (1F1B, interleaved, zb-h1, zb-v), cp (cp 4 over 2 hosts: ring, Ulysses,
# hybrid), ab (the DDP overlap-on rows of dp and model without parallel.table_shortcuts). Logs
# are kept in $LOOM_BENCH_LOGS (default /tmp/loom_mh_bench_logs). LOOM_BENCH_STEPS overrides
# every run's step count (the means are over the steps after the first two).
set -euo pipefail
build=${1:?usage: multihost_bench.sh BUILD_DIR [SCALE [RUNS]]}
scale=${2:-1}
runs=${3:-all}
logs=${LOOM_BENCH_LOGS:-/tmp/loom_mh_bench_logs}
mkdir -p "$logs"
root=$(cd "$(dirname "$0")/../.." && pwd)
cluster="$root/tools/cluster/cluster.sh"
train="$(cd "$build" && pwd)/bin/train"
prepare="$(cd "$build" && pwd)/bin/prepare_data"
work=$(mktemp -d /tmp/loom_mh_bench_XXXXXX)
id=$(printf 'b%x' $$ | cut -c1-6)
cleanup() {
  "$cluster" down "$id" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

"$cluster" check >/dev/null || { echo "multihost_bench: $("$cluster" check)" >&2; exit 1; }
# Data: the fortunes text (tools/quickstart.sh's corpus) and the chat sample for packed SFT.
"$prepare" --input /usr/share/games/fortunes --format fortunes --out-dir "$work/fortunes" \
  >/dev/null 2>&1
"$prepare" --input "$root/data/samples/chat_sample.jsonl" --format chat --out-dir "$work/chat" \
  >/dev/null 2>&1
peak=$(OMP_NUM_THREADS=1 "$train" --config "$root/configs/gpt2-tiny.yaml" --set train.steps=1 \
  --set data.train="$work/fortunes/train_*.bin" --set "data.val=''" --set train.sample_every=0 \
  --set optim.warmup_steps=1 --set checkpoint.at_end=false --set train.out_dir="$work/peak" 2>&1 |
  sed -n 's/.*peak \([0-9.]*\) GFLOP\/s (measured.*/\1/p')
per_rank_mbit=$(echo "$peak * 1000000000 / 14000 * 8 / 1000000 * $scale" | bc -l)
echo "multihost_bench: measured f32 GEMM $peak GFLOP/s per rank → $(printf '%.1f' "$per_rank_mbit")" \
  "Mbit/s per rank (scale $scale)" >&2
echo "| layout | hosts × ranks | link | ms/step | tok/s | comm exposed |"
echo "| --- | --- | --- | --- | --- | --- |"

# run NAME HOSTS PPN STEPS ARGS...: one measured run.
run() {
  local name=$1 hosts=$2 ppn=$3 steps=$4
  shift 4
  case " $runs " in *" all "* | *" $group "*) ;; *) return ;; esac
  steps=${LOOM_BENCH_STEPS:-$steps}
  local rate
  rate=$(printf '%.0fkbit' "$(echo "$per_rank_mbit * $ppn * 1000" | bc -l)")
  "$cluster" down "$id" >/dev/null 2>&1 || true
  LOOM_CLUSTER_OWNER=$$ "$cluster" up "$id" "$hosts" "$rate"
  local log="$work/$name.log"
  (cd "$root" && "$cluster" mpirun "$id" "$ppn" -x OMP_NUM_THREADS=1 "$train" \
    --config "$root/configs/gpt2-tiny.yaml" --set "data.val=''" --set train.steps="$steps" \
    --set train.log_every=1 --set train.sample_every=0 --set train.val_every=0 \
    --set optim.warmup_steps=1 --set checkpoint.at_end=false --set train.peak_flops=1e12 \
    --set parallel.comm_timeout_s=600 --set train.out_dir="$work/run_$name" \
    --set parallel.dp=$((hosts * ppn)) "$@" >"$log" 2>&1) || {
    echo "| $name | $hosts × $ppn | $rate | failed (log: $log) | | |"
    cp "$log" /tmp/ 2>/dev/null || true
    return
  }
  cp "$log" "$logs/$(echo "$name" | tr -c 'A-Za-z0-9\n' '_')_$scale.log"
  awk -v name="$name" -v shape="$hosts × $ppn" -v rate="$rate" '
    /^step [0-9]+\// {
      split($2, s, "/"); if (s[1] + 0 <= 2) next
      for (i = 1; i <= NF; ++i) {
        if ($(i + 1) == "ms" && $(i - 1) == "|") ms += $i
        if ($(i + 1) == "tok/s") tok += $i
        if ($i == "exposed") { ex += $(i + 1); has_ex = 1 }
        if ($i == "idle") { idle += $(i + 1); has_idle = 1 }
      }
      n++
    }
    END {
      if (n == 0) { printf "| %s | %s | %s | no steps | | |\n", name, shape, rate; exit }
      comm = has_ex ? sprintf("%.0f ms (%.0f %%)", ex / n, 100 * ex / ms) : "—"
      if (has_idle) comm = comm sprintf("; pipeline idle %.0f %%", idle / n)
      printf "| %s | %s | %s | %.0f | %.0f | %s |\n", name, shape, rate, ms / n, tok / n, comm
    }' "$log"
}

F="data.train=$work/fortunes/train_*.bin"
B=data.batch_size=128
group=dp
run "one host (dp 1)" 1 1 6 --set "$F" --set $B
run "DDP, overlap on" 2 1 6 --set "$F" --set $B
run "DDP, overlap off" 2 1 6 --set "$F" --set $B --set parallel.overlap=false
group=zero
run "DDP dp 4" 4 1 6 --set "$F" --set $B
run "ZeRO-3" 2 2 6 --set "$F" --set $B --set parallel.zero_stage=3
run "MiCS, partition = host" 2 2 6 --set "$F" --set $B --set parallel.zero_stage=3 \
  --set parallel.mics_partition_size=2
# A model whose blocks hold most of the compute and the gradient bytes (12 × 512: 37.7 M
# parameters in the blocks, 25.8 M in the tied table): 5 steps, means over steps 3-5.
group=model
M=(--set model.n_layer=12 --set model.n_embd=512 --set model.n_head=8)
run "gpt2 12×512, one host" 1 1 5 --set "$F" --set $B "${M[@]}"
run "gpt2 12×512, DDP, overlap on" 2 1 5 --set "$F" --set $B "${M[@]}"
run "gpt2 12×512, DDP, overlap off" 2 1 5 --set "$F" --set $B "${M[@]}" \
  --set parallel.overlap=false
# 4 ranks of 12×512 at batch 128 need ~26 GB of activations: 2 micro-batches of 64 instead.
group=model-zero
H=(--set data.batch_size=64 --set optim.grad_accum=2)
run "gpt2 12×512, ZeRO-3 (2 micro-batches)" 2 2 4 --set "$F" "${H[@]}" "${M[@]}" \
  --set parallel.zero_stage=3
run "gpt2 12×512, MiCS, partition = host (2 micro-batches)" 2 2 4 --set "$F" "${H[@]}" \
  "${M[@]}" --set parallel.zero_stage=3 --set parallel.mics_partition_size=2
# What the tied-table shortcuts do (Note [Early contributions and sparse rows]): the overlap-on
# rows again without them.
group=ab
run "DDP, overlap on, no table shortcuts" 2 1 6 --set "$F" --set $B \
  --set parallel.table_shortcuts=false
run "gpt2 12×512, DDP, overlap on, no table shortcuts" 2 1 5 --set "$F" --set $B "${M[@]}" \
  --set parallel.table_shortcuts=false
group=sft
C="data.train=$work/chat/train_*.bin"
run "SFT packed, ZeRO-3" 2 2 6 --set "$C" --set data.packing=true --set data.seq_len=256 \
  --set data.batch_size=8 --set parallel.zero_stage=3
run "SFT packed, ODC" 2 2 6 --set "$C" --set data.packing=true --set data.seq_len=256 \
  --set data.batch_size=8 --set parallel.zero_stage=3 --set parallel.odc=true
# Skewed lengths (ODC's case): one document in 8 is ~210 tokens, the rest ~15, split over the
# ranks as they come (data.balance none), so the ranks' micro-batch counts differ; ZeRO-3 pads
# every rank to the largest count (its per-unit gathers need every rank), ODC does not.
group=skew
if case " $runs " in *" all "* | *" skew "*) true ;; *) false ;; esac; then
  python3 - "$work/skew.jsonl" <<'PY'
import random, sys
random.seed(7)
words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()
with open(sys.argv[1], "w") as f:
    for i in range(2000):
        n = 200 if i % 8 == 0 else 4
        text = " ".join(random.choice(words) for _ in range(n))
        f.write('{"prompt": "Continue the list.", "response": "%s"}\n' % text)
PY
  "$prepare" --input "$work/skew.jsonl" --format chat --out-dir "$work/skew" >/dev/null 2>&1
fi
S=(--set "data.train=$work/skew/train_*.bin" --set data.packing=true --set data.seq_len=256
  --set data.batch_size=8 --set parallel.zero_stage=3)
run "SFT skewed, ZeRO-3" 2 2 6 "${S[@]}"
run "SFT skewed, ODC" 2 2 6 "${S[@]}" --set parallel.odc=true
group=pp
run "pp 2 1F1B" 2 1 6 --set "$F" --set data.batch_size=16 --set parallel.dp=1 \
  --set parallel.pp=2 --set optim.grad_accum=8
run "pp 2 interleaved (vpp 2)" 2 1 6 --set "$F" --set data.batch_size=16 --set parallel.dp=1 \
  --set parallel.pp=2 --set parallel.vpp=2 --set parallel.schedule=interleaved \
  --set optim.grad_accum=8
run "pp 2 zb-h1" 2 1 6 --set "$F" --set data.batch_size=16 --set parallel.dp=1 \
  --set parallel.pp=2 --set parallel.schedule=zb-h1 --set optim.grad_accum=8
run "pp 2 zb-v" 2 1 6 --set "$F" --set data.batch_size=16 --set parallel.dp=1 \
  --set parallel.pp=2 --set parallel.schedule=zb-v --set optim.grad_accum=8
# Context parallelism over 2 hosts × 2 ranks on 256-token sequences: ring attention passes k
# and v across the slow link at every step of its ring; Ulysses' all-to-alls cross it with
# half of q, k, v and the output; hybrid keeps its all-to-all inside a host (cp_ulysses 2 =
# ranks per host: Note [Hybrid context parallelism]) and only its ring crosses.
group=cp
CP=(--set "$F" --set data.batch_size=8 --set data.seq_len=256 --set parallel.dp=1
  --set parallel.cp=4)
run "cp 4 ring" 2 2 6 "${CP[@]}" --set parallel.cp_attention=ring
run "cp 4 Ulysses" 2 2 6 "${CP[@]}" --set parallel.cp_attention=ulysses
run "cp 4 hybrid (Ulysses 2 in a host × ring 2)" 2 2 6 "${CP[@]}" \
  --set parallel.cp_attention=hybrid --set parallel.cp_ulysses=2
