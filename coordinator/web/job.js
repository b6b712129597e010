// One job: its summary, live curves of its telemetry (charts.js), placement, failures and rank
// notes, and a cancel button. New events are fetched every second, those after the last seen.
"use strict";

const jobId = new URLSearchParams(window.location.search).get("id") || "";
const records = [];  // Telemetry, in the order of the events.
const notes = [];    // Rank notes (warnings, samples), the newest kMaxNotes.
const kMaxNotes = 256;
let lastSequence = 0;
let finished = false;
let currentJob = null;

// The loss scale matters only where a scaler runs: fp16 by default, bf16 when asked.
function scalesLoss(spec) {
  const precision = spec.precision || "PRECISION_UNSPECIFIED";
  const enabled = (spec.loss_scaler || {}).enabled;
  if (precision === "FP32") return false;
  if (precision === "BF16") return enabled === true;
  return enabled !== false;
}

function drawCharts() {
  const c = telemetryColumns(records);
  const x = xColumn(c);
  const log = chartSettings.log;
  const hasEval = c.eval_loss.some(v => v !== null);
  drawChart("loss", x, [{label: "train loss", values: c.loss},
                        ...(hasEval ? [{label: "eval loss", values: c.eval_loss, spanGaps: true}] : [])],
            {log});
  // Skipped steps marked at the top of the finite values (their own norm is inf or NaN).
  const finiteNorms = c.grad_norm.filter(v => v !== null && (!log || v > 0));
  const top = finiteNorms.length > 0 ? Math.max(...finiteNorms) : 1;
  const anySkipped = c.skipped.some(Boolean);
  drawChart("grad_norm", x, [{label: "grad norm", values: c.grad_norm},
                             ...(anySkipped ? [{label: "skipped step", points: true, color: "#c62828",
                                               values: c.skipped.map(s => (s ? top : null))}] : [])],
            {log});
  document.getElementById("box-grad_norm").setAttribute("data-skipped",
                                                        String(c.skipped.filter(Boolean).length));
  const spec = (currentJob || {}).spec || {};
  const lossScaleBox = document.getElementById("box-loss_scale");
  lossScaleBox.hidden = !scalesLoss(spec);
  if (!lossScaleBox.hidden) {
    drawChart("loss_scale", x, [{label: "loss scale", values: c.loss_scale, raw: true},
                                {label: "skipped", points: true, color: "#c62828",
                                 values: c.skipped.map((s, i) => (s ? c.loss_scale[i] : null))}],
              {log: true});
  }
  // Accuracy on an axis fitted to its values (97.5% -> 99.7% is not flat).
  const hasAccuracy = c.accuracy.some(v => v !== null) || c.eval_accuracy.some(v => v !== null);
  document.getElementById("box-accuracy").hidden = !hasAccuracy;
  if (hasAccuracy) {
    drawChart("accuracy", x, [{label: "train accuracy", values: c.accuracy},
                              {label: "eval accuracy", values: c.eval_accuracy, spanGaps: true}]);
  }
  drawChart("step_time", x, [{label: "step time (ms)", values: c.step_time_ms}]);
  drawChart("samples_per_second", x, [{label: "samples/s", values: c.samples_per_second}]);
  const hasLr = c.lr.some(v => v !== null && v !== 0);
  document.getElementById("box-lr").hidden = !hasLr;
  if (hasLr) drawChart("lr", x, [{label: "lr", values: c.lr, raw: true}]);
}

function showNotes() {
  document.getElementById("notes").replaceChildren(...notes.map(note => el("li",
    {class: note.kind === "WARNING" ? "error" : ""},
    `step ${note.step || 0}, rank ${note.rank || 0}${note.attempt ? ` (attempt ${note.attempt})` : ""}` +
    `${note.kind === "SAMPLE" ? ", sample" : ""}: ${note.text || ""}`)));
  document.getElementById("box-notes").hidden = notes.length === 0;
}

// POST /api/jobs/ID/cancel with the session's CSRF token (GET /api/csrf, readable by this
// origin only), which the coordinator checks against the session cookie.
async function cancelJob() {
  if (!window.confirm(`Cancel ${jobId}?`)) return;
  try {
    const {csrf_token: token} = await getJson("/api/csrf");
    const response = await fetch(`/api/jobs/${encodeURIComponent(jobId)}/cancel`,
      {method: "POST", credentials: "same-origin", headers: {"X-CSRF-Token": token}});
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    showError(null);
    refresh();
  } catch (error) {
    showError(error);
  }
}

function showJob(job) {
  currentJob = job;
  const spec = job.spec || {};
  document.getElementById("cancel").hidden = !["PENDING", "RUNNING"].includes(job.state);
  document.getElementById("title").textContent = `${job.job_id} · ${spec.name || ""}`;
  const telemetry = job.latest_telemetry || {};
  const facts = [
    ["state", job.state], ["owner", job.owner],
    ["ranks", `${spec.world_size || 0} × ${(spec.device || "").toLowerCase()}, ${(spec.precision || "").toLowerCase()}`],
    ["progress", `${telemetry.step || 0} / ${spec.steps || 0} steps`],
    ["submitted", `${age(job.submitted_unix_ms)} ago`],
    ["restarts", `${job.restarts || 0} of ${spec.max_restarts || 0}`],
    ["checkpoint", job.latest_checkpoint_path ? `step ${job.latest_checkpoint_step} at ${job.latest_checkpoint_path}${job.latest_checkpoint_worker ? ` (worker ${job.latest_checkpoint_worker})` : ""}` : "none"],
    ["error", job.error || job.pending_reason || ""],
  ];
  document.getElementById("summary").replaceChildren(
    ...facts.flatMap(([name, value]) => [el("dt", {}, name),
      el("dd", {class: name === "state" ? `state ${value}` : name === "error" ? "error" : ""}, value)]));
  const progress = new Map((job.progress || []).map(p => [Number(p.rank || 0), p]));
  document.querySelector("#placement tbody").replaceChildren(...(job.placement || []).map(p => {
    const rank = Number(p.rank || 0);
    const report = progress.get(rank) || {};
    return el("tr", {}, el("td", {}, rank), el("td", {}, p.worker_id), el("td", {}, p.host),
      el("td", {}, p.device_index || 0), el("td", {}, report.step || 0),
      el("td", {}, report.parameter_checksum || ""), el("td", {class: "error"}, report.error || ""));
  }));
  document.getElementById("failures").replaceChildren(...(job.failures || []).map(f => el("li", {}, f)));
}

async function refresh() {
  try {
    const job = await getJson(`/api/jobs/${encodeURIComponent(jobId)}`);
    showJob(job);
    // The whole history the coordinator holds, a page at a time, then what comes next.
    for (let page = 0; page < 100 && !finished; ++page) {
      const body = await getJson(`/api/jobs/${encodeURIComponent(jobId)}/events?after=${lastSequence}&limit=10000`);
      const events = body.events || [];
      for (const event of events) {
        lastSequence = Math.max(lastSequence, Number(event.sequence || 0));
        if (event.telemetry) records.push(event.telemetry);
        if (event.note) {
          notes.push(event.note);
          if (notes.length > kMaxNotes) notes.shift();
        }
      }
      finished = Boolean(body.finished);
      if (events.length < 10000) break;
    }
    drawCharts();
    showNotes();
    document.body.setAttribute("data-loaded", finished ? "finished" : "live");
    showError(null);
  } catch (error) {
    showError(error);
  }
}

chartControls(drawCharts);
document.getElementById("cancel").addEventListener("click", cancelJob);
refresh();
setInterval(refresh, 1000);
