#!/usr/bin/env bash
# deploy/slurm against a real Slurm (Debian's slurm-wlm, with munge) on simulated hosts
# (tests/lib/simulated_hosts.sh): munged for all of them (a shared key, as a cluster has),
# slurmctld on h0 with the long-lived coordinator, one slurmd on each of h1, h2 and h3 (its
# own network namespace, address, hostname and NodeName). No slurmdbd: states come from
# `scontrol show job`. Checked:
#   0. both scripts refuse hostile or wrong arguments (exit 2, saying why), outside Slurm and,
#      for one, as a Slurm job (the job FAILS with the message in its output);
#   1. mptrain-workers.sbatch on 3 nodes: one worker per node, registered under the node's
#      name with its own address; the seed example (examples/seed_cpu.json) SUCCEEDS on them;
#   2. a node lost mid-job (its slurmd, slurmstepd, worker and rank killed): the mptrain job
#      FAILS naming that node's worker as lost; the other nodes' workers keep serving, also
#      once Slurm has the node DOWN (--no-kill);
#   3. scancel of the pool while a job runs: the Slurm job ends CANCELLED (not stuck
#      COMPLETING), every worker deregistered ("left: the daemon was asked to stop"), the
#      running job FAILED naming one, and no worker, rank or slurmstepd is left on any host;
#   4. mptrain-job.sbatch on 2 nodes (coordinator on the first): the seed example SUCCEEDS,
#      the Slurm job COMPLETED with exit code 0, nothing left running; scancel of another
#      while its job runs: CANCELLED, both workers stopped, nothing left running;
#   5. the same with a long job and its second node lost: the script exits 1 naming the lost
#      worker, and the Slurm job is FAILED with exit code 1.
# Without slurm-wlm or munge the test skips saying what is missing, except under CI (CI set
# and not empty), where it fails: scripts/setup.sh installs them.
set -uo pipefail
RUNFILES=${TEST_SRCDIR:-$(dirname "$0")/..}/${TEST_WORKSPACE:-mptrain}
BIN_COORDINATOR=$RUNFILES/coordinator/coordinator
BIN_WORKER=$RUNFILES/worker/worker
BIN_TRAINCTL=$RUNFILES/client/trainctl
SPEC=$RUNFILES/examples/seed_cpu.json
POOL=$RUNFILES/deploy/slurm/mptrain-workers.sbatch
ONE_JOB=$RUNFILES/deploy/slurm/mptrain-job.sbatch
export PATH=$PATH:/usr/sbin:/sbin  # slurmctld, slurmd, munged

missing=()
for program in slurmctld slurmd slurmstepd sbatch srun scontrol scancel sinfo; do
  command -v $program >/dev/null || missing+=("$program (Debian package slurm-wlm)")
done
for program in munged mungekey; do
  command -v $program >/dev/null || missing+=("$program (Debian package munge)")
done
command -v openssl >/dev/null || missing+=("openssl (Debian package openssl)")
if [ ${#missing[@]} -ne 0 ]; then
  if [ -n "${CI:-}" ]; then
    echo "FAIL: missing ${missing[*]}; under CI=$CI this test must run, not skip" \
      "(scripts/setup.sh installs them)"
    exit 1
  fi
  echo "SKIPPED: missing ${missing[*]} (scripts/setup.sh installs them)"
  exit 0
fi

N_HOSTS=4
source "$RUNFILES/tests/lib/simulated_hosts.sh"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Slurm's and munge's own files go under a short path: their Unix sockets (munge's, and one
# per job step in slurmd's spool directory) must fit in 108 bytes, which $TEST_TMPDIR may not.
SLURM_DIR=$(mktemp -d /tmp/mpslurm.XXXXXX)
chmod 0755 "$SLURM_DIR"  # munged wants its socket's directory searchable by everyone.
cleanup() {
  hosts_cleanup  # kills every process of the simulated hosts (Slurm's daemons, workers, ranks)
  local munged_pid _
  munged_pid=$(cat "$SLURM_DIR/munged.pid" 2>/dev/null)
  if [ -n "$munged_pid" ] && kill "$munged_pid" 2>/dev/null; then
    for _ in $(seq 50); do kill -0 "$munged_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$SLURM_DIR" "$WORK"
  return 0
}
trap cleanup EXIT
dump_logs() {
  local f
  for f in "$SLURM_DIR"/*.log "$WORK"/*.log "$WORK"/*.out "$WORK"/job*/coordinator.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -n 25 "$f"; }
  done
}
# Gives up (with the daemons' logs) where the rest could only fail on.
abort() { fail "$*"; dump_logs; echo "0 passed, $failures failed"; exit 1; }

# ---- 0. Hostile or wrong arguments, outside Slurm (the scripts' checks come first) ----
mkdir -p "$WORK/bin" "$WORK/pki-partial" "$WORK/exists"
for program in "$BIN_COORDINATOR" "$BIN_WORKER" "$BIN_TRAINCTL" "$RUNFILES/scripts/make_pki.sh"; do
  ln -s "$program" "$WORK/bin/"
done
refused() {  # WHAT EXPECTED_TEXT SCRIPT ARGS...: run under a fake allocation of h1 and h2.
  local what=$1 text=$2 script=$3 out code
  shift 3
  out=$(SLURM_JOB_ID=7 SLURM_JOB_NODELIST='h[1-2]' SLURM_CONF=/nonexistent \
        bash "$script" "$@" 2>&1)
  code=$?
  [ $code -eq 2 ] || fail "0. $what: exit $code, not 2: $out"
  grep -qF -- "$text" <<<"$out" || fail "0. $what: the refusal does not say '$text': $out"
}
out=$(env -u SLURM_JOB_ID bash "$POOL" --coordinator=h0:1 --insecure 2>&1)
[ $? -eq 2 ] && grep -q "not inside a Slurm job" <<<"$out" ||
  fail "0. the pool script run outside Slurm: $out"
ROOTS=(--data_root="$WORK" --output_root="$WORK")
refused "a command in the address" "is not HOST:PORT" "$POOL" \
  --coordinator='h0;touch /tmp/owned:1' --insecure -- "${ROOTS[@]}"
refused "port 70000" "a port 1..65535" "$POOL" --coordinator=h0:70000 --insecure -- "${ROOTS[@]}"
refused "no credentials" "--credentials DIR is required" "$POOL" --coordinator=h0:1 -- "${ROOTS[@]}"
refused "--name in the worker flags" "--name is set by this script" "$POOL" \
  --coordinator=h0:1 --insecure --bin_dir="$WORK/bin" -- "${ROOTS[@]}" --name=evil
refused "a worker flag's value apart" "is not --flag or --flag=value" "$POOL" \
  --coordinator=h0:1 --insecure --bin_dir="$WORK/bin" -- --data_root "$WORK" --output_root="$WORK"
refused "no --output_root" "need --data_root=DIR and --output_root=DIR" "$POOL" \
  --coordinator=h0:1 --insecure --bin_dir="$WORK/bin" -- --data_root="$WORK"
refused "an unknown option" "unknown option '--slots=1' (worker flags go after --)" "$POOL" \
  --coordinator=h0:1 --insecure --slots=1
refused "a missing spec" "is not a readable file" "$ONE_JOB" --spec="$WORK/none.json" \
  --bin_dir="$WORK/bin" -- "${ROOTS[@]}"
refused "a coordinator flag the script sets" "--coordinator_arg --listen: set by this script" \
  "$ONE_JOB" --spec="$SPEC" --bin_dir="$WORK/bin" --coordinator_arg=--listen=0.0.0.0:1 -- "${ROOTS[@]}"
refused "an existing job directory" "--job_dir $WORK/exists exists already" "$ONE_JOB" \
  --spec="$SPEC" --bin_dir="$WORK/bin" --job_dir="$WORK/exists" -- "${ROOTS[@]}"
refused "a bad timeout" "--start_timeout_s '1e9' is not" "$ONE_JOB" --spec="$SPEC" \
  --bin_dir="$WORK/bin" --start_timeout_s=1e9 -- "${ROOTS[@]}"
refused "no bin_dir" "is not an executable file" "$ONE_JOB" --spec="$SPEC" \
  --bin_dir="$WORK/nothing" -- "${ROOTS[@]}"
[ ! -e /tmp/owned ] || fail "0. the address's command ran"

# ---- The cluster ----
hosts_up
M=$SLURM_DIR
mungekey --create --keyfile="$M/munge.key" >/dev/null 2>&1 || abort "mungekey --create failed"
munged --socket="$M/munge.socket" --key-file="$M/munge.key" --pid-file="$M/munged.pid" \
  --log-file="$M/munged.log" --seed-file="$M/munged.seed" ||
  abort "munged did not start: $(cat "$M/munged.log" 2>/dev/null)"
mkdir -p "$M/ctld" "$M/spool-h1" "$M/spool-h2" "$M/spool-h3"
export SLURM_CONF=$M/slurm.conf
# No cgroups (the simulated hosts share one kernel): processes tracked by parentage, no task
# binding. ReturnToService=2: a node that comes back is usable again. MinJobAge: ended jobs
# stay visible to scontrol for the whole test.
cat >"$SLURM_CONF" <<CONF
ClusterName=mptest$ID
SlurmctldHost=h0($NET.10)
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$M/munge.socket
CredType=cred/munge
StateSaveLocation=$M/ctld
SlurmdSpoolDir=$M/spool-%n
SlurmctldPidFile=$M/slurmctld.pid
SlurmdPidFile=$M/slurmd-%n.pid
SlurmctldLogFile=$M/slurmctld.log
SlurmdLogFile=$M/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=3600
NodeName=h1 NodeAddr=$NET.11 CPUs=1 State=UNKNOWN
NodeName=h2 NodeAddr=$NET.12 CPUs=1 State=UNKNOWN
NodeName=h3 NodeAddr=$NET.13 CPUs=1 State=UNKNOWN
PartitionName=test Nodes=h1,h2,h3 Default=YES MaxTime=INFINITE State=UP
CONF
# slurmd initializes a cgroup plugin even with none in use; ip netns exec remounts /sys, so
# each slurmd gets an empty tmpfs at /sys/fs/cgroup in a mount namespace of its own.
printf 'CgroupPlugin=cgroup/v1\nCgroupAutomount=yes\n' >"$M/cgroup.conf"
on_host 0 slurmctld -D -f "$SLURM_CONF" >"$WORK/slurmctld.out" 2>&1 &
for i in 1 2 3; do
  ip netns exec ${P}$i unshare --uts --mount --propagation private sh -c \
    "mount -t tmpfs cgroup /sys/fs/cgroup && hostname h$i && exec slurmd -D -N h$i -f '$SLURM_CONF'" \
    >"$WORK/slurmd$i.out" 2>&1 &
done
slurm() { on_host 0 "$@"; }  # Slurm's commands, from h0 (the submit host).
idle=0
for _ in $(seq 150); do
  idle=$(slurm sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$')
  [ "$idle" -eq 3 ] && break
  sleep 0.2
done
[ "$idle" -eq 3 ] || abort "only $idle of 3 nodes idle after 30 s: $(slurm sinfo -N 2>&1)"
echo "slurm: $(slurm sinfo --version) on 3 nodes: $(slurm sinfo -h -N -o '%N:%T' | tr '\n' ' ')"

# JobState of a Slurm job (scontrol: there is no slurmdbd).
slurm_state() { slurm scontrol -o show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
slurm_field() { slurm scontrol -o show job "$1" 2>/dev/null | grep -o " $2=[^ ]*" | cut -d= -f2; }
wait_slurm_state() {  # JOB STATES(regex) TIMEOUT_S: waits; prints the state it ended in.
  local deadline=$((SECONDS + $3)) state=""
  while [ $SECONDS -lt $deadline ]; do
    state=$(slurm_state "$1")
    if grep -qxE "$2" <<<"$state"; then echo "$state"; return 0; fi
    sleep 0.2
  done
  echo "${state:-unknown}"
  return 1
}
# sbatch --parsable prints JOBID or JOBID;CLUSTER.
submit_batch() {  # SBATCH ARGS...
  local out
  out=$(slurm sbatch --parsable "$@" 2>&1) || { echo "sbatch failed: $out" >&2; return 1; }
  out=${out%%;*}
  [[ $out =~ ^[0-9]+$ ]] || { echo "sbatch printed no job id: $out" >&2; return 1; }
  echo "$out"
}
# Host processes (on hosts 1..3) whose command line contains PATTERN.
leftovers() {  # PATTERN
  local i
  for i in 1 2 3; do host_processes $i "$1"; done
}

# ---- 0b. A wrong argument in a real Slurm job: the job FAILS, the reason in its output ----
mkdir -p "$WORK/pki"
bash "$RUNFILES/scripts/make_pki.sh" --worker h1 --worker h2 --worker h3 "$WORK/pki" $NET.10 >/dev/null
cp "$WORK/pki/ca.pem" "$WORK/pki/h1."* "$WORK/pki-partial/"
bad=$(submit_batch -N2 -o "$WORK/bad.out" "$POOL" --coordinator=$NET.10:50051 \
  --credentials="$WORK/pki-partial" --bin_dir="$WORK/bin" -- "${ROOTS[@]}") ||
  abort "0. sbatch of the pool failed"
state=$(wait_slurm_state "$bad" FAILED 30) || fail "0. a pool without h2's credentials: $state"
[ "$(slurm_field "$bad" ExitCode)" = "2:0" ] ||
  fail "0. a pool without h2's credentials exited $(slurm_field "$bad" ExitCode), not 2:0"
grep -q "lacks h2.pem h2.key h2.token" "$WORK/bad.out" ||
  fail "0. the failed job's output does not name h2's files: $(cat "$WORK/bad.out")"
echo "0. wrong arguments refused (a Slurm job with them: $state, $(tail -n 1 "$WORK/bad.out"))"

# ---- 1. The worker pool on every node, a long-lived coordinator on h0 ----
HEARTBEAT_S=4
COORDINATOR=$NET.10:50051
TLS=(--tls_ca="$WORK/pki/ca.pem" --tls_cert="$WORK/pki/client.pem" --tls_key="$WORK/pki/client.key")
on_host 0 "$BIN_COORDINATOR" --listen=$COORDINATOR --state_dir="$WORK/state" \
  --heartbeat_timeout=$HEARTBEAT_S --tls_cert="$WORK/pki/server.pem" \
  --tls_key="$WORK/pki/server.key" --tls_client_ca="$WORK/pki/ca.pem" \
  --token_file="$WORK/pki/tokens" >"$WORK/coordinator.log" 2>&1 &
ctl() { on_host 0 "$BIN_TRAINCTL" --coordinator=$COORDINATOR "${TLS[@]}" \
          --token_file="$WORK/pki/alice.token" "$@"; }
job_field() {  # JOB EXPRESSION (Python, over `job`)
  ctl --output=json status "$1" 2>/dev/null |
    python3 -c "import json, sys; job = json.load(sys.stdin); print($2)" 2>/dev/null
}
alive_names() {  # the names of the ALIVE workers, sorted, on one line
  ctl --output=json workers 2>/dev/null | python3 -c '
import json, sys
workers = json.load(sys.stdin).get("workers", [])
print(" ".join(sorted(w["worker_id"].split("#")[0] for w in workers if w.get("state") == "ALIVE")))' 2>/dev/null
}
wait_alive() {  # NAMES TIMEOUT_S
  local deadline=$((SECONDS + $2))
  while [ $SECONDS -lt $deadline ]; do [ "$(alive_names)" = "$1" ] && return 0; sleep 0.2; done
  return 1
}
wait_job() {  # JOB STATES(regex) TIMEOUT_S: prints the seconds it took, or "timeout".
  local start=$SECONDS state
  while [ $((SECONDS - start)) -lt "$3" ]; do
    state=$(job_field "$1" "job.get('state', '')")
    if grep -qxE "$2" <<<"$state"; then echo $((SECONDS - start)); return 0; fi
    sleep 0.2
  done
  echo timeout
  return 1
}
wait_step() {  # JOB STEP TIMEOUT_S
  local deadline=$((SECONDS + $3))
  while [ $SECONDS -lt $deadline ]; do
    [ "$(job_field "$1" "job.get('latest_telemetry', {}).get('step', '0')")" -ge "$2" ] \
      2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}
# The node (worker name) of each rank of JOB, rank order.
rank_nodes() { job_field "$1" "' '.join(p['worker_id'].split('#')[0] for p in sorted(job['placement'], key=lambda p: p.get('rank', 0)))"; }
sed -e 's/"steps": 5,/"steps": 1000000,/' -e 's/"telemetry_every": 1$/"telemetry_every": 20/' \
  "$SPEC" >"$WORK/long.json"
grep -q '"steps": 1000000' "$WORK/long.json" && grep -q '"telemetry_every": 20' "$WORK/long.json" ||
  abort "could not lengthen the seed example"
long_spec() {  # NAME: the long job under its own name
  sed "s/\"name\": \"seed-cpu\"/\"name\": \"$1\"/" "$WORK/long.json" >"$WORK/$1.json"
  echo "$WORK/$1.json"
}

pool=$(submit_batch -N3 -o "$WORK/pool.out" "$POOL" --coordinator=$COORDINATOR \
  --credentials="$WORK/pki" --bin_dir="$WORK/bin" -- --slots=1 "${ROOTS[@]}") ||
  abort "1. sbatch of the pool failed"
state=$(wait_slurm_state "$pool" RUNNING 30) || abort "1. the pool job is $state, not RUNNING"
wait_alive "h1 h2 h3" 30 ||
  abort "1. the pool's workers did not all register: alive: $(alive_names); $(ctl workers 2>&1)"
workers=$(ctl workers)
echo "$workers"
for i in 1 2 3; do
  grep -q "^h$i#.* $NET.1$i " <<<"$workers" || fail "1. node h$i's worker does not advertise $NET.1$i"
done
pool_batch_host=$(slurm_field "$pool" BatchHost)
submitted=$(ctl submit "$SPEC" --wait 2>&1)
code=$?
echo "$submitted" | tail -n 3
[ $code -eq 0 ] || fail "1. the seed example on the pool did not succeed (exit $code)"
seed=$(echo "$submitted" | tail -n 1)
echo "1. pool job $pool on h1 h2 h3 (batch host $pool_batch_host); seed example $seed on" \
  "$(rank_nodes "$seed"): $(job_field "$seed" "job['state']")"

# ---- 2. A node lost mid-job ----
loss=$(ctl submit "$(long_spec pool-loss)" | tail -n 1)
wait_job "$loss" RUNNING 30 >/dev/null && wait_step "$loss" 3 30 ||
  abort "2. the long job did not run: $(job_field "$loss" "job['state'], job['error']")"
victim=""
for node in $(rank_nodes "$loss"); do [ "$node" != "$pool_batch_host" ] && victim=$node; done
[ -n "$victim" ] || abort "2. no rank of $loss away from the batch host: $(rank_nodes "$loss")"
kill_host "${victim#h}"  # slurmd, slurmstepd, the worker and its rank: the node is gone.
took=$(wait_job "$loss" FAILED $((HEARTBEAT_S + 10)))
error=$(job_field "$loss" "job['error']")
echo "2. $victim lost: the job FAILED after ${took} s: $error"
[ "$took" != timeout ] || fail "2. the job did not fail within the heartbeat timeout + 10 s"
grep -qE "worker $victim#[0-9]+ \([0-9.]+\) lost" <<<"$error" ||
  fail "2. the error does not name $victim's worker as lost: $error"
survivors=$(for i in 1 2 3; do [ "h$i" != "$victim" ] && echo "h$i"; done | tr '\n' ' ')
survivors=${survivors% }
wait_alive "$survivors" 5 || fail "2. the other workers are not all alive: $(alive_names)"
# Slurm finds the node dead (here at once, as its SlurmdTimeout would): the pool keeps going.
slurm scontrol update NodeName="$victim" State=DOWN Reason="slurm_test: node killed" ||
  fail "2. scontrol could not set $victim DOWN"
state=$(wait_slurm_state "$pool" RUNNING 5) || fail "2. the pool job is $state once $victim is DOWN"
wait_alive "$survivors" 5 || fail "2. with $victim DOWN the other workers are gone: $(alive_names)"

# ---- 3. scancel of the pool, with a job running on it ----
running=$(ctl submit "$(long_spec pool-cancel)" | tail -n 1)
wait_job "$running" RUNNING 30 >/dev/null && wait_step "$running" 2 30 ||
  fail "3. the job on the survivors did not run: $(job_field "$running" "job['state'], job['error']")"
slurm scancel "$pool" || fail "3. scancel $pool failed"
state=$(wait_slurm_state "$pool" CANCELLED 45) ||
  fail "3. the pool job is $state 45 s after scancel, not CANCELLED"
echo "3. scancel $pool: $state"
for node in $survivors; do
  grep -qE "worker $node#[0-9]+ \([0-9.]+\) left: the daemon was asked to stop" "$WORK/coordinator.log" ||
    fail "3. $node's worker did not deregister"
  grep -q "worker $node.*stopping: [0-9]* rank(s) running" "$WORK/pool.out" ||
    fail "3. $node's worker did not log its stop"
done
[ -z "$(alive_names)" ] || fail "3. workers still alive after scancel: $(alive_names)"
took=$(wait_job "$running" FAILED 5) || fail "3. the job on the pool is not FAILED after scancel"
error=$(job_field "$running" "job['error']")
echo "3. the job running on the pool: $(job_field "$running" "job['state']"): $error"
grep -qE "worker h[0-9]#[0-9]+ \([0-9.]+\) left: the daemon was asked to stop" <<<"$error" ||
  fail "3. the job's error does not name a deregistered worker: $error"
left=$(leftovers "worker"; leftovers slurmstepd)
[ -z "$left" ] || fail "3. processes left after scancel: $(ps -o pid,args -p $(echo $left) 2>&1)"
if grep -q "Exited with exit code" "$WORK/pool.out"; then
  fail "3. a worker exited non-zero: $(grep "Exited with exit code" "$WORK/pool.out")"
fi

# ---- 4. The torchrun pattern: coordinator, workers and the job in one Slurm job ----
one=$(submit_batch -N2 --exclude="$victim" -o "$WORK/one.out" "$ONE_JOB" --spec="$SPEC" \
  --bin_dir="$WORK/bin" --job_dir="$WORK/job4" --coordinator_arg=--heartbeat_timeout=$HEARTBEAT_S \
  -- --slots=1 "${ROOTS[@]}") || abort "4. sbatch of mptrain-job.sbatch failed"
state=$(wait_slurm_state "$one" "COMPLETED|FAILED|CANCELLED|TIMEOUT" 90)
code=$(slurm_field "$one" ExitCode)
echo "4. mptrain-job.sbatch $one: $state, exit code $code; $(grep -E 'SUCCEEDED|ended' "$WORK/one.out" | tail -n 1)"
[ "$state" = COMPLETED ] && [ "$code" = "0:0" ] ||
  fail "4. the one-job script ended $state with exit code $code: $(tail -n 15 "$WORK/one.out")"
grep -qE "^ *(state|STATE)?.*SUCCEEDED" "$WORK/one.out" || fail "4. its output shows no SUCCEEDED job"
left=$(leftovers "worker"; leftovers "coordinator"; leftovers trainctl; leftovers slurmstepd)
[ -z "$left" ] || fail "4. processes left after the job: $(ps -o pid,args -p $(echo $left) 2>&1)"

# ---- 4b. scancel of it while its job runs: CANCELLED, nothing left ----
one=$(submit_batch -N2 --exclude="$victim" -o "$WORK/one-cancel.out" "$ONE_JOB" \
  --spec="$(long_spec one-cancel)" --bin_dir="$WORK/bin" --job_dir="$WORK/job4b" \
  -- --slots=1 "${ROOTS[@]}") || abort "4b. sbatch of mptrain-job.sbatch failed"
deadline=$((SECONDS + 40))
until grep -q "^mptrain-job: submitted " "$WORK/one-cancel.out" 2>/dev/null || [ $SECONDS -ge $deadline ]; do
  sleep 0.2
done
grep -q "^mptrain-job: submitted " "$WORK/one-cancel.out" ||
  abort "4b. the job was not submitted within 40 s: $(tail -n 10 "$WORK/one-cancel.out")"
slurm scancel "$one" || fail "4b. scancel $one failed"
state=$(wait_slurm_state "$one" CANCELLED 45) ||
  fail "4b. mptrain-job.sbatch $one is $state 45 s after scancel, not CANCELLED"
# Its trap stops the workers and the coordinator before its last line: CANCELLED comes first.
# Its cleanup is bounded to ~26 s, under Slurm's KillWait (30 s), after which Slurm kills it.
# The trap is best effort: Slurm signals every process of the job at once, and in a loaded CI
# run the batch shell was gone 13 ms after the cancel ("[4.batch] done with job") before its
# trap wrote a line. What must hold either way is checked below: the workers stopped their
# ranks and nothing is left running.
deadline=$((SECONDS + 40))
until grep -q "^mptrain-job: exit 143$" "$WORK/one-cancel.out" || [ $SECONDS -ge $deadline ]; do
  sleep 0.2
done
if ! grep -q "^mptrain-job: exit 143$" "$WORK/one-cancel.out"; then
  grep -q "signalled: stopping" "$WORK/one-cancel.out" &&
    fail "4b. the script's trap ran but it did not end within 40 s: $(grep "^mptrain-job: " "$WORK/one-cancel.out" | tail -n 6)"
  echo "4b. note: the batch shell ended before its trap wrote a line (Slurm signals every process at once)"
fi
# Slurm signals every process of the job at once, the coordinator too (it is in the batch
# step): the workers stop their ranks, and the job's record stays in its --job_dir/state.
[ "$(grep -c "\[worker h[0-9]\] stopping: [0-9]* rank(s) running" "$WORK/one-cancel.out")" -eq 2 ] ||
  fail "4b. the two workers did not both stop: $(grep "\[worker h" "$WORK/one-cancel.out" | tail -n 5)"
left=$(leftovers "worker"; leftovers "coordinator"; leftovers trainctl; leftovers slurmstepd)
[ -z "$left" ] || fail "4b. processes left after scancel: $(ps -o pid,args -p $(echo $left) 2>&1)"
echo "4b. scancel of mptrain-job.sbatch $one: $state, its workers stopped, nothing left running"

# ---- 5. The same, a long job, and its second node lost ----
one=$(submit_batch -N2 --exclude="$victim" -o "$WORK/one-loss.out" "$ONE_JOB" \
  --spec="$(long_spec one-loss)" --bin_dir="$WORK/bin" --job_dir="$WORK/job5" \
  --coordinator_arg=--heartbeat_timeout=$HEARTBEAT_S -- --slots=1 "${ROOTS[@]}") ||
  abort "5. sbatch of mptrain-job.sbatch failed"
state=$(wait_slurm_state "$one" RUNNING 30) || abort "5. the job is $state, not RUNNING"
deadline=$((SECONDS + 30))
until [ -s "$WORK/job5/coordinator" ] || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
[ -s "$WORK/job5/coordinator" ] || abort "5. the job's coordinator wrote no address"
job_ctl() {  # trainctl towards the job's own coordinator, with its admin's credentials
  local p=$WORK/job5/pki
  on_host 0 "$BIN_TRAINCTL" --coordinator="$(cat "$WORK/job5/coordinator")" --tls_ca="$p/ca.pem" \
    --tls_cert="$p/client.pem" --tls_key="$p/client.key" --token_file="$p/admin.token" "$@"
}
inner=""
deadline=$((SECONDS + 40))
while [ $SECONDS -lt $deadline ]; do
  inner=$(job_ctl --output=json list 2>/dev/null | python3 -c '
import json, sys
jobs = [j for j in json.load(sys.stdin).get("jobs", []) if j.get("state") == "RUNNING"
        and int(j.get("latest_telemetry", {}).get("step", 0)) >= 2]
print(jobs[0]["job_id"] if jobs else "")' 2>/dev/null)
  [ -n "$inner" ] && break
  sleep 0.3
done
[ -n "$inner" ] || abort "5. the job's mptrain job did not run: $(tail -n 20 "$WORK/one-loss.out")"
batch_host=$(slurm_field "$one" BatchHost)
lost=""
for node in $(job_ctl --output=json status "$inner" | python3 -c '
import json, sys
print(" ".join(p["worker_id"].split("#")[0] for p in json.load(sys.stdin)["placement"]))'); do
  [ "$node" != "$batch_host" ] && lost=$node
done
[ -n "$lost" ] || abort "5. no rank away from the batch host $batch_host"
kill_host "${lost#h}"
# The script ends (its last line: "mptrain-job: exit N"); the Slurm job is COMPLETING until
# Slurm has the lost node DOWN (its SlurmdTimeout; here the test's scontrol).
deadline=$((SECONDS + HEARTBEAT_S + 40))
until grep -q "^mptrain-job: exit [0-9]*$" "$WORK/one-loss.out" || [ $SECONDS -ge $deadline ]; do
  sleep 0.2
done
grep -q "^mptrain-job: exit 1$" "$WORK/one-loss.out" ||
  fail "5. the script did not exit 1 within $((HEARTBEAT_S + 40)) s of the node loss: $(tail -n 5 "$WORK/one-loss.out")"
echo "5. Slurm job $one once the script ended: $(slurm_state "$one")"
slurm scontrol update NodeName="$lost" State=DOWN Reason="slurm_test: node killed" ||
  fail "5. scontrol could not set $lost DOWN"
state=$(wait_slurm_state "$one" "COMPLETED|FAILED|CANCELLED|TIMEOUT" 40)
code=$(slurm_field "$one" ExitCode)
result=$(grep "mptrain-job: .* ended" "$WORK/one-loss.out")
echo "5. $lost lost: Slurm job $one $state, exit code $code; $result"
[ "$state" = FAILED ] && [ "$code" = "1:0" ] ||
  fail "5. the Slurm job ended $state with exit code $code, not FAILED 1:0: $(tail -n 15 "$WORK/one-loss.out")"
grep -qE "ended FAILED: .*worker $lost#[0-9]+ \([0-9.]+\) lost" <<<"$result" ||
  fail "5. the script's result does not name $lost's worker as lost: $result"
left=$(leftovers "worker"; leftovers "coordinator"; leftovers trainctl; leftovers slurmstepd)
[ -z "$left" ] || fail "5. processes left after the job: $(ps -o pid,args -p $(echo $left) 2>&1)"

if [ $failures -ne 0 ]; then
  dump_logs
  echo "0 passed, $failures failed"
  exit 1
fi
echo "slurm: all checks passed"
