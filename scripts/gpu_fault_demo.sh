#!/usr/bin/env bash
# On the GPU machine (after `source device_bundle/env.sh`): a 2-GPU job is running; one rank
# is killed with SIGKILL. Shows how long until the job is FAILED, the error, the surviving
# rank's abort of its NCCL communicator, and that no rank process is left.
set -uo pipefail
cd "$(dirname "$0")/.."
COORDINATOR=$MPTRAIN_BIN/coordinator WORKER=$MPTRAIN_BIN/worker TRAINCTL=$MPTRAIN_BIN/trainctl
source scripts/lib/local_cluster.sh
trap stop_cluster EXIT
start_coordinator --heartbeat-timeout=5
start_worker worker0 0 --device=cuda
start_worker worker1 1 --device=cuda
wait_for_workers 2
RUN_DIR=$CLUSTER_DIR
cat >"$RUN_DIR/long.json" <<'SPEC'
{"name": "long-gpu", "world_size": 2, "device": "cuda",
 "model": {"input_dim": 4096, "hidden_dims": [4096, 4096], "output_dim": 4096},
 "data": {"synthetic": {"seed": 0}}, "micro_batch_size": 2048, "accumulation_steps": 4,
 "steps": 100000000, "optimizer": {"lr": 0.001}, "telemetry_every": 100}
SPEC
CTL=("$TRAINCTL" --coordinator="$ADDRESS")
JOB=$("${CTL[@]}" submit "$RUN_DIR/long.json" | tail -n 1)
step_of() { "${CTL[@]}" --output=json status "$JOB" | python3 -c \
  "import json,sys; j=json.load(sys.stdin); print(min(int(p.get('step', 0)) for p in j['progress']))"; }
for _ in $(seq 200); do [ "$(step_of)" -ge 200 ] && break; sleep 0.1; done
echo "job $JOB at step $(step_of) on both ranks"
VICTIM=$(pgrep -f "run_rank=.*/$JOB-rank1-")
KILLED_AT=$(date +%s.%N)
kill -9 "$VICTIM"
echo "killed rank 1 (pid $VICTIM)"
while true; do
  STATE=$("${CTL[@]}" --output=json status "$JOB" | python3 -c "import json,sys; print(json.load(sys.stdin)['state'])")
  [ "$STATE" != RUNNING ] && break
  sleep 0.02
done
FAILED_AT=$(date +%s.%N)
echo "job $STATE after $(python3 -c "print(round($FAILED_AT - $KILLED_AT, 3))") s"
"${CTL[@]}" status "$JOB" | grep -E "state|error"
for _ in $(seq 100); do pgrep -f "run_rank=.*/$JOB-" >/dev/null || break; sleep 0.05; done
GONE_AT=$(date +%s.%N)
if pgrep -f "run_rank=.*/$JOB-" >/dev/null; then echo "rank processes LEFT:"; pgrep -af "run_rank=.*/$JOB-";
else echo "no rank process left, $(python3 -c "print(round($GONE_AT - $KILLED_AT, 3))") s after the kill"; fi
echo "--- surviving rank 0 (worker gpu0 log):"
grep -E "rank0\]|rank 0 of|\(\+0x|\[0x|stack:" "$RUN_DIR/worker0.log" | grep -vE "step +[0-9]+ loss" | tail -40
