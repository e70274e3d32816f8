# tests/multihost/two_hosts.sh — sourced by failures.sh and elastic.sh: a two-host cluster
# (tools/cluster) made for the test and removed on exit (exit 77, skipped saying why, where none
# can be made), the chat sample prepared as token shards, a small training run's arguments, and
# a wait for its step-4 checkpoint. Expects `name` (for messages), `prepare` (prepare_data).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cluster="$root/tools/cluster/cluster.sh"
fail() {
  echo "$name: $*" >&2
  [ -f "${log:-}" ] && sed 's/^/  | /' "$log" >&2
  exit 1
}
if ! why=$("$cluster" check 2>&1); then
  echo "multihost: skipped: $why"
  exit 77
fi
"$cluster" sweep
id=$(printf '%x' $$)
work=$(mktemp -d "${TMPDIR:-/tmp}/loom_multihost_XXXXXX")
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
log="$work/run.log"
# A 2-layer GPT-2 on the chat sample's tokens, a checkpoint every 2 steps; add train.steps.
train_args=(--config "$root/configs/gpt2-tiny.yaml" --set model.n_layer=2 --set model.n_embd=64
  --set model.n_head=2 --set data.train="$work/data/train_*.bin" --set "data.val=''"
  --set data.batch_size=4 --set train.peak_flops=1e10 --set train.log_every=1
  --set train.val_every=0 --set train.sample_every=0 --set optim.warmup_steps=1
  --set checkpoint.every=2 --set checkpoint.keep=0 --set train.out_dir="$out")

# Waits (60 s at most) until the run writing $log, process $1, has written its step-4 checkpoint.
wait_for_step_4() {
  for _ in $(seq 1 600); do
    grep -q "^checkpoint: .*step_00000004 " "$log" 2>/dev/null && return 0
    kill -0 "$1" 2>/dev/null || fail "the run ended before its step-4 checkpoint"
    sleep 0.1
  done
  fail "no step-4 checkpoint within 60 s"
}
