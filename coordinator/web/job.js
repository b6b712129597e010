// One job: its summary, live curves of its telemetry (uPlot), placement and failures. New
// telemetry is fetched every second as the events after the last one seen.
"use strict";

const jobId = new URLSearchParams(window.location.search).get("id") || "";
const series = {step: [], loss: [], grad_norm: [], loss_scale: [], skipped: [],
                samples_per_second: [], lr: [], eval_step: [], eval_loss: [], eval_accuracy: []};
let lastSequence = 0;
let finished = false;
const charts = {};

// Axis labels short enough for the axis: 65536 -> 65.5k, 0.00012 -> 1.2e-4.
function compact(value) {
  if (value === null || value === undefined) return "";
  const magnitude = Math.abs(value);
  if (magnitude >= 1e6) return `${(value / 1e6).toPrecision(3)}M`;
  if (magnitude >= 1e4) return `${(value / 1e3).toPrecision(3)}k`;
  if (magnitude !== 0 && magnitude < 1e-3) return value.toExponential(1);
  return String(Number(value.toPrecision(4)));
}
const yAxis = {size: 64, values: (u, values) => values.map(compact)};

function chart(name, labels, data, options = {}) {
  const box = document.getElementById(`chart-${name}`);
  box.setAttribute("data-points", String(data[0].length));
  if (charts[name]) { charts[name].setData(data); return; }
  const colors = ["#1a66d2", "#c62828", "#1e8a3c"];
  charts[name] = new uPlot({
    width: Math.max(420, box.clientWidth || 460), height: 220,
    scales: {x: {time: false}, ...(options.scales || {})},
    axes: [{label: "step"}, ...(options.axes || [{}]).map(axis => ({...yAxis, ...axis}))],
    series: [{label: "step"}, ...labels.map((label, i) => ({
      label, stroke: colors[i % colors.length], width: 1.5,
      ...(options.points && options.points[i] ? {paths: () => null, points: {show: true, size: 7, fill: colors[1]}} : {}),
      ...(options.series && options.series[i] ? options.series[i] : {}),
    }))],
  }, data, box);
}

function addTelemetry(record) {
  series.step.push(Number(record.step || 0));
  const value = key => (record[key] === undefined ? 0 : Number(record[key]));
  for (const key of ["loss", "grad_norm", "loss_scale", "samples_per_second", "lr"]) {
    series[key].push(value(key));
  }
  series.skipped.push(record.skipped ? value("loss_scale") : null);
  if (record.eval_loss !== undefined || record.eval_accuracy !== undefined) {
    series.eval_step.push(Number(record.step || 0));
    series.eval_loss.push(value("eval_loss"));
    series.eval_accuracy.push(value("eval_accuracy"));
  }
}

function drawCharts() {
  chart("loss", ["loss"], [series.step, series.loss]);
  chart("grad_norm", ["grad norm"], [series.step, series.grad_norm]);
  chart("loss_scale", ["loss scale", "skipped"], [series.step, series.loss_scale, series.skipped],
        {points: [false, true], scales: {y: {distr: 3}}});
  chart("samples_per_second", ["samples/s"], [series.step, series.samples_per_second]);
  if (series.lr.some(v => v !== 0)) {
    document.getElementById("box-lr").hidden = false;
    chart("lr", ["lr"], [series.step, series.lr]);
  }
  if (series.eval_step.length > 0) {
    document.getElementById("box-eval").hidden = false;
    chart("eval", ["eval loss", "eval accuracy"],
          [series.eval_step, series.eval_loss, series.eval_accuracy],
          {scales: {acc: {range: [0, 1]}}, axes: [{}, {scale: "acc", side: 1, grid: {show: false}}],
           series: [{}, {scale: "acc"}]});
  }
}

function showJob(job) {
  const spec = job.spec || {};
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
        if (event.telemetry) addTelemetry(event.telemetry);
      }
      finished = Boolean(body.finished);
      if (events.length < 10000) break;
    }
    drawCharts();
    document.body.setAttribute("data-loaded", finished ? "finished" : "live");
    showError(null);
  } catch (error) {
    showError(error);
  }
}

refresh();
setInterval(refresh, 1000);
