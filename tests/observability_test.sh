#!/usr/bin/env bash
# Seeing training (issue: metrics, dashboard, export), end to end on one machine:
#   1. /metrics scraped while a CPU job runs passes `promtool check metrics` and shows the
#      job's step and loss;
#   2. the dashboard's pages load in headless Chromium (screenshots kept as test outputs), and
#      the job page's loss curve has as many points as the job has telemetry records; an fp16
#      job with skipped steps keeps its gradient-norm curve and a readable loss-scale axis; an
#      fp32 job has no loss-scale chart; the compare page overlays two jobs; a running job's
#      rank shows on the workers page, and its cancel needs the CSRF token;
#   3. `trainctl export` (csv and jsonl) holds every step's record and round-trips each one
#      that `trainctl watch --output=json` streamed live;
#   4. with TLS and tokens: HTTPS, 401 without a token, 403 for a worker's token, 200 for a
#      user's;
#   5. and two users: bob's token shows nothing of alice's job, hers and a viewer's do.
# Beside the CPU worker, a GPU worker's heartbeats (tests/fake_gpu_worker.py: one GPU read, one
# unavailable; this machine has none) show as gauges in 1 (promtool included), on the workers
# page in 2 (bars, "n/a") and in `trainctl workers`, as the CPU worker's real memory reading.
# promtool and chromium come from Debian (scripts/setup.sh installs them). Without them the test
# says SKIPPED for that part and still runs the rest, except under CI (the environment variable
# CI set and not empty; .bazelrc passes it to tests with --test_env=CI): there a missing tool
# fails the test, since CI ran setup.sh.
set -uo pipefail
RUNFILES=${TEST_SRCDIR:-$(dirname "$0")/..}/${TEST_WORKSPACE:-mptrain}
COORDINATOR=$RUNFILES/coordinator/coordinator
WORKER=$RUNFILES/worker/worker
TRAINCTL=$RUNFILES/client/trainctl
OUT=${TEST_UNDECLARED_OUTPUTS_DIR:-${TEST_TMPDIR:-/tmp}/observability-out}
CLUSTER_DIR=${TEST_TMPDIR:-/tmp}/observability.$$
mkdir -p "$OUT" "$CLUSTER_DIR"
source "$RUNFILES/scripts/lib/local_cluster.sh"
trap stop_cluster EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
missing() {  # PART TOOL PACKAGE
  if [ -n "${CI:-}" ]; then
    fail "$1: $2 is not installed (Debian package $3, which scripts/setup.sh installs), and CI=$CI"
  else
    echo "SKIPPED ($1): $2 is not installed (Debian package $3)"
  fi
}

start_coordinator --http_listen=127.0.0.1:0 --http_port_file="$CLUSTER_DIR/http_port" || exit 1
for _ in $(seq 100); do [ -s "$CLUSTER_DIR/http_port" ] && break; sleep 0.05; done
HTTP=http://127.0.0.1:$(cat "$CLUSTER_DIR/http_port")
start_worker w1 "" --device=cpu --slots=2
wait_for_workers 1 || exit 1
ctl() { "$TRAINCTL" --coordinator="$ADDRESS" "$@"; }
# The GPU worker's heartbeats, with Debian's python3 and its grpcio (scripts/setup.sh).
gpu_worker=
if /usr/bin/python3 -c "import grpc" 2>/dev/null; then
  /usr/bin/python3 "$RUNFILES/tests/fake_gpu_worker.py" "$RUNFILES/python" "$ADDRESS" g1 \
    "$CLUSTER_DIR/g1.ready" >"$CLUSTER_DIR/g1.log" 2>&1 &
  CLUSTER_PIDS+=($!)
  for _ in $(seq 200); do [ -s "$CLUSTER_DIR/g1.ready" ] && break; sleep 0.05; done
  if [ -s "$CLUSTER_DIR/g1.ready" ]; then
    gpu_worker=g1
    cat "$CLUSTER_DIR/g1.log"
  else
    fail "the fake GPU worker did not start: $(cat "$CLUSTER_DIR/g1.log")"
  fi
else
  missing "the GPU usage parts" "python3's grpc module" python3-grpcio
fi

cat >"$CLUSTER_DIR/job.json" <<JSON
{"name": "observed-job", "world_size": 2, "device": "cpu",
 "model": {"input_dim": 64, "hidden_dims": [128], "output_dim": 8, "activation": "relu"},
 "loss": "mse", "data": {"synthetic": {"seed": 1}}, "micro_batch_size": 16,
 "accumulation_steps": 2, "steps": 300, "precision": "fp32",
 "optimizer": {"lr": 0.01}, "seed": 3, "telemetry_every": 1}
JSON
# w1's first usage reading rides a heartbeat after its registration: waited for before the job
# starts, so that the scrape below is taken while the job runs (waiting for both together let a
# loaded machine finish the job first: "no running job counted").
for _ in $(seq 200); do
  curl -sf "$HTTP/metrics" >"$CLUSTER_DIR/metrics.txt" &&
    grep -q '^mptrain_worker_memory_available_bytes{worker="w1"' "$CLUSTER_DIR/metrics.txt" && break
  sleep 0.05
done
job=$(ctl submit "$CLUSTER_DIR/job.json" | tail -n 1)
ctl --output=json watch "$job" >"$CLUSTER_DIR/watch.jsonl" &
watch_pid=$!

# 1. Metrics while it runs.
for _ in $(seq 200); do
  curl -sf "$HTTP/metrics" >"$CLUSTER_DIR/metrics.txt" &&
    grep -q "^mptrain_job_step{job_id=\"$job\"" "$CLUSTER_DIR/metrics.txt" && break
  sleep 0.05
done
cp "$CLUSTER_DIR/metrics.txt" "$OUT/metrics.txt"
grep -q "^mptrain_job_step{job_id=\"$job\",name=\"observed-job\"} [0-9]" "$CLUSTER_DIR/metrics.txt" ||
  fail "1. /metrics has no step for the running job"
grep -q '^mptrain_jobs{state="running"} 1$' "$CLUSTER_DIR/metrics.txt" || fail "1. no running job counted"
grep -q '^# TYPE mptrain_job_skipped_steps_total counter$' "$CLUSTER_DIR/metrics.txt" &&
  grep -q "^mptrain_job_skipped_steps_total{job_id=\"$job\",name=\"observed-job\"} [0-9]" "$CLUSTER_DIR/metrics.txt" ||
  fail "1. no skipped-steps counter for the running job"
# Usage: the CPU worker's own reading of this machine; the GPU worker's read GPU, not the other.
grep -q '^mptrain_worker_memory_available_bytes{worker="w1",host="[^"]*"} [0-9]' "$CLUSTER_DIR/metrics.txt" &&
  grep -q '^mptrain_worker_memory_total_bytes{worker="w1",host="[^"]*"} [1-9]' "$CLUSTER_DIR/metrics.txt" ||
  fail "1. /metrics has no memory reading of the CPU worker w1"
if [ -n "$gpu_worker" ]; then
  g1='{worker="g1",host="127.0.0.1",gpu="0"}'
  grep -qF "mptrain_worker_gpu_utilization_ratio$g1 0.75" "$CLUSTER_DIR/metrics.txt" &&
    grep -qF "mptrain_worker_gpu_memory_used_bytes$g1 3.221225472e+10" "$CLUSTER_DIR/metrics.txt" &&
    grep -qF "mptrain_worker_gpu_memory_total_bytes$g1 8.589934592e+10" "$CLUSTER_DIR/metrics.txt" ||
    fail "1. /metrics lacks g1's GPU 0: $(grep '^mptrain_worker_gpu' "$CLUSTER_DIR/metrics.txt")"
  grep -q 'gpu="1"' "$CLUSTER_DIR/metrics.txt" && fail "1. g1's unavailable GPU 1 has series"
  echo "1. usage gauges: $(grep -c '^mptrain_worker_\(gpu_\|memory_\|usage_\)' "$CLUSTER_DIR/metrics.txt") samples (w1's memory, g1's GPU 0)"
fi
# The same in `trainctl workers` (the table's columns, the JSON's fields).
listing=$(ctl workers)
grep -q '^w1#[0-9]* .* ALIVE  *[0-9.]*/[0-9.]* GiB  *-  *-$' <<<"$listing" ||
  fail "1. trainctl workers does not show w1's memory available: $listing"
if [ -n "$gpu_worker" ]; then
  grep -q '^g1#[0-9]* .* ALIVE  *40.0/64.0 GiB  *Fake GPU, Fake GPU  *0: 30.0/80.0 GiB 75%, 1: n/a$' <<<"$listing" ||
    fail "1. trainctl workers does not show g1's usage: $listing"
  grep -q '"utilization_percent": 75' <<<"$(ctl --output=json workers)" ||
    fail "1. trainctl workers --output=json has no utilization"
fi
if command -v promtool >/dev/null; then
  promtool check metrics <"$CLUSTER_DIR/metrics.txt" >"$CLUSTER_DIR/promtool.txt" 2>&1 ||
    fail "1. promtool check metrics: $(cat "$CLUSTER_DIR/promtool.txt")"
  echo "1. promtool check metrics: OK ($(grep -c '^mptrain' "$CLUSTER_DIR/metrics.txt") samples)"
else
  missing "part 1" promtool prometheus
fi

wait $watch_pid
[ "$(ctl --output=json status "$job" | grep -c SUCCEEDED)" -ge 1 ] || fail "the job did not succeed"
curl -sf "$HTTP/metrics" >"$CLUSTER_DIR/metrics_after.txt"
grep -q '^mptrain_rpcs_total{service="mptrain.v1.WorkerControl",method="ReportTelemetry",code="OK"} [1-9]' \
  "$CLUSTER_DIR/metrics_after.txt" || fail "1. no RPC counts"
grep -q '^mptrain_jobs_ended_total{state="succeeded"} 1$' "$CLUSTER_DIR/metrics_after.txt" ||
  fail "1. the ended job is not counted"
# An ended job's final values stay scrapable for a while (a short job is seen at least once).
grep -q "^mptrain_job_step{job_id=\"$job\",name=\"observed-job\"} 300$" "$CLUSTER_DIR/metrics_after.txt" ||
  fail "1. the ended job's final step is gone from /metrics"
grep -q "^mptrain_job_ended_timestamp_seconds{job_id=\"$job\"" "$CLUSTER_DIR/metrics_after.txt" ||
  fail "1. no end time for the ended job"
grep -q '^process_resident_memory_bytes [1-9]' "$CLUSTER_DIR/metrics_after.txt" &&
  grep -q '^mptrain_build_info{version="' "$CLUSTER_DIR/metrics_after.txt" ||
  fail "1. no process_* or build_info metrics"
# The version a scrape shows is the one --version prints (git describe at build), not "unknown".
version=$("$COORDINATOR" --version | awk 'NR == 1 {print $2}')
[ -n "$version" ] && [ "$version" != unknown ] || fail "1. coordinator --version names no version"
grep -q "^mptrain_build_info{version=\"$version\",assertions=\"\(on\|off\)\"} 1$" \
  "$CLUSTER_DIR/metrics_after.txt" ||
  fail "1. mptrain_build_info is not version $version: $(grep '^mptrain_build_info' "$CLUSTER_DIR/metrics_after.txt")"
if command -v promtool >/dev/null; then
  promtool check metrics <"$CLUSTER_DIR/metrics_after.txt" >"$CLUSTER_DIR/promtool_after.txt" 2>&1 ||
    fail "1. promtool check metrics after the job: $(cat "$CLUSTER_DIR/promtool_after.txt")"
fi
# Every step's record, from the job's history (a watch starts from the job's state when it
# opens: a first step reported before then is in the history, not in the stream).
ctl export "$job" --format=jsonl >"$CLUSTER_DIR/export.jsonl" || fail "3. export jsonl failed"
telemetry=$(grep -c '"step"' "$CLUSTER_DIR/export.jsonl")
[ "$telemetry" = 300 ] || fail "the job's history has $telemetry telemetry records, not its 300 steps"
echo "the job reported $telemetry telemetry records ($(grep -c '"telemetry"' "$CLUSTER_DIR/watch.jsonl") streamed to the watch)"

# 2. The dashboard in a headless browser.
if command -v chromium >/dev/null; then
  browse() {  # OUTPUT_FLAG URL
    timeout 90 chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage \
      --user-data-dir="$CLUSTER_DIR/chromium" --window-size=1400,1200 \
      --virtual-time-budget=8000 "$1" "$2" 2>>"$CLUSTER_DIR/chromium.log"
  }
  for page in "/" "/job?id=$job" "/workers"; do
    name=$(echo "$page" | tr -c 'a-z0-9\n' '_' | sed 's/^_*$/jobs/;s/^_//')
    browse --screenshot="$OUT/dashboard_$name.png" "$HTTP$page" >/dev/null
    [ -s "$OUT/dashboard_$name.png" ] || fail "2. no screenshot of $page"
  done
  browse --dump-dom "$HTTP/job?id=$job" >"$CLUSTER_DIR/job.html"
  points=$(grep -o 'id="chart-loss"[^>]*data-points="[0-9]*"' "$CLUSTER_DIR/job.html" | grep -o '[0-9]*"$' | tr -d '"')
  echo "2. the job page's loss curve has ${points:-no} points"
  [ "${points:-0}" = "$telemetry" ] || fail "2. loss curve points (${points:-none}) != telemetry records ($telemetry)"
  browse --dump-dom "$HTTP/" >"$CLUSTER_DIR/jobs.html"
  grep -q "data-job=\"$job\"" "$CLUSTER_DIR/jobs.html" || fail "2. the jobs page does not list $job"
  grep -q "<input type=\"checkbox\" data-select=\"$job\">" "$CLUSTER_DIR/jobs.html" ||
    fail "2. the jobs page has no box to tick $job for the compare page"
  browse --dump-dom "$HTTP/workers" >"$CLUSTER_DIR/workers.html"
  grep -q 'data-worker="w1#' "$CLUSTER_DIR/workers.html" || fail "2. the workers page does not list w1"
  # Usage: w1's memory available now (a bar and figures), no GPU; g1's GPU 0 with its bars and
  # 75 %, its GPU 1 "n/a".
  w1_row=$(grep -o '<tr data-worker="w1#[^>]*>.*' "$CLUSTER_DIR/workers.html" | sed 's|</tr>.*||')
  grep -q '<td data-memory="[0-9][0-9]*" title="read [0-9]* s ago"><span class="bar small"><span style="width: [0-9.]*%"></span></span> [0-9.]* / [0-9.]* GiB available</td><td title="[^"]*">-</td>' <<<"$w1_row" ||
    fail "2. the workers page does not show w1's memory available (and no GPU): $w1_row"
  if [ -n "$gpu_worker" ]; then
    g1_row=$(grep -o '<tr data-worker="g1#[^>]*>.*' "$CLUSTER_DIR/workers.html" | sed 's|</tr>.*||')
    grep -qF '<td data-memory="42949672960" title="read ' <<<"$g1_row" &&
      grep -qF '<span class="bar small"><span style="width: 37.5%"></span></span> 40.0 / 64.0 GiB available' <<<"$g1_row" ||
      fail "2. the workers page does not show g1's memory: $g1_row"
    grep -qF '<div class="gpu" data-gpu="0" data-utilization="75">0: <span class="bar small"><span style="width: 37.5%"></span></span> 30.0 / 80.0 GiB · <span class="bar small"><span style="width: 75.0%"></span></span> 75%</div>' <<<"$g1_row" ||
      fail "2. the workers page does not show g1's GPU 0 (30.0 / 80.0 GiB, 75 %): $g1_row"
    grep -qF '<div class="gpu" data-gpu="1" data-utilization="n/a">1: n/a</div>' <<<"$g1_row" ||
      fail "2. the workers page does not show g1's GPU 1 as n/a: $g1_row"
    echo "2. workers page: w1's memory available; g1's GPU 0 at 75 % and 30.0 / 80.0 GiB, GPU 1 n/a"
  fi
  # An fp16 job with skipped steps (an initial loss scale of 1e12 overflows fp16 until it has
  # backed off): its NaN gradient norms must not blank the gradient-norm chart (uPlot's
  # autoscale turns NaN on one value into a blank chart), its skipped steps are marked, and
  # the loss-scale axis reads 1.0e12, not "1.10e+6M". Each chart box says in the DOM how many
  # of its series have a drawn path on a finite scale (data-drawn; coordinator/web/charts.js).
  chart_attr() {  # FILE CHART ATTRIBUTE
    grep -o "<div[^>]*id=\"$2\"[^>]*>" "$1" | grep -o "$3=\"[^\"]*\"" | cut -d'"' -f2
  }
  sed -e 's/"observed-job"/"fp16-skips"/' -e 's/"fp32"/"fp16"/' -e 's/"steps": 300/"steps": 60/' \
      -e 's/"world_size": 2/"world_size": 1/' \
      -e 's/"seed": 3,/"seed": 3, "loss_scaler": {"init_scale": 1e12, "growth_interval": 10},/' \
      "$CLUSTER_DIR/job.json" >"$CLUSTER_DIR/fp16.json"
  fp16=$(ctl submit "$CLUSTER_DIR/fp16.json" | tail -n 1)
  ctl watch "$fp16" >/dev/null
  # Every record (a watch started after a 60-step job ended would show none of them).
  ctl export "$fp16" --format=jsonl >"$CLUSTER_DIR/fp16_watch.jsonl"
  skipped=$(grep -c '"skipped": *true' "$CLUSTER_DIR/fp16_watch.jsonl")
  nan_norms=$(grep -c '"grad_norm": *"\(NaN\|Infinity\|-Infinity\)"' "$CLUSTER_DIR/fp16_watch.jsonl")
  [ "$nan_norms" -gt 0 ] || fail "2. the fp16 job had no NaN/inf gradient norm: the check below checks nothing"
  browse --dump-dom "$HTTP/job?id=$fp16" >"$CLUSTER_DIR/fp16.html"
  browse --screenshot="$OUT/dashboard_job_fp16.png" "$HTTP/job?id=$fp16" >/dev/null
  drawn=$(chart_attr "$CLUSTER_DIR/fp16.html" chart-grad_norm data-drawn)
  marked=$(chart_attr "$CLUSTER_DIR/fp16.html" box-grad_norm data-skipped)
  echo "2. fp16 job: $skipped skipped steps, $nan_norms non-finite gradient norms; gradient-norm chart: ${drawn:-no} series drawn, ${marked:-no} steps marked"
  [ "${drawn:-0}" = 2 ] || fail "2. the gradient-norm chart of an fp16 job with skipped steps is blank (${drawn:-no} of 2 series drawn)"
  [ "${marked:-0}" = "$skipped" ] || fail "2. ${marked:-no} skipped steps marked, $skipped skipped"
  [ "$(chart_attr "$CLUSTER_DIR/fp16.html" chart-loss data-drawn)" = 1 ] || fail "2. the fp16 loss chart is blank"
  [ "$(chart_attr "$CLUSTER_DIR/fp16.html" chart-loss_scale data-drawn)" = 2 ] || fail "2. the loss-scale chart is blank"
  grep -q '<div class="chart" id="box-loss_scale" hidden' "$CLUSTER_DIR/job.html" &&
    ! grep -q '<div class="chart" id="box-loss_scale" hidden' "$CLUSTER_DIR/fp16.html" ||
    fail "2. the loss-scale chart is not shown for the fp16 job alone (fp32 has no loss scale)"
  labels=$(chart_attr "$CLUSTER_DIR/fp16.html" chart-loss_scale data-y-labels)
  echo "2. loss-scale axis: $labels"
  case " $labels " in
    *" 1.0e12 "*) case "$labels" in *e+*|*[0-9]e*[MkG]*) fail "2. loss-scale axis labels formatted twice: $labels" ;; esac ;;
    *) fail "2. the loss-scale axis has no 1.0e12 label: ${labels:-none}" ;;
  esac
  # The same page on a log scale, smoothed, over training time (the settings a link carries):
  # still drawn, NaN steps included.
  browse --dump-dom "$HTTP/job?id=$fp16&log=1&smoothing=0.9&x=time" >"$CLUSTER_DIR/fp16_log.html"
  for chart in chart-loss chart-grad_norm; do
    [ "$(chart_attr "$CLUSTER_DIR/fp16_log.html" $chart data-log)" = 1 ] &&
      [ "$(chart_attr "$CLUSTER_DIR/fp16_log.html" $chart data-x)" = "training time (s)" ] ||
      fail "2. $chart is not on a log scale over training time with ?log=1&x=time"
  done
  [ "$(chart_attr "$CLUSTER_DIR/fp16_log.html" chart-grad_norm data-drawn)" = 2 ] &&
    [ "$(chart_attr "$CLUSTER_DIR/fp16_log.html" chart-loss data-drawn)" = 1 ] ||
    fail "2. a chart went blank on a log scale, smoothed, over training time"
  # The overlay of both jobs: one chart, two series drawn; a metric neither has says so.
  browse --dump-dom "$HTTP/compare?ids=$job,$fp16" >"$CLUSTER_DIR/compare.html"
  browse --screenshot="$OUT/dashboard_compare.png" "$HTTP/compare?ids=$job,$fp16" >/dev/null
  [ "$(chart_attr "$CLUSTER_DIR/compare.html" chart-loss data-series)" = 2 ] &&
    [ "$(chart_attr "$CLUSTER_DIR/compare.html" chart-loss data-drawn)" = 2 ] ||
    fail "2. the overlay of two jobs does not draw two loss series"
  [ "$(chart_attr "$CLUSTER_DIR/compare.html" chart-grad_norm data-drawn)" = 2 ] ||
    fail "2. the overlay's gradient-norm chart lost a series"
  grep -q 'id="chart-eval_loss"[^>]*><div class="no-data' "$CLUSTER_DIR/compare.html" ||
    fail "2. the overlay's eval-loss chart (no job evaluates) has no 'no data' note"
  echo "2. overlay of $job and $fp16: two loss series drawn; eval loss: no data"
  # Rank notes on the job page: a file no job wrote where a checkpoint goes is left alone, and
  # the rank says so (a RankNote warning), shown as text (never as markup).
  mkdir -p "$CLUSTER_DIR/outputs/notes"
  echo '<b id="injected">not a checkpoint</b>' >"$CLUSTER_DIR/outputs/notes/step-00000010.safetensors"
  sed -e 's/"steps": 300,/"steps": 20, "checkpoint_every": 10, "checkpoint_dir": "'"${CLUSTER_DIR//\//\\/}"'\/outputs\/notes",/' \
      -e 's/"world_size": 2/"world_size": 1/' -e 's/"observed-job"/"noted-job"/' \
      "$CLUSTER_DIR/job.json" >"$CLUSTER_DIR/noted.json"
  noted=$(ctl submit "$CLUSTER_DIR/noted.json" | tail -n 1)
  ctl watch "$noted" >/dev/null
  browse --dump-dom "$HTTP/job?id=$noted" >"$CLUSTER_DIR/noted.html"
  grep -q '<div id="box-notes">' "$CLUSTER_DIR/noted.html" &&
    grep -q '<li class="error">step [0-9]*, rank 0[^<]*checkpoint of step 10 not written' "$CLUSTER_DIR/noted.html" ||
    fail "2. the job page does not show the rank's warning"
  grep -q 'id="injected"' "$CLUSTER_DIR/noted.html" && fail "2. a file's bytes reached the page as markup"
  grep -q '<div id="box-notes" hidden' "$CLUSTER_DIR/fp16.html" || fail "2. a job without notes shows a notes box"
  echo "2. rank notes: $noted's warning shown on its page"
  # A running job: the workers page shows its rank on w1, its page a cancel button, which
  # POSTs with the page's CSRF token (curl here, as the page's script does; without the token
  # a browser-style request is refused).
  sed -e 's/"steps": 60,/"steps": 100000000,/' -e 's/"fp16-skips"/"long-job"/' \
    "$CLUSTER_DIR/fp16.json" >"$CLUSTER_DIR/long.json"
  long=$(ctl submit "$CLUSTER_DIR/long.json" | tail -n 1)
  for _ in $(seq 200); do
    grep -q '"state": *"RUNNING"' <<<"$(curl -sf "$HTTP/api/jobs/$long")" && break
    sleep 0.05
  done
  browse --dump-dom "$HTTP/workers" >"$CLUSTER_DIR/workers_running.html"
  grep -q "<td data-ranks=\"1\">$long rank 0</td>" "$CLUSTER_DIR/workers_running.html" ||
    fail "2. the workers page does not show $long's rank on w1"
  browse --dump-dom "$HTTP/job?id=$long" >"$CLUSTER_DIR/long.html"
  grep -q '<button id="cancel">' "$CLUSTER_DIR/long.html" ||
    fail "2. the running job's page has no cancel button"
  grep -q '<button id="cancel" hidden' "$CLUSTER_DIR/fp16.html" ||
    fail "2. the ended job's page offers a cancel"
  cancel_url="$HTTP/api/jobs/$long/cancel"
  [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Length: 0' "$cancel_url")" = 403 ] ||
    fail "2. a cancel without the CSRF header was not refused"
  csrf=$(curl -sf "$HTTP/api/csrf" | sed 's/.*"csrf_token": *"\([0-9a-f]*\)".*/\1/')
  [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Length: 0' \
         -H "X-CSRF-Token: $csrf" "$cancel_url")" = 200 ] || fail "2. the cancel with its CSRF token failed"
  grep -q CANCELLED <<<"$(ctl status "$long")" || fail "2. $long was not cancelled"
  echo "2. running job: its rank on the workers page, a cancel button; cancel 403 without the CSRF token, 200 with it"
else
  missing "part 2" chromium chromium
fi

# 3. Export round-trips what watch streamed: the job's records from the first the watch saw
# (it opened right after the submit) to the last.
ctl export "$job" --format=csv >"$CLUSTER_DIR/export.csv" || fail "3. export csv failed"
python3 - "$CLUSTER_DIR" <<'PY' || fail "3. export does not round-trip the watched telemetry"
import csv, json, sys
d = sys.argv[1]
watched = [json.loads(l)["telemetry"] for l in open(f"{d}/watch.jsonl") if '"telemetry"' in l]
exported = [json.loads(l) for l in open(f"{d}/export.jsonl")]
rows = list(csv.DictReader(open(f"{d}/export.csv")))
assert len(exported) == len(rows) > 0, (len(exported), len(rows))
# What was reported before the watch opened is not in its stream (a loaded machine took
# longer than a report interval to start trainctl): the stream is the export's tail, to the
# last step.
missed = len(exported) - len(watched)
assert 0 <= missed < len(exported) and watched[-1] == exported[-1], (len(watched), len(exported))
for w, e, r in zip(watched, exported[missed:], rows[missed:]):
    assert w == e, (w, e)
    for key, value in w.items():
        got = r[key]
        if isinstance(value, bool):
            assert got == str(value).lower(), (key, value, got)
        else:
            assert float(got) == float(value), (key, value, got)
    # A field not set (no evaluation this step, no accuracy for MSE) is an empty cell, not 0.
    for key in ("accuracy", "eval_loss", "eval_accuracy"):
        assert key in w or r[key] == "", (key, r[key])
unset = sum(1 for r in rows for key in ("accuracy", "eval_loss", "eval_accuracy") if r[key] == "")
assert unset > 0, "no record without an optional field: the check above checked nothing"
print(f"3. export: {len(rows)} records, csv and jsonl equal to the watched stream "
      f"({len(watched)} records from step {watched[0]['step']}; {unset} unset optional fields "
      "empty)")
PY
[ -z "$(ctl export job-9999 --format=csv 2>/dev/null)" ] ||
  fail "3. export of an unknown job wrote to stdout"

# 3b. Bodies of no stated length, encoded, or asked for in ranges are refused before any body
# is read (coordinator/http_server_test.cc has the rest: heads, connections, slow clients).
status_of() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
[ "$(status_of -H 'Range: bytes=0-,0-,0-' "$HTTP/app.css")" = 416 ] ||
  fail "3b. a Range request was served"
[ "$(status_of -H 'Transfer-Encoding: chunked' --data-binary @/dev/null "$HTTP/login")" = 400 ] ||
  fail "3b. a chunked body was accepted"
[ "$(status_of -H 'Content-Encoding: gzip' --data 'token=x' "$HTTP/login")" = 400 ] ||
  fail "3b. an encoded body was accepted"
[ "$(status_of -X POST -H 'Content-Length:' "$HTTP/login")" = 411 ] ||
  fail "3b. a POST without Content-Length was accepted"
[ "$(status_of "$HTTP/app.css")" = 200 ] || fail "3b. a plain request was refused"
echo "3b. Range 416, chunked or encoded bodies 400, no Content-Length 411"

# 4. HTTPS with tokens.
stop_cluster
CLUSTER_DIR=$CLUSTER_DIR/secure
mkdir -p "$CLUSTER_DIR"
secure_cluster >/dev/null
start_coordinator --http_listen=127.0.0.1:0 --http_port_file="$CLUSTER_DIR/http_port" || exit 1
for _ in $(seq 100); do [ -s "$CLUSTER_DIR/http_port" ] && break; sleep 0.05; done
SECURE=https://127.0.0.1:$(cat "$CLUSTER_DIR/http_port")
pki=$CLUSTER_DIR/pki
code() { curl -s -o /dev/null -w '%{http_code}' --cacert "$pki/ca.pem" --cert "$pki/client.pem" \
           --key "$pki/client.key" "$@"; }
[ "$(code "$SECURE/metrics")" = 401 ] || fail "4. /metrics without a token is not 401"
[ "$(code -H "Authorization: Bearer $(cat "$pki/w0.token")" "$SECURE/metrics")" = 403 ] ||
  fail "4. a worker's token may read /metrics"
[ "$(code -H "Authorization: Bearer $(cat "$pki/alice.token")" "$SECURE/metrics")" = 200 ] ||
  fail "4. a user's token may not read /metrics"
[ "$(code -H "Authorization: Bearer $(cat "$pki/alice.token")" "$SECURE/api/jobs")" = 200 ] ||
  fail "4. a user's token may not read /api/jobs"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$(cat "$CLUSTER_DIR/http_port")/metrics")" != 200 ] ||
  fail "4. plain HTTP answered on the TLS port"
[ "$(code "$SECURE/job?id=x")" = 302 ] || fail "4. a page without a token does not redirect to /login"
# --tls_client_ca: a user's token without a client certificate, or with one another CA signed,
# reads nothing.
[ "$(curl -s -o /dev/null -w '%{http_code}' --cacert "$pki/ca.pem" \
       -H "Authorization: Bearer $(cat "$pki/alice.token")" "$SECURE/metrics")" != 200 ] ||
  fail "4. /metrics answered a client without a certificate"
bash "$RUNFILES/scripts/make_pki.sh" "$CLUSTER_DIR/other_pki" >/dev/null
[ "$(curl -s -o /dev/null -w '%{http_code}' --cacert "$pki/ca.pem" \
       --cert "$CLUSTER_DIR/other_pki/client.pem" --key "$CLUSTER_DIR/other_pki/client.key" \
       -H "Authorization: Bearer $(cat "$pki/alice.token")" "$SECURE/metrics")" != 200 ] ||
  fail "4. /metrics answered a client certificate of another CA"
[ "$(curl -s -o /dev/null -w '%{http_code}' --cacert "$pki/ca.pem" \
       --cert "$pki/server.pem" --key "$pki/server.key" \
       -H "Authorization: Bearer $(cat "$pki/alice.token")" "$SECURE/metrics")" != 200 ] ||
  fail "4. /metrics answered the server's certificate (not made for clients) used as a client's"
echo "4. HTTPS: 401 without a token, 403 for a worker, 200 for a user; no client certificate of the CA, nothing"

# 5. Two users on the secured HTTP side: bob's token shows nothing of alice's running job (404
# as an unknown job's, absent from his list and his scrape), hers and a viewer's show it.
start_worker w0 "" --device=cpu --slots=1
wait_for_workers 1 || exit 1
cat >"$CLUSTER_DIR/alices.json" <<JSON
{"name": "alices-model", "world_size": 1, "device": "cpu",
 "model": {"input_dim": 4, "output_dim": 2}, "data": {"synthetic": {"seed": 1}},
 "micro_batch_size": 2, "accumulation_steps": 1, "steps": 100000000, "optimizer": {"lr": 0.1},
 "telemetry_every": 1}
JSON
alices=$("$TRAINCTL" --coordinator="$ADDRESS" "${TRAINCTL_FLAGS[@]}" submit "$CLUSTER_DIR/alices.json" | tail -n 1)
# (grep -c, not -q, reads the whole scrape: -q stops at the first match, and curl, still
# writing, fails on the closed pipe, which pipefail turns into a failed check.)
as() { local who=$1; shift; curl -s --cacert "$pki/ca.pem" --cert "$pki/client.pem" \
         --key "$pki/client.key" -H "Authorization: Bearer $(cat "$pki/$who.token")" "$@"; }
for _ in $(seq 200); do
  as alice "$SECURE/metrics" | grep -c "^mptrain_job_step{job_id=\"$alices\"" >/dev/null && break
  sleep 0.05
done
as alice "$SECURE/metrics" | grep -c "^mptrain_job_step{job_id=\"$alices\"" >/dev/null ||
  fail "5. alice's scrape has no series of her running job $alices"
as viewer "$SECURE/metrics" | grep -c "^mptrain_job_step{job_id=\"$alices\"" >/dev/null ||
  fail "5. the viewer's scrape has no series of alice's job"
as bob "$SECURE/metrics" | grep -c "$alices\|alices-model" >/dev/null &&
  fail "5. bob's scrape shows alice's job"
[ "$(as bob -o /dev/null -w '%{http_code}' "$SECURE/api/jobs/$alices")" = 404 ] ||
  fail "5. bob read alice's job"
[ "$(as bob -o /dev/null -w '%{http_code}' "$SECURE/api/jobs/$alices/events")" = 404 ] ||
  fail "5. bob read alice's job's events"
[ "$(as bob "$SECURE/api/jobs/$alices")" = "$(as bob "$SECURE/api/jobs/job-9999" | sed "s/job-9999/$alices/")" ] ||
  fail "5. bob's answer for alice's job differs from an unknown job's"
grep -q "$alices" <<<"$(as bob "$SECURE/api/jobs")" && fail "5. bob's /api/jobs lists alice's job"
[ "$(as alice -o /dev/null -w '%{http_code}' "$SECURE/api/jobs/$alices")" = 200 ] ||
  fail "5. alice cannot read her job"
grep -q "$alices" <<<"$(as viewer "$SECURE/api/jobs")" || fail "5. the viewer's /api/jobs lacks alice's job"
"$TRAINCTL" --coordinator="$ADDRESS" "${TRAINCTL_FLAGS[@]}" cancel "$alices" >/dev/null ||
  fail "5. alice could not cancel her job"
echo "5. HTTPS, two users: bob sees none of alice's job (404, not listed, not scraped); alice and a viewer do"

if [ $failures -ne 0 ]; then
  for f in "$CLUSTER_DIR"/../*.log "$CLUSTER_DIR"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done
  echo "0 passed, $failures failed"
  exit 1
fi
echo "observability: 6 passed, 0 failed"
