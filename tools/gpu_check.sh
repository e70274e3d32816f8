#!/usr/bin/env bash
# tools/gpu_check.sh — the one call on a GPU machine (issue 6): gets the CUDA programs (from
# .gpu/bundle.tar.xz made by tools/gpu_bundle.sh, else builds them here for sm_90), then
#   1. runs the CUDA tests (every kernel against the CPU kernel, GPU training against the CPU run)
#      and the conformance table's CUDA entries (every op case, forward and backward, against the
#      CPU: tests/conformance/),
#   2. measures the device's ceilings (copy GB/s, bf16 GEMM TFLOP/s) and every kernel against them
#      (attention both as Loom's kernels and through cuDNN, to keep the faster as the default),
#   3. trains GPT-2 124M, 350M (also with cuDNN's attention), 1.5B and Llama ~1B for a few steps
#      on synthetic tokens (tokens/s, MFU against the measured GEMM ceiling, peak memory), each
#      run first predicted by the step-time model (`train --plan --time`, docs/planning.md),
#   4. compares GPT-2 124M forward logits with PyTorch/transformers on the same weights, and
#      Hugging Face directories converted both ways (tools/check_hf_roundtrip.py),
# and prints a short table last. Full logs go under $OUT (the device tool's folder; default
# ./gpu_check_out). Each stage has its own time limit so that one hang cannot eat the lease,
# and the later stages fit a budget for the whole script (GPU_CHECK_BUDGET_S, below); it is
# sized to finish in about 8 minutes on an H200.
#
#   tools/gpu_check.sh [--skip-train] [--only-tests] [--stages=LIST] [--suites=A,B,...] [--memcheck]
# --stages runs only those of tests,conformance,kernels,train,sft,plan,torch,logits (default all
# but plan;
# --only-tests is tests,conformance; --skip-train leaves out train, sft and torch). The Loom and
# PyTorch run lists can be replaced (GPU_CHECK_TRAIN_RUNS, GPU_CHECK_TORCH_RUNS: ';'-separated
# entries of the lists below); without the kernels stage, GPU_CHECK_PEAK_TFLOPS gives the GEMM
# rate that MFU is counted against.
# --suites runs only those CUDA test suites (e.g. to rerun the failed ones after a fix);
# --memcheck runs each suite under compute-sanitizer's memcheck (much slower: pair it with
# --only-tests and --suites; it needs a machine where the sanitizer sees the GPU, KINDS.md).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
stages=tests,conformance,kernels,train,sft,torch,logits
only_suites=""
memcheck=()
for a in "$@"; do
  case "$a" in
    --skip-train) stages=tests,conformance,kernels,logits ;;
    --only-tests) stages=tests,conformance ;;
    --stages=*) stages=${a#--stages=} ;;
    --suites=*) only_suites=${a#--suites=} ;;
    --memcheck)
      # Memory errors only: the CUDA API errors it would also report are the ones tests provoke
      # (a bad device index) and NCCL's own probing of kernel images, both handled.
      memcheck=(compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 --print-limit 20)
      export LOOM_UNDER_SANITIZER=memcheck ;;
    *) echo "usage: tools/gpu_check.sh [--skip-train] [--only-tests] [--stages=LIST] [--suites=A,B,...] [--memcheck]" >&2; exit 2 ;;
  esac
done
want() { [[ ",$stages," == *",$1,"* ]]; }
summary="$OUT/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
t_start=$(date +%s)
stamp() { echo "[$(($(date +%s) - t_start)) s] $*"; }
# The whole script's time (GPU_CHECK_BUDGET_S, default 510 s, under a 540 s device call): the
# stages after the tests shrink their limits to what is left, keeping 60 s for the logits
# comparison and the table, so a slow stage costs the later ones, never the summary.
budget=${GPU_CHECK_BUDGET_S:-510}
left() { echo $((budget - SECONDS)); }
# limit WANTED: WANTED seconds, or less when that would eat the last 60 s; at least 1 (for
# timeout, 0 would mean no limit at all).
limit() { local l=$(($(left) - 60)); ((l > $1)) && l=$1; ((l < 1)) && l=1; echo "$l"; }

# --- the machine -------------------------------------------------------------------------------
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -2
  uname -a
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
} >/tmp/loom_gpu_env.txt 2>&1
# (The device tool brings back 8 files: the machine's description goes at the end of the
# summary rather than into a file of its own, the unpack log only when unpacking failed.)
note "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"

# CUDA libraries: the toolkit's, then the ones PyTorch's wheels carry (cuBLAS, NCCL).
cuda_libs=/usr/local/cuda/lib64:/usr/local/cuda/lib
for pkg in cublas nccl cudnn cuda_runtime; do
  d=$(python3 -c "import nvidia.$pkg as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null) &&
    cuda_libs="$cuda_libs:$d"
done
# CUDA 13 wheels put cuBLAS and the runtime under nvidia/cu13/lib instead.
d=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null) &&
  [[ -d "$d" ]] && cuda_libs="$cuda_libs:$d"

# --- programs ----------------------------------------------------------------------------------
if [[ -f .gpu/bundle.tar.xz ]]; then
  stamp "using the prebuilt bundle"
  rm -rf /tmp/loom_bundle && mkdir -p /tmp/loom_bundle
  # tar needs an xz binary; Python's tarfile does not.
  tar -C /tmp/loom_bundle -xJf .gpu/bundle.tar.xz 2>/tmp/loom_unpack.log ||
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
      .gpu/bundle.tar.xz /tmp/loom_bundle 2>>/tmp/loom_unpack.log
  bin=/tmp/loom_bundle/bundle/bin
  [[ -x $bin/train && -x $bin/cuda_tests ]] ||
    { cp /tmp/loom_unpack.log "$OUT/unpack.log"; note "bundle unpack failed (unpack.log)"; exit 1; }
  [[ -f /tmp/loom_bundle/bundle/REVISION ]] && note "bundle: $(cat /tmp/loom_bundle/bundle/REVISION)"
  export LD_LIBRARY_PATH=/tmp/loom_bundle/bundle/lib:$cuda_libs:${LD_LIBRARY_PATH:-}
else
  stamp "building for sm_90"
  bin=$PWD/build-gpu/bin
  export LD_LIBRARY_PATH=$cuda_libs:${LD_LIBRARY_PATH:-}
  if ! { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
           -DLOOM_CUDA_ARCHITECTURES=90 -DLOOM_MPI=OFF &&
         ninja -C build-gpu cuda_tests conformance_tests gpu_kernels_bench train dump_logits convert prepare_data; } >"$OUT/build.log" 2>&1; then
    note "BUILD FAILED (see build.log)"; tail -30 "$OUT/build.log"; exit 1
  fi
fi
missing=$(ldd "$bin/cuda_tests" "$bin/train" 2>&1 | grep "not found" | sort -u)
[[ -n "$missing" ]] && note "missing libraries: $missing"
# Registers, shared memory and launch bounds of every kernel as built (docs/cuda.md).
libloom=$(ldd "$bin/train" 2>/dev/null | sed -n 's/.*libloom.so => \([^ ]*\).*/\1/p')
if [[ -n "$libloom" ]] && timeout 60 tools/cuda_resources.sh "$libloom" >"$OUT/resources.txt" 2>&1; then
  note "launch resources: ok (resources.txt)"
else
  note "launch resources: see resources.txt"
fi

# --- 1. CUDA tests -----------------------------------------------------------------------------
# One process per test suite: a kernel that corrupts the CUDA context (an illegal address is
# sticky) then fails only its own suite, not every test after it. 300 s for all, 120 s per suite.
: >"$OUT/cuda_tests.log"
if want tests; then
stamp "CUDA tests"
# (Suite lines end with "."; gtest_main's "Running main() from …" does not.)
suites=$("$bin/cuda_tests" --gtest_list_tests 2>>"$OUT/cuda_tests.log" | awk '/^[^ ].*\.$/ {sub(/\.$/, "", $1); print $1}')
[[ -n "$only_suites" ]] && suites=$(echo "$suites" | grep -Fx -f <(tr ',' '\n' <<<"$only_suites"))
crashed=""
tests_deadline=$((SECONDS + 300))
for suite in $suites; do
  left=$((tests_deadline - SECONDS))
  if ((left < 5)); then crashed="$crashed $suite(no time left)"; continue; fi
  timeout -k 10 $((left < 120 ? left : 120)) "${memcheck[@]}" "$bin/cuda_tests" --gtest_filter="$suite.*" \
    --gtest_color=no >>"$OUT/cuda_tests.log" 2>&1
  rc=$?
  # gtest exits 1 when a test failed; 99 is a memcheck finding; anything else is a crash or the
  # time limit.
  ((rc == 99)) && crashed="$crashed $suite(memcheck: see cuda_tests.log)"
  ((rc != 0 && rc != 1 && rc != 99)) && crashed="$crashed $suite(exit $rc)"
done
passed=$(grep -c "^\[       OK \]" "$OUT/cuda_tests.log")
failed=$(grep "^\[  FAILED  \] [A-Za-z0-9_/]*\.[A-Za-z0-9_/]* (" "$OUT/cuda_tests.log" | sed 's/ (.*//' | sort -u)
skipped=$(grep "^\[  SKIPPED \] .* (" "$OUT/cuda_tests.log" | sort -u | grep -c .)
note "cuda_tests: $(echo "$suites" | grep -c .) suites, $passed passed, $(echo -n "$failed" | grep -c .) failed, $skipped skipped${crashed:+, crashed or timed out:$crashed}"
[[ -n "$failed" ]] && echo "$failed" | sed 's/^/  /' | tee -a "$summary"
fi
# The conformance table's CUDA entries (<op>_<case>_cuda; the CPU-only checks ran in CI), in one
# process, at most 90 s.
if want conformance && [[ -x $bin/conformance_tests && -z "$only_suites" ]]; then
  stamp "conformance table on CUDA"
  timeout -k 10 "$(limit 90)" "${memcheck[@]}" "$bin/conformance_tests" --gtest_filter='*_cuda' \
    --gtest_color=no >"$OUT/conformance_tests.log" 2>&1
  rc=$?
  c_passed=$(grep -c "^\[       OK \]" "$OUT/conformance_tests.log")
  c_failed=$(grep "^\[  FAILED  \] [A-Za-z0-9_/]*\.[A-Za-z0-9_/]*[ ,]" "$OUT/conformance_tests.log" |
    sed 's/^\[  FAILED  \] //; s/[ ,].*//' | sort -u)
  c_skipped=$(grep "^\[  SKIPPED \] .* (" "$OUT/conformance_tests.log" | sort -u | grep -c .)
  note "conformance_tests (cuda): $c_passed passed, $(echo -n "$c_failed" | grep -c .) failed, $c_skipped skipped$( ((rc != 0 && rc != 1)) && echo ", exit $rc (crash or time limit)")"
  [[ -n "$c_failed" ]] && echo "$c_failed" | sed 's/^/  /' | tee -a "$summary"
fi
want kernels || want train || want sft || want plan || want torch || want logits ||
  { stamp done; cat /tmp/loom_gpu_env.txt >>"$summary"; cat "$summary"; exit 0; }

# --- 2. ceilings and kernels -------------------------------------------------------------------
: >"$OUT/kernels.log"
want kernels && stamp "kernel benchmark"
if ! want kernels; then
  :
elif (($(limit 180) >= 30)); then
  # Line-buffered: what was measured survives a timeout.
  timeout -k 10 "$(limit 180)" stdbuf -oL "$bin/gpu_kernels_bench" --benchmark_color=false >"$OUT/kernels.log" 2>&1
else
  note "kernel benchmark: not run: out of time"; : >"$OUT/kernels.log"
fi
gemm_tflops=$(sed -n 's/^ceilings: copy .* bf16 GEMM \([0-9.]*\) TFLOP\/s/\1/p' "$OUT/kernels.log" | tail -1)
# The bench prints the ceilings first too: enough when it was stopped before the end.
[[ -z "$gemm_tflops" ]] &&
  gemm_tflops=$(sed -n 's/^ceilings: device-to-device copy .* bf16 GEMM 8192^3 \([0-9.]*\) TFLOP\/s.*/\1/p' \
    "$OUT/kernels.log" | head -1)
[[ -z "$gemm_tflops" ]] && gemm_tflops=${GPU_CHECK_PEAK_TFLOPS:-0}
peak_flops=$(python3 -c "print(float('$gemm_tflops') * 1e12)")

# --- 3. training steps -------------------------------------------------------------------------
: >"$OUT/train.log"
if want train || want sft; then
  stamp "training steps"
  synth=/tmp/loom_synth
  mkdir -p "$synth"
  python3 - "$synth" <<'PY'
import struct, sys, random
# llm.c token shards (data/shard.h): 256 int32 header (magic, version, count), then uint16 ids.
rng = random.Random(0)
for name, n in (("train_000.bin", 4_000_000), ("val_000.bin", 200_000)):
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *(rng.randrange(50257) for _ in range(n))))
PY
  # model config, micro-batch, sequence length, steps, attention kernel (train.attention_kernel:
  # the 350M model once more with cuDNN's attention, to compare end to end)
  # (The runs PyTorch is compared with first; the 1.5B model last, when time is left.)
  train_runs="gpt2-124m 32 1024 20 loom;gpt2-350m 32 1024 15 loom;llama-1b 8 2048 10 loom;gpt2-350m 32 1024 10 cudnn;gpt2-1.5b 16 1024 10 loom"
  want train || train_runs=""
  IFS=';' read -ra runs <<<"${GPU_CHECK_TRAIN_RUNS-$train_runs}"
  for run in "${runs[@]}"; do
    # Fields after the attention kernel are more `--set` options (e.g. model.n_layer=4).
    read -r cfg b t steps attn extra <<<"$run"
    sets=()
    for kv in $extra; do sets+=(--set "$kv"); done
    if (($(limit 150) < 30)); then note "training: $cfg ($attn) not run: out of time"; continue; fi
    echo "=== $cfg B=$b T=$t attention=$attn${extra:+ $extra}" >>"$OUT/train.log"
    # warmup_steps 0: the configs' warmup is longer than these runs (a config error otherwise).
    args=(--config "configs/$cfg.yaml"
      --set "data.train=$synth/train_*.bin" --set "data.val=$synth/val_*.bin"
      --set data.batch_size="$b" --set data.seq_len="$t" --set optim.grad_accum=1
      --set optim.warmup_steps=0 --set train.log_every=1
      --set train.steps="$steps" --set train.device=cuda --set train.precision=bf16
      --set train.peak_flops="$peak_flops" --set train.val_every=0 --set train.sample_every=0
      --set train.attention_kernel="$attn"
      --set train.out_dir="/tmp/loom_runs/$cfg-$attn" --set checkpoint.at_end=false "${sets[@]}")
    # The step-time model's prediction first (train/planner/step_time.h; it calibrates on this
    # GPU the shapes it has not measured), then the measured run.
    pred=$(timeout -s KILL "$(limit 60)" "$bin/train" "${args[@]}" --plan --time \
      --calibration "$OUT/calibration.json" 2>>"$OUT/train.log" |
      sed -n 's/^  step *\([0-9.]*\) ms.*/\1/p')
    echo "=== predicted step ${pred:-?} ms" >>"$OUT/train.log"
    # KILL: train stops gracefully on SIGTERM, finishing its step and writing a checkpoint.
    timeout -s KILL "$(limit 150)" "$bin/train" "${args[@]}" >>"$OUT/train.log" 2>&1
    echo "=== exit $?" >>"$OUT/train.log"
  done
  # Packed SFT documents on the device (data.packing: the block-diagonal attention kernels end to
  # end, bf16), from the shipped chat sample; ODC itself needs MPI, which this build leaves out.
  # (--bpe-dir: the bundle's programs live outside this tree, so they cannot find it themselves.)
  if want sft && (($(limit 90) >= 30)) && [[ -x $bin/prepare_data ]]; then
    echo "=== sft-tiny packed on cuda" >>"$OUT/train.log"
    rm -rf /tmp/loom_chat
    "$bin/prepare_data" --format chat --input data/samples/chat_sample.jsonl --bpe-dir data/gpt2-bpe \
      --out-dir /tmp/loom_chat >>"$OUT/train.log" 2>&1
    timeout -s KILL "$(limit 90)" "$bin/train" --config configs/sft-tiny.yaml \
      --set 'model.init_from=""' --set parallel.dp=1 --set parallel.zero_stage=0 --set parallel.odc=false \
      --set "data.train=/tmp/loom_chat/train_*.bin" --set "data.val=/tmp/loom_chat/val_*.bin" \
      --set train.steps=30 --set train.log_every=5 --set train.val_every=30 --set train.device=cuda \
      --set train.precision=bf16 --set optim.warmup_steps=0 --set train.out_dir=/tmp/loom_runs/sft \
      --set checkpoint.at_end=false >>"$OUT/train.log" 2>&1
    echo "=== exit $?" >>"$OUT/train.log"
  fi
fi

# --- 3a. GPU cluster plans: the step-time model calibrated on this GPU -------------------------
# Each entry (';'-separated): a config and `--set` options of a multi-GPU layout. `train --plan
# --time --device h200` measures on this GPU every shape a rank of that layout computes (Note
# [Compute calibration]) into $OUT/calibration.json, with the links from the device's data
# sheet (Note [Data-sheet links]); a machine without a GPU replays the file and prints the same
# plans (docs/planning.md, "GPU clusters").
if want plan; then
  stamp "GPU cluster plans"
  b16="--set train.precision=bf16 --set optim.grad_accum=1"
  plan_runs="gpt2-124m $b16 --set data.batch_size=64 --set data.seq_len=1024 --set parallel.dp=8"
  plan_runs+=";llama3-8b $b16 --set data.batch_size=2 --set parallel.dp=8 --set parallel.zero_stage=3 --set model.recompute=full"
  plan_runs+=";llama3-8b $b16 --set data.batch_size=2 --set parallel.dp=8 --set parallel.zero_stage=3"
  plan_runs+=";llama3-8b $b16 --set data.batch_size=4 --set optim.grad_accum=4 --set parallel.dp=32 --set parallel.tp=8 --set parallel.sequence_parallel=true --set parallel.zero_stage=3 --set model.recompute=full --set model.n_layer=80 --set model.n_embd=8192 --set model.n_head=64 --set model.ffn_hidden=28672"
  plan_runs+=";llama3-8b --set train.precision=bf16 --set data.batch_size=2 --set optim.grad_accum=8 --search --gpus 8"
  IFS=';' read -ra runs <<<"${GPU_CHECK_PLAN_RUNS-$plan_runs}"
  # An earlier run's file (GPU_CHECK_CALIBRATION): its shapes are not measured again. Each plan
  # gets GPU_CHECK_PLAN_LIMIT_S seconds (a 70B-wide block takes minutes to calibrate).
  [[ -f ${GPU_CHECK_CALIBRATION:-} ]] && cp "$GPU_CHECK_CALIBRATION" "$OUT/calibration.json"
  plan_limit=${GPU_CHECK_PLAN_LIMIT_S:-120}
  for run in "${runs[@]}"; do
    if (($(limit "$plan_limit") < 20)); then note "plan: not run (out of time): $run"; continue; fi
    read -ra words <<<"$run"
    echo "=== plan: $run" >>"$OUT/plan.log"
    timeout -s KILL "$(limit "$plan_limit")" "$bin/train" --config "configs/${words[0]}.yaml" \
      "${words[@]:1}" --set train.device=cuda --plan --time --device h200 \
      --calibration "$OUT/calibration.json" >>"$OUT/plan.log" 2>&1
    echo "=== exit $?" >>"$OUT/plan.log"
  done
fi

# --- 3b. the same models in PyTorch ------------------------------------------------------------
# transformers' GPT-2 and Llama, bf16 autocast, SDPA, fused AdamW, same batch and sequence
# length, eager and torch.compile (tools/bench/torch_baseline.py); MFU over the same GEMM rate.
: >"$OUT/torch.log"
if want torch; then
  stamp "PyTorch baseline"
  torch_runs="gpt2-124m 32 1024 eager;gpt2-124m 32 1024 compile;gpt2-350m 32 1024 eager;llama-1b 8 2048 eager;gpt2-350m 32 1024 compile;llama-1b 8 2048 compile"
  IFS=';' read -ra runs <<<"${GPU_CHECK_TORCH_RUNS-$torch_runs}"
  for run in "${runs[@]}"; do
    read -r cfg b t mode <<<"$run"
    if (($(limit 120) < 25)); then note "PyTorch: $cfg $mode not run: out of time"; continue; fi
    timeout -s KILL "$(limit 120)" python3 tools/bench/torch_baseline.py --config "configs/$cfg.yaml" \
      --batch "$b" --seq "$t" --steps 10 --warmup 3 $([[ $mode == compile ]] && echo --compile) \
      --peak-flops "$peak_flops" >>"$OUT/torch.log" 2>&1
    rc=$?
    ((rc != 0)) && echo "torch_baseline: $cfg $mode exit $rc" >>"$OUT/torch.log"
  done
fi

# --- 4. logits against PyTorch -----------------------------------------------------------------
if want logits; then
stamp "logits against PyTorch"
# What is left of the budget, at most 120 s and at least 5 s, per command.
logits_limit() { local l=$(($(left) - 10)); ((l > 120)) && l=120; ((l < 5)) && l=5; echo "$l"; }
timeout -k 5 "$(logits_limit)" "$bin/dump_logits" --config configs/gpt2-124m.yaml --device cuda --batch 2 \
  --seq 256 --out /tmp/loom_gpt2_logits.safetensors >"$OUT/logits.log" 2>&1
dump_rc=$?
echo "=== dump_logits exit $dump_rc" >>"$OUT/logits.log"
if ((dump_rc == 0)); then
  timeout -k 5 "$(logits_limit)" python3 tools/compare_logits_torch.py /tmp/loom_gpt2_logits.safetensors \
    --tol 1e-4 >>"$OUT/logits.log" 2>&1
  echo "=== compare_logits_torch exit $?" >>"$OUT/logits.log"
fi
# Hugging Face conversion both ways under transformers (CPU, f64; CI has no torch: issue 17).
if [[ -x $bin/convert ]]; then
  timeout -k 5 "$(logits_limit)" python3 tools/check_hf_roundtrip.py --bin "$bin" --tol 1e-4 \
    >>"$OUT/logits.log" 2>&1
  echo "=== check_hf_roundtrip exit $?" >>"$OUT/logits.log"
fi
else
  : >"$OUT/logits.log"
fi

# --- the table ---------------------------------------------------------------------------------
stamp "done"
{
  if want plan; then
    echo
    echo "== GPU cluster plans (predicted; plan.log, calibration.json)"
    grep -E '^=== |^  step |^  \w.*(fits|does NOT fit)|error' "$OUT/plan.log" | cut -c1-200
  fi
  echo
  echo "== kernels (fraction of the measured ceilings)"
  sed -n '/^kernel  *time (us)/,$p' "$OUT/kernels.log"
  if want train || want sft || want torch; then
    echo
    echo "== training (bf16, one GPU; median of the step lines after the first 3)"
    python3 - "$OUT/train.log" <<'PY'
import re, statistics, sys
runs, cur, status, predicted = {}, None, {}, {}
for line in open(sys.argv[1]):
    if line.startswith("=== exit "):
        status[cur] = line.split()[2]
    elif line.startswith("=== predicted step "):
        predicted[cur] = line.split()[3]
    elif line.startswith("=== "):
        cur = line[4:].strip(); runs[cur] = []
    elif cur and re.search(r"\bstep\s+\d+", line) and "tok/s" in line:
        runs[cur].append(line)
    elif cur and "error" in line.lower() and cur not in status:
        status.setdefault(cur + " error", line.strip()[:160])
for name, lines in runs.items():
    rows = lines[3:] or lines
    def med(pat):
        v = [float(m.group(1).replace(",", "")) for l in rows if (m := re.search(pat, l))]
        return statistics.median(v) if v else float("nan")
    peak = re.search(r"peak ([0-9.]+ \w+)", rows[-1]) if rows else None
    print(f"{name:28s} {med(r'([0-9.,]+) tok/s'):>10.0f} tok/s  MFU {med(r'MFU ([0-9.]+)%'):5.1f}%  "
          f"peak mem {peak.group(1) if peak else '?'}  ({len(lines)} steps, exit {status.get(name, '?')})")
    if name in predicted:  # the step-time model (train --plan --time) against the median step
        ms = med(r"\| ([0-9.]+) ms \|")
        try:
            p = float(predicted[name])
            print(f"    step predicted {p:.1f} ms, measured {ms:.1f} ms: {100 * (p - ms) / ms:+.1f} %")
        except ValueError:
            print(f"    step predicted ? (see train.log), measured {ms:.1f} ms")
    if name + " error" in status:
        print(f"    {status[name + ' error']}")
PY
    echo
    echo "== PyTorch on the same GPU (tools/bench/torch_baseline.py; Loom/PyTorch = tok/s ratio)"
    python3 - "$OUT/train.log" "$OUT/torch.log" <<'PY'
import re, statistics, sys
loom, cur = {}, None
for line in open(sys.argv[1]):
    if line.startswith("=== ") and not line.startswith(("=== exit", "=== predicted")):
        f = line[4:].split(); cur = f[0] if f[-1] == "attention=loom" else None; loom.setdefault(cur, [])
    elif cur and re.search(r"\bstep\s+\d+", line) and (m := re.search(r"([0-9.,]+) tok/s", line)):
        loom[cur].append(float(m.group(1).replace(",", "")))
for line in open(sys.argv[2]):
    if m := re.match(r"torch_baseline: (\S+) (\S+) .*tok/s (\d+) MFU ([0-9.na]+)%", line):
        v = loom.get(m.group(1)) or []
        lt = statistics.median(v[3:] or v) if v else float("nan")
        print(f"{m.group(1):10s} torch {m.group(2):7s} {int(m.group(3)):>9d} tok/s MFU {m.group(4):>5s}%"
              f"   Loom {lt:>9.0f} tok/s   Loom/PyTorch {lt / int(m.group(3)):.2f}")
    elif line.startswith("torch_baseline:") or "Error" in line:
        print("  " + line.strip()[:160])
PY
  fi
  echo
  grep "compare_logits_torch\|check_hf_roundtrip\|error\|Error\|^=== " "$OUT/logits.log" | head -8
} | tee -a "$summary"
{
  echo
  echo "== the machine"
  cat /tmp/loom_gpu_env.txt
} >>"$summary"
