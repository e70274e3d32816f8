#!/usr/bin/env bash
# tests/multihost/diloco.sh MODE TRAIN PREPARE_DATA CONVERT — DiLoCo's islands as separate
# launches on separate hosts of a test-bed cluster (tools/cluster; Note [DiLoCo] in
# parallel/diloco/diloco_engine.h), each island's links through its host's own address, one
# rendezvous directory shared by all. MODE:
#   sync      2 islands of 1 rank, H = 1, inner SGD without momentum, outer plain average:
#             the final weights equal the single-process run on both islands' batches (the
#             synchronous data-parallel step) to f32 rounding;
#   family    the same with a Llama in the Hugging Face families' options (Note [Hugging Face
#             families] in train/hf_format.h: heads of 24, every bias, Llama 3 RoPE scaling — a
#             Llama 3.x checkpoint's shape), compared through its Hugging Face export;
#   layouts   island 0 dp 2 (ZeRO-1, 2 × 4 sequences) and island 1 tp 2 (8 sequences), 2 ranks
#             each, then island 0 ZeRO-3 and island 1 pp 2: after the last sync both islands of
#             a job hold the same weights bit for bit, and the first job's equal (to f32
#             rounding) the same job with both islands dp 2;
#   resume    2 islands, streaming (2 fragments, overlap 1) with int4 outer gradients, stopped at
#             a step where a fragment's exchange is in flight, resumed from the checkpoints
#             (a new rendezvous directory): the final weights equal the uninterrupted run's bit
#             for bit;
#   failure   3 islands of 1 rank; island 2 is killed (kill -9) mid-run, the other two go on
#             (their rounds commit without it), island 2 is started again with no checkpoint
#             and joins from a live peer; every island ends with the same weights.
# Exit 77 (skipped, saying why) where no cluster can be made. ctest: multihost.diloco_<MODE>.
set -euo pipefail
mode=$1 train=$2 prepare=$3 convert=$4
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cluster="$root/tools/cluster/cluster.sh"
name="diloco ($mode)"
fail() {
  echo "$name: $*" >&2
  for f in "$work"/*.log; do
    [ -f "$f" ] && { echo "--- $f" >&2; tail -25 "$f" | sed 's/^/  | /' >&2; }
  done
  exit 1
}
if ! why=$("$cluster" check 2>&1); then
  echo "multihost: skipped: $why"
  exit 77
fi
if [ "$mode" = sync ] || [ "$mode" = family ] || [ "$mode" = layouts ]; then
  python3 -c "import numpy" 2>/dev/null || { echo "multihost: skipped: no numpy"; exit 77; }
fi
"$cluster" sweep
id=$(printf 'd%x' $(($$ % 65536)))
work=$(mktemp -d "${TMPDIR:-/tmp}/loom_diloco_XXXXXX")
cleanup() {
  "$cluster" down "$id" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
hosts=2
[ "$mode" = failure ] && hosts=3
LOOM_CLUSTER_OWNER=$$ "$cluster" up "$id" "$hosts"
"$prepare" --input "$root/data/samples/chat_sample.jsonl" --format chat --out-dir "$work/data" \
  >/dev/null 2>&1 || fail "prepare_data failed"

# A 2-layer GPT-2 on the chat sample's tokens (as windows), no checkpoints unless asked.
base=(--config "$root/configs/gpt2-tiny.yaml" --set model.n_layer=2 --set model.n_embd=64
  --set model.n_head=2 --set data.train="$work/data/train_*.bin" --set "data.val=''"
  --set data.batch_size=4 --set data.seq_len=32 --set train.peak_flops=1e10
  --set train.log_every=1 --set train.val_every=0 --set train.sample_every=0
  --set optim.warmup_steps=1 --set checkpoint.every=0 --set parallel.comm_timeout_s=20)

# island K RANKS LOG OUT RENDEZVOUS ARGS…: island K on host K, in the background.
island() {
  local k=$1 ranks=$2 log=$3 out=$4 rv=$5
  shift 5
  local cmd=("$train" "${base[@]}" --set parallel.diloco.islands="$islands"
    --set parallel.diloco.quorum_timeout_s=3 --set parallel.diloco.join_timeout_s=60
    --set parallel.diloco.island="$k" --set parallel.diloco.rendezvous="$rv"
    --set train.out_dir="$out" "$@")
  if [ "$ranks" -gt 1 ]; then
    local flags=(-np "$ranks" --oversubscribe --bind-to none -x OMP_NUM_THREADS=1)
    [ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
    "$cluster" run "$id" "$k" mpirun "${flags[@]}" "${cmd[@]}" >"$log" 2>&1 &
  else
    "$cluster" run "$id" "$k" env OMP_NUM_THREADS=1 "${cmd[@]}" >"$log" 2>&1 &
  fi
}

# The newest checkpoint of run OUT as one llm.c weights file (GPT-2), or with $hf set as a
# Hugging Face directory's model.safetensors (any architecture).
export_weights() {
  if [ -n "${hf:-}" ]; then
    "$convert" --from "loom:$1/checkpoints" --to "hf:$2.hf" >"$2.convert.log" 2>&1 &&
      cp "$2.hf/model.safetensors" "$2" || fail "convert failed for $1"
    return
  fi
  "$convert" --from "loom:$1/checkpoints" --to "llmc:$2" >/dev/null 2>&1 ||
    fail "convert failed for $1"
}

# Max |a − b| / (1 + |b|) over two weight files of export_weights, within TOL.
expect_close() {
  python3 - "$1" "$2" "$3" "${hf:-}" <<'PY' || fail "weights of $1 and $2 differ beyond $3"
import json, struct, sys, numpy as np
def weights(path):
    if not sys.argv[4]:
        return np.fromfile(path, dtype=np.float32, offset=1024)
    with open(path, "rb") as f:  # safetensors: every tensor, in name order, as f32
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    parts = [np.frombuffer(data[e["data_offsets"][0]:e["data_offsets"][1]], dtype=np.float32)
             for k, e in sorted(header.items()) if k != "__metadata__"]
    return np.concatenate(parts)
a, b = weights(sys.argv[1]), weights(sys.argv[2])
assert a.size == b.size and a.size > 0, (a.size, b.size)
err = float(np.max(np.abs(a - b) / (1 + np.abs(b))))
print(f"max relative difference {err:.3g} over {a.size} weights")
sys.exit(0 if err <= float(sys.argv[3]) else 1)
PY
}

wait_all() {
  local pid
  for pid in "$@"; do wait "$pid" || fail "an island failed"; done
}

if [ "$mode" = family ]; then
  hf=1
  base+=(--set model.arch=llama --set model.tie_embeddings=false --set model.n_kv_head=1
    --set model.head_dim=24 --set model.attention_bias=true --set model.mlp_bias=true
    --set model.rope_scaling.type=llama3
    --set model.rope_scaling.factor=8 --set model.rope_scaling.original_max_seq_len=16)
fi

case "$mode" in
  sync | family)
    islands=2
    sgd=(--set optim.name=sgd --set optim.momentum=0 --set optim.weight_decay=0
      --set optim.grad_clip=0 --set train.steps=6 --set checkpoint.at_end=true)
    island 0 1 "$work/i0.log" "$work/i0" "$work/rv" "${sgd[@]}" --set parallel.diloco.inner_steps=1 \
      --set parallel.diloco.outer=average
    p0=$!
    island 1 1 "$work/i1.log" "$work/i1" "$work/rv" "${sgd[@]}" --set parallel.diloco.inner_steps=1 \
      --set parallel.diloco.outer=average
    p1=$!
    wait_all "$p0" "$p1"
    # The synchronous step: one process on both islands' batches (2 × 4 sequences).
    (cd "$work" && OMP_NUM_THREADS=1 "$train" "${base[@]}" "${sgd[@]}" --set data.batch_size=8 \
      --set train.out_dir="$work/single" >"$work/single.log" 2>&1) || fail "single run failed"
    for r in i0 i1 single; do export_weights "$work/$r" "$work/$r.bin"; done
    cmp -s "$work/i0.bin" "$work/i1.bin" || fail "the islands' final weights differ"
    expect_close "$work/i0.bin" "$work/single.bin" 1e-5
    ;;
  layouts)
    islands=2
    run=(--set train.steps=6 --set parallel.diloco.inner_steps=3)
    island 0 2 "$work/a0.log" "$work/a0" "$work/rva" "${run[@]}" --set parallel.dp=2 \
      --set parallel.zero_stage=1
    p0=$!
    # One replica of 8 sequences reads the rows of island 0's two replicas of 4.
    island 1 2 "$work/a1.log" "$work/a1" "$work/rva" "${run[@]}" --set parallel.tp=2 \
      --set data.batch_size=8
    p1=$!
    wait_all "$p0" "$p1"
    island 0 2 "$work/b0.log" "$work/b0" "$work/rvb" "${run[@]}" --set parallel.dp=2
    p0=$!
    island 1 2 "$work/b1.log" "$work/b1" "$work/rvb" "${run[@]}" --set parallel.dp=2
    p1=$!
    wait_all "$p0" "$p1"
    # Island 0 ZeRO-3 (shards), island 1 two pipeline stages (the tied table's copy on the last),
    # 2 micro-batches each: their data differ from job b's, so only their agreement is checked.
    island 0 2 "$work/c0.log" "$work/c0" "$work/rvc" "${run[@]}" --set parallel.dp=2 \
      --set parallel.zero_stage=3 --set optim.grad_accum=2
    p0=$!
    island 1 2 "$work/c1.log" "$work/c1" "$work/rvc" "${run[@]}" --set parallel.pp=2 \
      --set optim.grad_accum=2
    p1=$!
    wait_all "$p0" "$p1"
    for r in a0 a1 b0 c0 c1; do export_weights "$work/$r" "$work/$r.bin"; done
    cmp -s "$work/a0.bin" "$work/a1.bin" || fail "islands dp 2 and tp 2 end with other weights"
    cmp -s "$work/c0.bin" "$work/c1.bin" || fail "islands ZeRO-3 and pp 2 end with other weights"
    # TP's split GEMMs add the same terms in other orders (f32 rounding), which AdamW spreads
    # (2e-5 on parameters in tests/train/train_tp_mpi_test.cpp) and the outer Nesterov step
    # (lr 0.7, momentum 0.9) scales further: 1e-4 (measured 3.3e-5).
    expect_close "$work/a1.bin" "$work/b0.bin" 1e-4
    ;;
  resume)
    islands=2
    run=(--set train.steps=12 --set parallel.diloco.inner_steps=4 --set parallel.diloco.fragments=2
      --set parallel.diloco.overlap_steps=1 --set parallel.diloco.quantize=int4)
    island 0 1 "$work/f0.log" "$work/f0" "$work/rvf" "${run[@]}"
    p0=$!
    island 1 1 "$work/f1.log" "$work/f1" "$work/rvf" "${run[@]}"
    p1=$!
    wait_all "$p0" "$p1"
    # Fragment 1 starts its exchange after step 6 and writes back after step 7.
    island 0 1 "$work/s0.log" "$work/s0" "$work/rvs" "${run[@]}" --stop-at 6
    p0=$!
    island 1 1 "$work/s1.log" "$work/s1" "$work/rvs" "${run[@]}" --stop-at 6
    p1=$!
    wait_all "$p0" "$p1"
    island 0 1 "$work/r0.log" "$work/s0" "$work/rvr" "${run[@]}" --resume latest
    p0=$!
    island 1 1 "$work/r1.log" "$work/s1" "$work/rvr" "${run[@]}" --resume latest
    p1=$!
    wait_all "$p0" "$p1"
    grep -q "resumed from .* at step 6" "$work/r0.log" || fail "no resume at step 6"
    for r in f0 f1 s0 s1; do export_weights "$work/$r" "$work/$r.bin"; done
    # (The islands differ from each other: steps after a fragment's last write-back are local.)
    cmp -s "$work/f0.bin" "$work/s0.bin" || fail "island 0's resumed weights differ"
    cmp -s "$work/f1.bin" "$work/s1.bin" || fail "island 1's resumed weights differ"
    cmp -s "$work/f0.bin" "$work/f1.bin" && fail "the islands' local steps left no trace"
    ;;
  failure)
    islands=3
    # Long enough (~10 s) that the restarted island finds the others still training.
    run=(--set train.steps=120 --set parallel.diloco.inner_steps=4 --set train.val_every=20
      --set data.val="$work/data/train_*.bin" --set train.val_steps=2)
    for k in 0 1 2; do
      island "$k" 1 "$work/k$k.log" "$work/k$k" "$work/rv" "${run[@]}"
      eval "p$k=\$!"
    done
    for _ in $(seq 1 600); do  # until island 2 has taken part in a committed round
      grep -q "round .*islands 0,1,2 (3 contributing), committed" "$work/k2.log" 2>/dev/null && break
      sleep 0.1
    done
    ip netns pids "$("$cluster" host "$id" 2)" | xargs -r kill -9
    wait "$p2" 2>/dev/null || true
    killed=$(grep -c "committed" "$work/k0.log" || true)
    for _ in $(seq 1 600); do  # the other two go on without it
      grep -q "islands 0,1 (2 contributing), committed" "$work/k0.log" 2>/dev/null && break
      sleep 0.1
    done
    grep -q "islands 0,1 (2 contributing), committed" "$work/k0.log" ||
      fail "islands 0 and 1 did not commit a round without island 2"
    island 2 1 "$work/k2b.log" "$work/k2b" "$work/rv" "${run[@]}"
    p2=$!
    wait_all "$p0" "$p1" "$p2"
    grep -q "joined the running islands" "$work/k2b.log" || fail "island 2 did not rejoin"
    ! grep -q "resumed from" "$work"/*.log || fail "a run restarted from a checkpoint"
    v0=$(grep "^step 120 | val loss" "$work/k0.log") v1=$(grep "^step 120 | val loss" "$work/k1.log")
    v2=$(grep "^step 120 | val loss" "$work/k2b.log")
    [ -n "$v0" ] && [ "$v0" = "$v1" ] && [ "$v1" = "$v2" ] ||
      fail "the islands end with other validation losses: '$v0' '$v1' '$v2'"
    echo "island 0: $(grep -c committed "$work/k0.log") rounds committed ($killed before the kill);" \
      "$(grep -c aborted "$work/k0.log" || true) aborted; $v0"
    grep -E "val loss|joined" "$work/k0.log" "$work/k2b.log" | sed 's/^/  /'
    ;;
  *) fail "unknown mode '$mode'" ;;
esac
echo "$name: passed"
