#!/usr/bin/env bash
# Failures across simulated hosts (tests/lib/simulated_hosts.sh): the coordinator on h0
# (heartbeat timeout 4 s), workers on h1, h2 and h3 (no --host; each with its own disk), mutual
# TLS and tokens. Checked:
#   1. one host's link pulled mid-job: the job FAILS naming that worker within the heartbeat
#      timeout + 5 s, and no rank is left on any host (the cut-off worker fences its own);
#      plugged back in, the worker registers again and replaces its lost entry;
#   2. a partition between the two hosts of a job (both still reach the coordinator): the job
#      FAILS naming the partition and both ranks' hosts within collective_timeout_s + 2 s;
#   3. max_restarts 1, checkpoints on rank 0's own disk, rank 1's host killed: the restart puts
#      rank 0 where the checkpoint is and ends SUCCEEDED, bit-identical (parameter checksum) to
#      an uninterrupted run, after exactly one restart that resumed from the checkpoint the
#      coordinator had at the kill (or a later one; its telemetry's first step), not from step 0;
#   4. the same with rank 0's host killed: a clear failure ("cannot resume");
#   5. the same with a shared checkpoint_dir (checkpoint_dir_shared): SUCCEEDED, bit-identical,
#      one restart from the checkpoint;
#   6. a host renumbered while its worker runs: the worker registers again under the new
#      address, and a job over every worker succeeds;
#   7. one-way loss (the coordinator's packets to a job's host dropped) past the timeout: the
#      worker self-fences its rank, and the job's error says so once the loss ends (within
#      the timeout after the fence: a peer's failure is held back that long for a cause), or
#      names the worker lost, whichever timeout ran out first; never the peer's failure.
set -uo pipefail
RUNFILES=${TEST_SRCDIR:-$(dirname "$0")/..}/${TEST_WORKSPACE:-mptrain}
BIN_COORDINATOR=$RUNFILES/coordinator/coordinator
BIN_WORKER=$RUNFILES/worker/worker
BIN_TRAINCTL=$RUNFILES/client/trainctl
N_HOSTS=4
source "$RUNFILES/tests/lib/simulated_hosts.sh"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
HEARTBEAT_S=4
hosts_up

bash "$RUNFILES/scripts/make_pki.sh" --worker w1 --worker w2 --worker w3 "$WORK/pki" $NET.10 >/dev/null
# A worker's own credentials (make_pki.sh --worker NAME): the coordinator registers it as NAME only.
creds() { local p=$WORK/pki; echo "--tls_ca=$p/ca.pem --tls_cert=$p/$1.pem --tls_key=$p/$1.key --token_file=$p/$1.token"; }
TLS=(--tls_ca="$WORK/pki/ca.pem" --tls_cert="$WORK/pki/client.pem" --tls_key="$WORK/pki/client.key")
COORDINATOR=$NET.10:50051
mkdir -p "$WORK/shared"

on_host 0 "$BIN_COORDINATOR" --listen=$COORDINATOR --state_dir="$WORK/state" \
  --heartbeat_timeout=$HEARTBEAT_S --tls_cert="$WORK/pki/server.pem" \
  --tls_key="$WORK/pki/server.key" --tls_client_ca="$WORK/pki/ca.pem" \
  --token_file="$WORK/pki/tokens" >"$WORK/coordinator.log" 2>&1 &

start_worker() {  # I
  mkdir -p "$WORK/w$1"
  on_host_with_disk $1 "$BIN_WORKER" --coordinator=$COORDINATOR --device=cpu --slots=1 \
    --name=w$1 --work_dir="$WORK/w$1" --data_root="$WORK" \
    --output_root="$WORK/disk" --output_root="$WORK/shared" \
    $(creds w$1) >>"$WORK/worker$1.log" 2>&1 &
}
ctl() { on_host 0 "$BIN_TRAINCTL" --coordinator=$COORDINATOR "${TLS[@]}" \
          --token_file="$WORK/pki/alice.token" "$@"; }
# FIELD of a job's JSON (a Python expression over `job`).
job_field() {  # JOB EXPRESSION
  ctl --output=json status "$1" 2>/dev/null |
    python3 -c "import json, sys; job = json.load(sys.stdin); print($2)" 2>/dev/null
}
alive_workers() { ctl --output=json workers 2>/dev/null | grep -c '"ALIVE"'; }
wait_alive() {  # COUNT
  for _ in $(seq 150); do [ "$(alive_workers)" -ge "$1" ] && return 0; sleep 0.2; done
  fail "only $(alive_workers) workers alive, wanted $1"
}
# Waits until JOB's state is one of STATES (a regex) and prints the seconds it took.
wait_state() {  # JOB STATES TIMEOUT_S
  local start=$SECONDS state
  while [ $((SECONDS - start)) -lt "$3" ]; do
    state=$(job_field "$1" "job.get('state', '')")
    if grep -qE "^($2)$" <<<"$state"; then echo $((SECONDS - start)); return 0; fi
    sleep 0.2
  done
  echo "timeout"
  return 1
}
wait_step() {  # JOB STEP
  for _ in $(seq 300); do
    [ "$(job_field "$1" "job.get('latest_telemetry', {}).get('step', '0')")" -ge "$2" ] 2>/dev/null && return 0
    sleep 0.1
  done
  fail "job $1 did not reach step $2"
}
ranks_running() {  # hosts 1..3
  local i n=0
  for i in 1 2 3; do n=$((n + $(host_processes $i --run_rank | wc -l))); done
  echo $n
}
# Worker index (1..3) of RANK of JOB.
rank_host() {  # JOB RANK
  job_field "$1" "[p for p in job['placement'] if int(p.get('rank', 0)) == $2][0]['host'][-1]"
}
spec() {  # NAME STEPS [EXTRA_JSON_FIELDS]
  cat <<JSON
{"name": "$1", "world_size": 2, "device": "cpu",
 "model": {"input_dim": 256, "hidden_dims": [256], "output_dim": 16, "activation": "relu"},
 "loss": "mse", "data": {"synthetic": {"seed": 3}}, "micro_batch_size": 32,
 "accumulation_steps": 2, "steps": $2, "precision": "fp32",
 "optimizer": {"lr": 0.01, "momentum": 0.9}, "seed": 7, "telemetry_every": 10,
 "collective_timeout_s": 5 ${3:-}}
JSON
}
submit() {  # FILE
  ctl submit "$1" 2>&1 | tail -n 1
}
# Seconds from CUT (date +%s.%N) to JOB's end as the coordinator recorded it (its
# finished_unix_ms, this machine's clock), or "unknown": not to when a status poll noticed, as
# on a loaded 2-core machine the polls (trainctl and python3 started each time) lag by seconds.
seconds_to_end() {  # JOB CUT
  local finished_ms
  finished_ms=$(job_field "$1" "job.get('finished_unix_ms', job.get('finishedUnixMs', 0))")
  python3 -c "f = int('${finished_ms:-0}' or 0); print(f'{f / 1000 - $2:.1f}' if f > 0 else 'unknown')"
}

for i in 1 2 3; do start_worker $i; done
wait_alive 3

# ---- 0. A blip of a host's link, well inside the heartbeat timeout: the job goes on ----
# (Heartbeats every fifth of the timeout, each no longer than the interval, the next on a fresh
# connection after one failed: the old connection's retransmissions back off for about as
# long as the blip. Before, blips of half the timeout failed jobs.)
spec blip 100000 >"$WORK/blip.json"
job=$(submit "$WORK/blip.json")
wait_step "$job" 20
victim=$(rank_host "$job" 1)
link_down "$victim"
sleep 1.6
link_up "$victim"
sleep $((HEARTBEAT_S + 2))
state=$(job_field "$job" "job['state']")
echo "0. link of h$victim down for 1.6 s: the job is $state"
[ "$state" = RUNNING ] || fail "0. a 1.6 s blip failed the job: $(job_field "$job" "job.get('error')")"
grep -q "w$victim#[0-9]* ([0-9.]*) lost" "$WORK/coordinator.log" &&
  fail "0. the coordinator declared w$victim lost after a 1.6 s blip"
ctl cancel "$job" >/dev/null
for _ in $(seq 50); do [ "$(ranks_running)" -eq 0 ] && break; sleep 0.2; done

# ---- 1. A host's link pulled mid-job ----
spec link 100000 >"$WORK/link.json"
job=$(submit "$WORK/link.json")
wait_step "$job" 20
victim=$(rank_host "$job" 1)
link_down "$victim"
cut_at=$(date +%s.%N)
state=$(wait_state "$job" FAILED $((HEARTBEAT_S + 20)))
took=$(seconds_to_end "$job" "$cut_at")
echo "1. link of h$victim down: FAILED after ${took} s: $(job_field "$job" "job.get('error')")"
# The coordinator declares the worker lost a heartbeat timeout after its last heartbeat (up to
# one interval before the cut), then fails the job.
[ "$state" != timeout ] &&
  python3 -c "import sys; sys.exit(not $HEARTBEAT_S - 1 <= $took <= $HEARTBEAT_S + 5)" ||
  fail "1. the job did not fail within heartbeat + 5 s (took $took s)"
grep -q "w$victim#.*lost" <<<"$(job_field "$job" "job.get('error')")" ||
  fail "1. the error does not name the lost worker w$victim"
for _ in $(seq 50); do [ "$(ranks_running)" -eq 0 ] && break; sleep 0.2; done
[ "$(ranks_running)" -eq 0 ] ||
  fail "1. ranks left running after the failure: $(for i in 1 2 3; do host_processes $i --run_rank; done)"
link_up "$victim"
wait_alive 3
[ "$(ctl --output=json workers | grep -c "\"w$victim#")" -eq 1 ] ||
  fail "1. the re-registered worker did not replace its lost entry: $(ctl workers)"

# ---- 2. A partition between the job's two hosts ----
spec partition 100000 >"$WORK/partition.json"
job=$(submit "$WORK/partition.json")
wait_step "$job" 20
a=$(rank_host "$job" 0); b=$(rank_host "$job" 1)
partition "$a" "$b"
cut_at=$(date +%s.%N)
state=$(wait_state "$job" FAILED 30)
took=$(seconds_to_end "$job" "$cut_at")
error=$(job_field "$job" "job.get('error')")
echo "2. partition h$a | h$b: FAILED after ${took} s: $error"
# Both ranks time out at collective_timeout_s (5) naming each other while both workers
# heartbeat: the job fails then, not a heartbeat timeout later (before: ~9 s here, 70 s at the
# defaults). 2 s of slack: the two ranks' timeouts start apart and their reports travel.
[ "$state" != timeout ] && python3 -c "import sys; sys.exit(not 4 <= $took <= 5 + 2)" ||
  fail "2. the job did not fail within collective_timeout_s + 2 s (took $took s)"
grep -q "^a partition between rank" <<<"$error" ||
  fail "2. the error does not name the partition first"
grep -q "$NET.1$a" <<<"$error" && grep -q "$NET.1$b" <<<"$error" ||
  fail "2. the error does not name both hosts ($NET.1$a, $NET.1$b)"
ip -n ${P}$a neigh del $NET.1$b dev eth0; ip -n ${P}$b neigh del $NET.1$a dev eth0
for _ in $(seq 50); do [ "$(ranks_running)" -eq 0 ] && break; sleep 0.2; done

# ---- 3-5. Restarts from checkpoints ----
checksum() { job_field "$1" "job['progress'][0].get('parameter_checksum', '')"; }
STEPS=2000
spec reference $STEPS >"$WORK/reference.json"
job=$(submit "$WORK/reference.json")
[ "$(wait_state "$job" 'SUCCEEDED|FAILED' 120)" != timeout ] || fail "reference job hangs"
reference=$(checksum "$job")
echo "reference (uninterrupted) checksum: $reference"
[ -n "$reference" ] || fail "the uninterrupted job has no checksum: $(job_field "$job" "job.get('error')")"

# Restarts a job whose host of RANK is killed once the coordinator has heard of a checkpoint;
# prints the job id, the host and the checkpoint step the coordinator had before the kill
# ("none" when no checkpoint came within 30 s: the caller fails, this runs in a subshell).
restart_case() {  # NAME RANK DIR SHARED
  spec "$1" $STEPS ", \"max_restarts\": 1, \"checkpoint_every\": 200, \"checkpoint_dir\": \"$3\", \"checkpoint_dir_shared\": $4" >"$WORK/$1.json"
  local job host checkpoint=none step
  job=$(submit "$WORK/$1.json")
  for _ in $(seq 300); do
    step=$(job_field "$job" "job.get('latest_checkpoint_step', '0')")
    if [ "$step" -ge 200 ] 2>/dev/null; then checkpoint=$step; break; fi
    sleep 0.1
  done
  host=$(rank_host "$job" $2)
  kill_host "$host"
  echo "$job $host $checkpoint"
}
# The checkpoint step a job's newest attempt resumed from, as its ranks logged it ("resuming
# from DIR/step-00000400.safetensors"; "none" if none did), the first step of that attempt's
# telemetry and the number of attempts in the telemetry (export: the whole history).
resumed_from() {  # JOB
  local step
  step=$( (ctl logs "$1" --rank 0; ctl logs "$1" --rank 1) 2>/dev/null |
         grep -o 'resuming from .*step-[0-9]*\.safetensors' | sort -u | tail -1 |
         sed 's/.*step-0*\([0-9][0-9]*\)\.safetensors/\1/')
  echo "${step:-none}" "$(ctl export "$1" --format=jsonl 2>/dev/null | python3 -c "
import json, sys
records = [json.loads(line) for line in sys.stdin if line.strip()]
attempts = {r.get('attempt', 0) for r in records}
last = max(attempts, default=0)
print(min((int(r['step']) for r in records if r.get('attempt', 0) == last), default=0),
      len(attempts))")"
}
# A restart's bookkeeping: exactly one restart, resumed from the checkpoint the coordinator had
# when the host was killed or a later one (written meanwhile), never from the start, and the
# restart's telemetry begins after it (telemetry is sampled: within the next 200 steps).
check_resumed() {  # CASE JOB CHECKPOINT_AT_KILL
  local restarts from first attempts
  [ "$3" != none ] || { fail "$1. no checkpoint (step >= 200) within 30 s: the host was killed before one"; return; }
  restarts=$(job_field "$2" "job.get('restarts', 0)")
  read -r from first attempts < <(resumed_from "$2")
  echo "$1. checkpoint at the kill: step $3; restarts $restarts; the restart resumed from step $from, its telemetry from step $first ($attempts attempts)"
  [ "$restarts" = 1 ] || fail "$1. restarts $restarts, expected 1"
  [ "$attempts" = 2 ] || fail "$1. $attempts attempts in the telemetry, expected 2"
  if [ "$from" -ge "$3" ] 2>/dev/null && [ $((from % 200)) -eq 0 ]; then
    [ "$first" -gt "$from" ] && [ "$first" -le $((from + 200)) ] ||
      fail "$1. the restart's telemetry begins at step $first, not after its checkpoint $from"
  else
    fail "$1. the restart resumed from '$from', not from a checkpoint >= step $3"
  fi
}

read -r job killed checkpoint < <(restart_case restart-rank1 1 "$WORK/disk/alice/ckpt-r1" false)
holder=$(rank_host "$job" 0)
wait_state "$job" 'SUCCEEDED|FAILED' 120 >/dev/null
echo "3. rank 1's host h$killed killed: $(job_field "$job" "job['state']"), restarts $(job_field "$job" "job.get('restarts', 0)"), failures $(job_field "$job" "job.get('failures')")"
[ "$(job_field "$job" "job['state']")" = SUCCEEDED ] || fail "3. not SUCCEEDED: $(job_field "$job" "job.get('error')")"
check_resumed 3 "$job" "$checkpoint"
[ "$(rank_host "$job" 0)" = "$holder" ] || fail "3. rank 0 of the restart is not on h$holder, which holds the checkpoint"
[ "$(checksum "$job")" = "$reference" ] || fail "3. checksum $(checksum "$job") != uninterrupted $reference"
start_worker "$killed"; wait_alive 3

read -r job killed checkpoint < <(restart_case restart-rank0 0 "$WORK/disk/alice/ckpt-r0" false)
[ "$checkpoint" != none ] || fail "4. no checkpoint (step >= 200) within 30 s before the kill"
wait_state "$job" 'SUCCEEDED|FAILED' 60 >/dev/null
error=$(job_field "$job" "job.get('error')")
echo "4. rank 0's host h$killed killed, private checkpoint_dir: $(job_field "$job" "job['state']"): $error"
[ "$(job_field "$job" "job['state']")" = FAILED ] && grep -q "cannot resume" <<<"$error" ||
  fail "4. expected a clear failure (cannot resume)"
start_worker "$killed"; wait_alive 3

read -r job killed checkpoint < <(restart_case restart-shared 0 "$WORK/shared/alice/ckpt" true)
wait_state "$job" 'SUCCEEDED|FAILED' 120 >/dev/null
echo "5. rank 0's host h$killed killed, shared checkpoint_dir: $(job_field "$job" "job['state']")"
[ "$(job_field "$job" "job['state']")" = SUCCEEDED ] || fail "5. not SUCCEEDED: $(job_field "$job" "job.get('error')")"
check_resumed 5 "$job" "$checkpoint"
[ "$(checksum "$job")" = "$reference" ] || fail "5. checksum $(checksum "$job") != uninterrupted $reference"

# ---- 6. A host renumbered while its worker runs ----
# The worker notices, leaves and registers again under its new address (it kept advertising the
# old one, and every rank placed on it failed to bind).
start_worker "$killed" 2>/dev/null; wait_alive 3
# (The old one first: deleting a primary address takes the secondaries of its subnet along.)
ip -n ${P}3 addr del $NET.13/24 dev eth0
ip -n ${P}3 addr add $NET.63/24 dev eth0
host_of_w3() {
  ctl --output=json workers 2>/dev/null | python3 -c "
import json, sys
workers = json.load(sys.stdin).get('workers', [])
print(' '.join(w['host'] for w in workers
               if w['worker_id'].startswith('w3#') and w.get('state') == 'ALIVE'))"
}
for _ in $(seq 100); do [ "$(host_of_w3)" = "$NET.63" ] && break; sleep 0.2; done
echo "6. h3 renumbered $NET.13 -> $NET.63: w3 advertises $(host_of_w3)"
[ "$(host_of_w3)" = "$NET.63" ] || fail "6. w3 still advertises $(host_of_w3) after its host was renumbered"
spec renumbered 40 >"$WORK/renumbered.json"
sed -i 's/"world_size": 2/"world_size": 3/' "$WORK/renumbered.json"
job=$(submit "$WORK/renumbered.json")
wait_state "$job" 'SUCCEEDED|FAILED' 60 >/dev/null
[ "$(job_field "$job" "job['state']")" = SUCCEEDED ] ||
  fail "6. a job over every worker after the renumbering: $(job_field "$job" "job.get('error')")"

# ---- 7. One-way loss: the coordinator's packets to a job's host are dropped ----
# The worker's calls still arrive (the coordinator never declares it lost), but no answer
# comes back: it self-fences its rank after the timeout. The job's error says so (it blamed a
# crash, or the peer).
spec oneway 100000 >"$WORK/oneway.json"
job=$(submit "$WORK/oneway.json")
wait_step "$job" 20
victim=$(rank_host "$job" 1)
ip -n ${P}0 neigh replace $NET.1$victim lladdr 02:00:00:00:00:77 dev eth0 nud permanent
# Past the fence (the timeout), then the loss ends: the fence is reported with the rank's exit
# while its peer's failure is held back waiting for a cause (as long as the timeout).
sleep $((HEARTBEAT_S + 2))
ip -n ${P}0 neigh del $NET.1$victim dev eth0
took=$(wait_state "$job" FAILED 20)
error=$(job_field "$job" "job.get('error')")
echo "7. one-way loss to h$victim: FAILED after ${took} s: $error"
# The cause comes first: the victim's fence, or (when its last heartbeat reached the
# coordinator no later than its last answer reached the worker: the two timeouts race) the
# victim declared lost; never its peer's broken connection.
grep -qE "^(rank 1 on worker w$victim#[0-9]+ .*self-fenced|worker w$victim#[0-9]+ .* lost)" <<<"$error" ||
  fail "7. the error does not start with the victim's fence or loss: $error"
for _ in $(seq 50); do [ "$(ranks_running)" -eq 0 ] && break; sleep 0.2; done

if [ $failures -ne 0 ]; then
  for f in "$WORK"/*.log; do echo "--- $f"; tail -30 "$f"; done
  echo "$failures failed"
  exit 1
fi
echo "multihost faults: all checks passed"
