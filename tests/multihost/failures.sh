#!/usr/bin/env bash
# tests/multihost/failures.sh MODE TRAIN PREPARE_DATA [TRAIN ARGS…] — a failure during training
# across two hosts (tools/cluster), one rank each (dp 2; TRAIN ARGS add the layout, e.g. ODC),
# parallel.comm_timeout_s 3, a checkpoint every 2 steps. After the step-4 checkpoint, MODE
# strikes host 1:
#   link  its link is taken down (a cut cable or a dead switch port);
#   kill  its rank is killed (kill -9: a crashed process);
#   host  every process on it is killed (kill -9: the host is gone, Open MPI's daemon too);
#   stop  its rank is frozen (SIGSTOP).
# Passes when: every rank has ended within the timeout + 12 s and mpirun within the timeout +
# 20 s (no process left hanging); the output names what failed (Loom's `rank R (host H): <the
# operation> … did not complete within 3 s`, or Open MPI's report naming the dead rank and its
# host; with the whole host gone Open MPI ends the job at once and reports only a daemon
# failure, which does not name the host); and the
# newest complete checkpoint is the last one the run wrote, which one process resumes. Exit 77
# (skipped, saying why) where no cluster can be made. ctest: multihost.failure_<MODE>.
set -euo pipefail
mode=$1 train=$2 prepare=$3
shift 3
layout=("$@")  # more train arguments: the layout under test (default: DDP)
name="failures ($mode${layout[*]:+, ${layout[*]}})"
timeout_s=3
source "$(dirname "$0")/two_hosts.sh"
(cd "$root" && "$cluster" mpirun "$id" 1 -x OMP_NUM_THREADS=1 "$train" "${train_args[@]}" \
  --set train.steps=100000 --set parallel.dp=2 --set parallel.comm_timeout_s=$timeout_s \
  "${layout[@]}" >"$log" 2>&1) &
mpirun_pid=$!
wait_for_step_4 "$mpirun_pid"

# The ranks: processes of the train program itself (mpirun's own command line holds the same
# arguments).
ranks_alive() { pgrep -f -- "^[^ ]*train --config .*train.out_dir=$out" >/dev/null; }
start=$(date +%s.%N)
case "$mode" in
  link) "$cluster" link "$id" 1 down ;;
  host) ip netns pids "$h1" | xargs -r kill -9 ;;
  kill | stop)
    for p in $(ip netns pids "$h1"); do
      if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "train.out_dir=$out"; then
        kill "$([ "$mode" = kill ] && echo -9 || echo -STOP)" "$p"
      fi
    done
    ;;
  *) fail "unknown mode (link, kill, host, stop)" ;;
esac
elapsed() { echo "$(date +%s.%N) - $start" | bc; }
ranks_end="" mpirun_end=""
while :; do
  t=$(elapsed)
  [ -z "$ranks_end" ] && ! ranks_alive && ranks_end=$t
  [ -z "$mpirun_end" ] && ! kill -0 "$mpirun_pid" 2>/dev/null && mpirun_end=$t
  [ -n "$ranks_end" ] && [ -n "$mpirun_end" ] && break
  (($(echo "$t > $timeout_s + 20" | bc))) && break
  sleep 0.1
done
[ -n "$ranks_end" ] || fail "ranks still running $(elapsed) s after the fault"
(($(echo "$ranks_end <= $timeout_s + 12" | bc))) || fail "the ranks ended only after $ranks_end s"
if [ -z "$mpirun_end" ]; then
  # Over a cut link Open MPI's mpirun waits for TCP to give up on its message to the lost host's
  # daemon (net.ipv4.tcp_retries2: minutes); every rank has ended (docs/parallel.md, "Running
  # on several hosts"). Where it can still reach every daemon it must end.
  [ "$mode" = link ] || fail "mpirun still running $(elapsed) s after the fault"
  mpirun_end="still waiting for TCP to give up on the cut host, killed"
  kill -9 "$mpirun_pid" 2>/dev/null || true
else
  mpirun_end="$mpirun_end s"
fi
echo "$name: ranks ended $ranks_end s and mpirun $mpirun_end after the fault"

# What failed is named: Loom's rank line (the surviving rank, its host, the operation), or, for
# a host that is gone, Open MPI's report naming it.
named=0
grep -Eq "^rank 0 \(host $h0\): .* did not complete within $timeout_s s" "$log" && named=1
grep -Eq "process rank 1 with PID [0-9]+ on node $h1 exited on signal 9" "$log" && named=1
[ "$mode" = host ] && grep -Eq "lost communication with a remote daemon|unable to reliably start one or more daemons" "$log" && named=1
[ $named = 1 ] || fail "the output does not name what failed"

# The last checkpoint written is the newest complete one, and it resumes (one process).
last=$(grep "^checkpoint: " "$log" | tail -1 | awk '{print $2}')
newest=$(ls -d "$out"/checkpoints/step_* | sort | tail -1)
[ "$last" = "$newest" ] || fail "newest checkpoint $newest is not the last written, $last"
step=$((10#${last##*step_}))
resume_log="$work/resume.log"
(cd "$root" && OMP_NUM_THREADS=1 "$train" "${train_args[@]}" --set train.steps=$((step + 1)) \
  --resume latest >"$resume_log" 2>&1) || { log=$resume_log; fail "resuming failed"; }
grep -q "resumed from $last" "$resume_log" || { log=$resume_log; fail "did not resume $last"; }
echo "$name: $last intact; resumed by one process"
