// Several jobs' curves on one chart per metric (/compare?ids=job-0001,job-0002; the jobs page
// links here with the jobs ticked): one series per job, on the union of their steps (or
// training times). At most kMaxJobs jobs; each job's events are fetched until it ends, then
// no more.
"use strict";

const kMaxJobs = 8;
const compared = (new URLSearchParams(window.location.search).get("ids") || "")
  .split(",").map(id => id.trim()).filter(id => /^[A-Za-z0-9_-]{1,64}$/.test(id))
  .filter((id, i, all) => all.indexOf(id) === i).slice(0, kMaxJobs);
const runs = compared.map(id => ({id, name: "", records: [], lastSequence: 0, finished: false}));

async function fetchRun(run) {
  if (!run.name) run.name = ((await getJson(`/api/jobs/${encodeURIComponent(run.id)}`)).spec || {}).name || "";
  for (let page = 0; page < 100 && !run.finished; ++page) {
    const body = await getJson(`/api/jobs/${encodeURIComponent(run.id)}/events?after=${run.lastSequence}&limit=10000`);
    const events = body.events || [];
    for (const event of events) {
      run.lastSequence = Math.max(run.lastSequence, Number(event.sequence || 0));
      if (event.telemetry) run.records.push(event.telemetry);
    }
    run.finished = Boolean(body.finished);
    if (events.length < 10000) break;
  }
}

// Each run's column `key` on the union of the runs' x values (uPlot wants one x array).
function aligned(columns, key) {
  const xs = [...new Set(columns.flatMap(c => xColumn(c)))].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const lines = columns.map((c, r) => {
    const values = new Array(xs.length).fill(null);
    xColumn(c).forEach((x, i) => { if (c[key][i] !== null) values[index.get(x)] = c[key][i]; });
    return {label: `${runs[r].id} ${runs[r].name}`.trim(), values, spanGaps: true};
  });
  return [xs, lines];
}

function drawAll() {
  const columns = runs.map(run => telemetryColumns(run.records));
  for (const c of columns) {
    // Accuracy: the held-out one where a job evaluates, else the training batches'.
    c.shown_accuracy = c.eval_accuracy.some(v => v !== null) ? c.eval_accuracy : c.accuracy;
  }
  const log = chartSettings.log;
  for (const [chart, key, logScale] of [["loss", "loss", log], ["eval_loss", "eval_loss", log],
                                        ["grad_norm", "grad_norm", log],
                                        ["accuracy", "shown_accuracy", false],
                                        ["samples_per_second", "samples_per_second", false],
                                        ["step_time", "step_time_ms", false]]) {
    const [xs, lines] = aligned(columns, key);
    drawChart(chart, xs, lines, {log: logScale});
  }
}

async function refresh() {
  try {
    await Promise.all(runs.filter(run => !run.finished).map(fetchRun));
    document.getElementById("jobs-compared").replaceChildren(...runs.map(run => el("li", {},
      el("a", {href: `/job?id=${encodeURIComponent(run.id)}`}, run.id), ` ${run.name}`,
      ` (${run.records.length} records${run.finished ? "" : ", live"})`)));
    drawAll();
    document.body.setAttribute("data-loaded", runs.every(run => run.finished) ? "finished" : "live");
    showError(runs.length === 0 ? new Error("no jobs given: tick some on the jobs page") : null);
  } catch (error) {
    showError(error);
  }
}

chartControls(drawAll);
refresh();
setInterval(() => { if (runs.some(run => !run.finished)) refresh(); }, 2000);
