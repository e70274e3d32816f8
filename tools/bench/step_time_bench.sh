#!/usr/bin/env bash
# tools/bench/step_time_bench.sh BUILD_DIR [RATE] — the step-time model against measurement
# (issue 32; Note [Step-time model] in train/planner/step_time.h; docs/planning.md "Step time"):
# for each layout, `train --plan --time` (predicted) and the median step time of a short run
# (measured, the steps after the first two), and their error, as one markdown row each. One rank
# per core (OMP_NUM_THREADS=1). Calibrates first, into a fresh file: the links within a host
# (`mpirun -np 2 train --calibrate-links`) and, where a cluster can be made (root, network
# namespaces: tools/cluster), between two hosts whose links are limited to RATE (default
# 100mbit); the compute is measured by the first plan that needs each shape. Benchmark, not a
# test: about 10 minutes on 2 cores, 4 more for the search's part and 3 for packed documents'
# (STEP_TIME_BENCH_PARTS: "table search packed", the default, or any of them; "four" adds the
# layouts that need 4 ranks — SDP, MiCS — oversubscribing the 2 cores with their own 4-rank
# link calibration, 4 minutes; STEP_TIME_BENCH_ROWS: a regular expression, only the rows whose
# layout matches it, e.g. "hosts"). Packed rows
# (configs/sft-tiny.yaml on the shipped chat sample, Note [Packed step time] in
# train/planner/packed_steps.h) compare the plan's mean step over the run's steps with the
# measured mean of the steps after the first: their steps differ by their documents.
set -euo pipefail
build=${1:?usage: step_time_bench.sh BUILD_DIR [RATE]}
rate=${2:-100mbit}
root=$(cd "$(dirname "$0")/../.." && pwd)
bin="$(cd "$build" && pwd)/bin"
cluster="$root/tools/cluster/cluster.sh"
work=$(mktemp -d /tmp/loom_step_time_XXXXXX)
id=$(printf 't%x' $$ | cut -c1-6)
cleanup() {
  "$cluster" down "$id" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
export OMP_NUM_THREADS=1 LOOM_CALIBRATION="$work/calibration.json"
steps=${LOOM_BENCH_STEPS:-10}
"$bin/prepare_data" --input /usr/share/games/fortunes --format fortunes --out-dir "$work/data" \
  >/dev/null 2>&1
common=(--config "$root/configs/gpt2-tiny.yaml" --set "data.train=$work/data/train_*.bin"
  --set "data.val=''" --set train.steps="$steps" --set train.log_every=1
  --set train.sample_every=0 --set train.val_every=0 --set optim.warmup_steps=1
  --set checkpoint.at_end=false --set train.peak_flops=1e12 --set parallel.comm_timeout_s=600)
mpi=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -x LOOM_CALIBRATION)

"${mpi[@]}" -np 2 "$bin/train" "${common[@]}" --set parallel.dp=2 --calibrate-links >&2
hosts=0
if "$cluster" check >/dev/null 2>&1; then
  LOOM_CLUSTER_OWNER=$$ "$cluster" up "$id" 2 "$rate" >&2
  "$cluster" mpirun "$id" 1 -x OMP_NUM_THREADS -x LOOM_CALIBRATION "$bin/train" "${common[@]}" \
    --set parallel.dp=2 --calibrate-links >&2
  hosts=2
else
  echo "step_time_bench: no cluster here ($("$cluster" check)): one host only" >&2
fi

parts=" ${STEP_TIME_BENCH_PARTS:-table search packed} "
base=("${common[@]}") stat=median
errors=()
# row NAME NP HOSTS ARGS...: predicted and measured step time of one layout.
row() {
  local name=$1 np=$2 on_hosts=$3
  shift 3
  [[ $name =~ ${STEP_TIME_BENCH_ROWS:-.} ]] || return 0
  local per_host=0 log="$work/$(echo "$name" | tr -c 'A-Za-z0-9\n' '_').log"
  ((on_hosts > 1)) && per_host=$((np / on_hosts))
  local predicted
  predicted=$("$bin/train" "${base[@]}" "$@" --set train.out_dir="$work/plan" --plan --time \
    --ranks-per-host "$per_host" | sed -n 's/^  step *\([0-9.]*\) ms.*/\1/p')
  if ((np == 1)); then
    "$bin/train" "${base[@]}" "$@" --set train.out_dir="$work/run" >"$log" 2>&1
  elif ((on_hosts > 1)); then
    "$cluster" mpirun "$id" "$per_host" -x OMP_NUM_THREADS "$bin/train" "${base[@]}" "$@" \
      --set train.out_dir="$work/run" >"$log" 2>&1
  else
    "${mpi[@]}" -np "$np" "$bin/train" "${base[@]}" "$@" --set train.out_dir="$work/run" \
      >"$log" 2>&1
  fi
  rm -rf "$work/run"
  local measured
  if [[ $stat == mean ]]; then
    measured=$(grep '^step ' "$log" | tail -n +2 | sed -n 's/.*| \([0-9.]*\) ms |.*/\1/p' |
      awk '{s += $1} END {print s / NR}')
  else
    measured=$(grep '^step ' "$log" | tail -n +3 | sed -n 's/.*| \([0-9.]*\) ms |.*/\1/p' |
      sort -n |
      awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')
  fi
  local err
  err=$(echo "($predicted - $measured) / $measured * 100" | bc -l)
  errors+=("$err")
  printf '| %s | %s | %.1f | %.1f | %+.1f %% |\n' "$name" "$np" "$predicted" "$measured" "$err"
}
summary() {
  printf '%s\n' "${errors[@]}" | awk '{print ($1 < 0 ? -$1 : $1)}' | sort -n |
    awk '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
         printf "\n%d layouts: median |error| %.1f %%, worst %.1f %%\n", NR, m, v[NR]}'
}
if [[ $parts == *" table "* ]]; then
echo "| layout | ranks | predicted ms | measured ms | error |"
echo "| --- | --- | ---: | ---: | ---: |"
row "one process" 1 1
row "one process, grad_accum 2" 1 1 --set optim.grad_accum=2
row "one process, checkpointing" 1 1 --set model.recompute=full
row "dp 2 DDP" 2 1 --set parallel.dp=2
row "dp 2 DDP, no overlap" 2 1 --set parallel.dp=2 --set parallel.overlap=false
row "dp 2 ZeRO-1" 2 1 --set parallel.dp=2 --set parallel.zero_stage=1
row "dp 2 ZeRO-2" 2 1 --set parallel.dp=2 --set parallel.zero_stage=2
row "dp 2 ZeRO-3" 2 1 --set parallel.dp=2 --set parallel.zero_stage=3
row "dp 2 ODC" 2 1 --set parallel.dp=2 --set parallel.zero_stage=3 --set parallel.odc=true
row "tp 2" 2 1 --set parallel.tp=2
row "tp 2 + sp" 2 1 --set parallel.tp=2 --set parallel.sequence_parallel=true
row "tp 2 + sp, checkpointing" 2 1 --set parallel.tp=2 --set parallel.sequence_parallel=true \
  --set model.recompute=full
row "cp 2" 2 1 --set parallel.cp=2
row "cp 2, checkpointing" 2 1 --set parallel.cp=2 --set model.recompute=full
row "pp 2 1F1B, m 4" 2 1 --set parallel.pp=2 --set optim.grad_accum=4
row "pp 2 GPipe, m 4" 2 1 --set parallel.pp=2 --set optim.grad_accum=4 --set parallel.schedule=gpipe
row "pp 2 interleaved v 2, m 4" 2 1 --set parallel.pp=2 --set parallel.vpp=2 \
  --set optim.grad_accum=4 --set parallel.schedule=interleaved
if ((hosts == 2)); then
  row "2 hosts ($rate) dp 2 DDP" 2 2 --set parallel.dp=2
  row "2 hosts ($rate) dp 2 ZeRO-3" 2 2 --set parallel.dp=2 --set parallel.zero_stage=3
  row "2 hosts ($rate) pp 2 1F1B, m 4" 2 2 --set parallel.pp=2 --set optim.grad_accum=4
fi
summary
fi
if [[ $parts == *" packed "* ]]; then
  "$bin/prepare_data" --format chat --input "$root/data/samples/chat_sample.jsonl" \
    --out-dir "$work/chat" >/dev/null 2>&1
  base=(--config "$root/configs/sft-tiny.yaml" --set "data.train=$work/chat/train_*.bin"
    --set "data.val=''" --set "model.init_from=''" --set train.steps=12 --set train.log_every=1
    --set train.sample_every=0 --set train.val_every=0 --set checkpoint.every=0
    --set checkpoint.at_end=false --set parallel.comm_timeout_s=600)
  stat=mean errors=()
  echo
  echo "| packed documents (sft-tiny, chat sample) | ranks | predicted ms | measured ms | error |"
  echo "| --- | --- | ---: | ---: | ---: |"
  row "one process" 1 1 --set parallel.dp=1 --set parallel.zero_stage=0 --set parallel.odc=false
  row "dp 2 DDP, balance flops" 2 1 --set parallel.zero_stage=0 --set parallel.odc=false
  row "dp 2 ZeRO-3, balance flops" 2 1 --set parallel.odc=false
  row "dp 2 ODC, balance flops" 2 1
  row "dp 2 ZeRO-3, balance none" 2 1 --set parallel.odc=false --set data.balance=none
  row "dp 2 ODC, balance none" 2 1 --set data.balance=none
  summary
  base=("${common[@]}") stat=median
fi
if [[ $parts == *" four "* ]]; then
  # 4 ranks (2 per core): SDP under forward masking and MiCS against DDP and ZeRO-3 on the same
  # ranks; a calibration of its own, the links and the compute slowdown measured with 4 ranks
  # at once.
  two_ranks=$LOOM_CALIBRATION
  export LOOM_CALIBRATION="$work/calibration_4.json"
  "${mpi[@]}" -np 4 "$bin/train" "${common[@]}" --set parallel.dp=4 --calibrate-links >&2
  errors=()
  echo
  echo "| 4 ranks on 2 cores (gpt2-tiny) | ranks | predicted ms | measured ms | error |"
  echo "| --- | --- | ---: | ---: | ---: |"
  row "dp 4 DDP" 4 1 --set parallel.dp=4
  row "SDP neurons, coverage 0.5" 4 1 --set parallel.dp=4 --set parallel.sdp.mode=forward \
    --set parallel.sdp.coverage=0.5
  row "SDP blocks, coverage 0.5" 4 1 --set parallel.dp=4 --set parallel.sdp.mode=forward \
    --set parallel.sdp.level=block --set parallel.sdp.coverage=0.5
  row "dp 4 ZeRO-3" 4 1 --set parallel.dp=4 --set parallel.zero_stage=3
  row "MiCS: ZeRO-3, partitions of 2" 4 1 --set parallel.dp=4 --set parallel.zero_stage=3 \
    --set parallel.mics_partition_size=2
  row "MiCS: ZeRO-2, partitions of 2" 4 1 --set parallel.dp=4 --set parallel.zero_stage=2 \
    --set parallel.mics_partition_size=2
  summary
  export LOOM_CALIBRATION=$two_ranks
fi
[[ $parts == *" search "* ]] || exit 0

# The search's ranking against measurement: `--plan --search --gpus 2 --device cpu --time` over
# the base config with a global batch of 16 sequences (dp 2, or accumulation 2), then the first
# SEARCH_TOP (default 8) candidates measured twice, in rank order and then in reverse (a run's
# place in the sequence moved its time by ~5 %: the first measured ran slower), each candidate's
# tokens/s the mean of its two runs; the search's first choice must be the fastest measured or
# within 5 % of it.
echo
echo "| search rank | layout | predicted tok/s | measured tok/s (the two runs) |"
echo "| ---: | --- | ---: | ---: |"
"$bin/train" "${common[@]}" --set optim.grad_accum=2 --set train.out_dir="$work/plan" --plan \
  --search --gpus 2 --device cpu --time >"$work/search_all"
grep '^  fits' "$work/search_all" | sed -n "1,${SEARCH_TOP:-8}p" >"$work/search"
mapfile -t candidates <"$work/search"
# measure INDEX: one run of candidate INDEX (0-based), its tokens/s on stdout.
measure() {
  local line=${candidates[$1]} log="$work/search_$1_$RANDOM.log"
  read -ra sets <<<"$(echo "$line" | sed 's/.*ms   //')"
  "${mpi[@]}" -np 2 "$bin/train" "${common[@]}" --set optim.grad_accum=2 "${sets[@]}" \
    --set train.out_dir="$work/run" >"$log" 2>&1 </dev/null
  rm -rf "$work/run"
  local ms
  ms=$(grep '^step ' "$log" | tail -n +3 | sed -n 's/.*| \([0-9.]*\) ms |.*/\1/p' | sort -n |
    awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')
  echo "16 * 64 / ($ms / 1000)" | bc -l
}
n=${#candidates[@]}
declare -a run1 run2
for ((i = 0; i < n; ++i)); do run1[i]=$(measure "$i"); done
for ((i = n - 1; i >= 0; --i)); do run2[i]=$(measure "$i"); done
best=0 first=0
for ((i = 0; i < n; ++i)); do
  line=${candidates[$i]}
  layout=$(echo "$line" | cut -c8-53 | sed 's/ *$//')
  predicted=$(echo "$line" | sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p')
  tok=$(echo "(${run1[i]} + ${run2[i]}) / 2" | bc -l)
  printf '| %d | %s | %s | %.0f (%.0f, %.0f) |\n' $((i + 1)) "$layout" "$predicted" "$tok" \
    "${run1[i]}" "${run2[i]}"
  ((i == 0)) && first=$tok
  if (($(echo "$tok > $best" | bc -l))); then best=$tok; fi
done
printf '\nthe search'"'"'s first choice measures %.0f tok/s, the fastest measured %.0f: %.1f %% slower\n' \
  "$first" "$best" "$(echo "($best - $first) / $best * 100" | bc -l)"
