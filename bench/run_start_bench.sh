#!/usr/bin/env bash
# From submit to the job's end for a short job (issue 16: submit -> first step <= 0.5 s for a
# worker that has run a job before; issue 33: <= 0.5 s submit -> finished at any spacing), in
# one run, for each mode of MODES (default "reuse warm cold"): reuse = warm rank processes kept
# for the slot's next job (the default, --reuse_ranks), warm = a new warm process per job
# (--reuse_ranks=false, the behaviour before), cold = no warm processes (--warm_ranks=false).
# For each mode and each pause of PAUSES (seconds, default "3"; issue 33: "0 0.5 3"), a fresh
# coordinator and two worker daemons (one GPU each, or one daemon and world size 1 on a one-GPU
# machine; DEVICE=cpu: CPU slots), one job first (the
# daemons' first), then RUNS jobs of examples/seed.json (5 steps), one after another, PAUSE
# seconds between one's end and the next's submit (the time a slot's next warm process has to
# set up when it is not reused). Per job: the wall time of `trainctl submit --wait`, the
# coordinator's submitted -> finished (which bounds submit -> first step from above: the five
# steps take about a millisecond), each rank's "ready N ms after its assignment" (its backend,
# NCCL communicator included), and when, after the submit, rank 0's process had its assignment,
# its backend was ready and its first step done (the worker logs' timestamps).
#   MPTRAIN_BIN=... RUNS=5 PAUSES="0 0.5 3" bash bench/run_start_bench.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mptrain-out}
mkdir -p "$OUT"
RUNS=${RUNS:-5}
PAUSES=${PAUSES:-${PAUSE:-3}}
MODES=${MODES:-reuse warm cold}
DEVICE=${DEVICE:-cuda}
RESULTS="$OUT/start_bench.jsonl"
: >"$RESULTS"
export NCCL_NVLS_ENABLE=0
SPEC=examples/seed.json
[ "$DEVICE" = cpu ] && SPEC=examples/seed_cpu.json
# One GPU (the lent nvidia-h200): one worker daemon and the seed example at world size 1.
GPUS=${GPUS:-2}
if [ "$DEVICE" = cuda ] && [ -z "${GPUS_SET:-}" ] && command -v nvidia-smi >/dev/null; then
  GPUS=$(nvidia-smi -L | grep -c '^GPU ')
fi
if [ "$DEVICE" = cuda ] && [ "$GPUS" -lt 2 ]; then
  SPEC=$(mktemp --suffix=.json)
  python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); s["world_size"] = 1; json.dump(s, open(sys.argv[2], "w"))' \
    examples/seed.json "$SPEC"
fi

COORDINATOR=$MPTRAIN_BIN/coordinator WORKER=$MPTRAIN_BIN/worker TRAINCTL=$MPTRAIN_BIN/trainctl
source scripts/lib/local_cluster.sh
status=0
for mode in $MODES; do
for PAUSE in $PAUSES; do
  CLUSTER_DIR=$(mktemp -d)
  case "$mode" in
    reuse) flags=(--warm_ranks=true --reuse_ranks=true) ;;
    warm) flags=(--warm_ranks=true --reuse_ranks=false) ;;
    cold) flags=(--warm_ranks=false) ;;
    *) echo "unknown mode $mode (reuse, warm or cold)" >&2; exit 2 ;;
  esac
  start_coordinator || exit 1
  if [ "$DEVICE" = cpu ]; then
    start_worker hostA "" --device=cpu --slots=1 "${flags[@]}"
    start_worker hostB "" --device=cpu --slots=1 "${flags[@]}"
  elif [ "$GPUS" -lt 2 ]; then
    start_worker hostA 0 --device=cuda "${flags[@]}"
  else
    start_worker hostA 0 --device=cuda "${flags[@]}"
    start_worker hostB 1 --device=cuda "${flags[@]}"
  fi
  wait_for_workers $([ "$DEVICE" = cuda ] && [ "$GPUS" -lt 2 ] && echo 1 || echo 2) || exit 1
  sleep "$PAUSE"
  for run in $(seq 0 "$RUNS"); do
    start_ns=$(date +%s%N)
    job=$("$TRAINCTL" --coordinator="$ADDRESS" submit "$SPEC" --wait | tail -1)
    end_ns=$(date +%s%N)
    "$TRAINCTL" --coordinator="$ADDRESS" --output=json status "$job" >"$CLUSTER_DIR/$job.json" ||
      status=1
    python3 - "$CLUSTER_DIR/$job.json" "$mode" "$run" "$start_ns" "$end_ns" "$job" "$PAUSE" \
      "$CLUSTER_DIR"/host*.log <<'PY' |
import datetime, json, re, sys
path, mode, run, start_ns, end_ns, job_id, pause = sys.argv[1:8]
job = json.load(open(path))
submitted = int(job.get("submitted_unix_ms", job.get("submittedUnixMs", 0)))
finished = int(job.get("finished_unix_ms", job.get("finishedUnixMs", 0)))

def stamp(line):  # "[2026-11-30 20:05:03.268] ..." in this machine's local time -> unix ms
    when = datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S.%f")
    return int(when.timestamp() * 1000)

# Where the time goes, rank 0's worker (hostA): ms after the coordinator took the submit.
phases, ready, reused = {}, [], 0
for log in sys.argv[8:]:
    for line in open(log, errors="replace"):
        if not line.startswith("["):
            continue
        if f" of {job_id} (attempt" in line and ("handed to" in line or "started rank" in line):
            phases.setdefault("rank_process_has_assignment", stamp(line) - submitted)
            reused += "; reused: it ran" in line
        elif f"[{job_id}/rank" in line:
            found = re.search(r"ready (\d+) ms after", line)
            if found:
                ready.append(int(found.group(1)))
                phases.setdefault("backend_ready", stamp(line) - submitted)
            elif "step      1 " in line:
                phases.setdefault("first_step_done", stamp(line) - submitted)
print(json.dumps({"mode": mode, "pause_s": float(pause), "run": int(run),
                  "first_of_daemons": run == "0", "ranks_in_reused_processes": reused,
                  "state": job.get("state"),
                  "submit_wait_ms": round((int(end_ns) - int(start_ns)) / 1e6, 1),
                  "submitted_to_finished_ms": finished - submitted if finished else None,
                  "after_submit_ms": phases, "rank_ready_ms": ready}))
PY
      tee -a "$RESULTS"
    sleep "$PAUSE"
  done
  stop_cluster
  cp "$CLUSTER_DIR"/hostA.log "$OUT/start_bench_${mode}_${PAUSE}s_hostA.log"
  cp "$CLUSTER_DIR"/coordinator.log "$OUT/start_bench_${mode}_${PAUSE}s_coordinator.log"
  rm -rf "$CLUSTER_DIR"
done
done
python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print("| ranks | jobs apart | submit --wait (median) | submitted -> finished (median, min-max) | ranks in reused processes | rank ready after assignment (median) | after submit: assignment in a rank process / backend ready / first step done (medians) |")
print("|---|---|---|---|---|---|---|")
keys = []
for r in rows:
    if (r["mode"], r["pause_s"]) not in keys:
        keys.append((r["mode"], r["pause_s"]))
for mode, pause in keys:
    runs = [r for r in rows
            if r["mode"] == mode and r["pause_s"] == pause and not r["first_of_daemons"]]
    if not runs:
        continue
    done = [r["submitted_to_finished_ms"] for r in runs if r["submitted_to_finished_ms"] is not None]
    ready = [t for r in runs for t in r["rank_ready_ms"]]
    def phase(name):
        values = [r["after_submit_ms"][name] for r in runs if name in r["after_submit_ms"]]
        return "%.0f" % statistics.median(values) if values else "-"
    print("| %s | %g s | %.0f ms | %.0f ms (%d-%d) | %d of %d | %s | %s / %s / %s ms |" % (
        mode, pause, statistics.median(r["submit_wait_ms"] for r in runs),
        statistics.median(done), min(done), max(done),
        sum(r["ranks_in_reused_processes"] for r in runs), sum(len(r["rank_ready_ms"]) for r in runs),
        "%.0f ms" % statistics.median(ready) if ready else "-",
        phase("rank_process_has_assignment"), phase("backend_ready"), phase("first_step_done")))
PY
exit $status
