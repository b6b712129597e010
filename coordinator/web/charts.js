// Telemetry charts (uPlot), shared by the job page and the overlay of several jobs.
//
// Values that are not finite (a skipped fp16 step's NaN or inf gradient norm, sent by the API
// as the strings "NaN" and "Infinity") become gaps: one NaN in a series makes uPlot's autoscale
// NaN and blanks the whole chart. Each chart box carries what a test can check in the DOM:
// data-points (records), data-drawn (series with a stroked path on a finite scale),
// data-series (series other than x) and data-y-labels (the left axis' labels). A chart without data shows a "no data" note instead.
"use strict";

function finiteOrNull(value) {
  if (value === null || value === undefined) return null;
  const number = Number(value);
  return Number.isFinite(number) ? number : null;
}

// Axis labels short enough for the axis: 65536 -> 65.5k, 1.1e12 -> 1.1e12, 0.00012 -> 1.2e-4.
function compact(value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "";
  const magnitude = Math.abs(value);
  if (magnitude === 0) return "0";
  if (magnitude >= 999.5e6 || magnitude < 1e-3) return value.toExponential(1).replace("e+", "e");
  // Number() of toPrecision's text drops an exponent it may print ("1.00e+3" -> 1000); what
  // rounds to 1000k is 1M, to 1000M 1.0e9.
  if (magnitude >= 999.5e3) return `${Number((value / 1e6).toPrecision(3))}M`;
  if (magnitude >= 1e4) return `${Number((value / 1e3).toPrecision(3))}k`;
  return String(Number(value.toPrecision(4)));
}

// The page's chart settings: from the address (?log=1&smoothing=0.6&x=time, so that a view can
// be linked to), then changed by its controls (chartControls below), which keep the address.
const chartSettings = (() => {
  const query = new URLSearchParams(window.location.search);
  const smoothing = Number(query.get("smoothing"));
  return {log: query.get("log") === "1",
          smoothing: Number.isFinite(smoothing) ? Math.min(0.99, Math.max(0, smoothing)) : 0,
          x: query.get("x") === "time" ? "time" : "step"};
})();

function keepSettingsInAddress() {
  const query = new URLSearchParams(window.location.search);
  const set = (key, value, unset) => (value === unset ? query.delete(key) : query.set(key, value));
  set("log", chartSettings.log ? "1" : "", "");
  set("smoothing", String(chartSettings.smoothing), "0");
  set("x", chartSettings.x, "step");
  window.history.replaceState(null, "", `${window.location.pathname}?${query}`);
}

// Exponential moving average as TensorBoard's smoothing: gaps stay gaps and do not reset it.
function smooth(values, weight) {
  if (!(weight > 0)) return values;
  let last = null;
  return values.map(value => {
    if (value === null) return null;
    last = last === null ? value : last * weight + value * (1 - weight);
    return last;
  });
}

const kColors = ["#1a66d2", "#c62828", "#1e8a3c", "#8e44ad", "#d35400", "#16a085", "#7f8c8d",
                 "#2c3e50"];
const kCharts = {};

function chartBox(name) { return document.getElementById(`chart-${name}`); }

// The number of series with a drawn path: uPlot keeps each series' last paths; a path on a
// scale whose range is NaN (what a NaN value does to the autoscale) draws nothing. (uPlot's
// _paths are internal: a newer vendored uPlot must keep this check honest, see
// tests/observability_test.sh.)
function drawnSeries(u) {
  let drawn = 0;
  for (let i = 1; i < u.series.length; ++i) {
    const s = u.series[i];
    const scale = u.scales[s.scale];
    // A line's stroke, or the markers of a points-only series (uPlot keeps them apart).
    const hasPath = (s._paths && s._paths.stroke) || (s.points && s.points._paths);
    const hasValue = (u.data[i] || []).some(v => v !== null && v !== undefined);
    if (hasPath && hasValue && scale && Number.isFinite(scale.min) && Number.isFinite(scale.max)) {
      drawn += 1;
    }
  }
  return drawn;
}

// Draws (or redraws) chart `name`: `lines` is [{label, values, scale?, points?, raw?}], the
// values aligned with `x`. `log` puts the y axis on a log scale (values <= 0 become gaps).
function drawChart(name, x, lines, options = {}) {
  const box = chartBox(name);
  if (!box) return;
  const xLabel = options.xLabel || (chartSettings.x === "time" ? "training time (s)" : "step");
  const log = Boolean(options.log);
  const data = [x, ...lines.map(line => {
    let values = line.values.map(finiteOrNull);
    if (log) values = values.map(v => (v !== null && v > 0 ? v : null));
    return line.points || line.raw ? values : smooth(values, chartSettings.smoothing);
  })];
  box.setAttribute("data-points", String(x.length));
  box.setAttribute("data-x", xLabel);
  box.setAttribute("data-log", log ? "1" : "0");
  box.setAttribute("data-series", String(lines.length));
  const hasData = data.slice(1).some(values => values.some(v => v !== null));
  let note = box.querySelector(".no-data");
  if (!hasData) {
    if (kCharts[name]) { kCharts[name].plot.destroy(); delete kCharts[name]; }
    if (!note) box.append(note = el("div", {class: "no-data muted"}, "no data yet"));
    box.setAttribute("data-drawn", "0");
    return;
  }
  if (note) note.remove();
  // The shape of the chart (series, scales, axes) is its key: a change rebuilds it.
  const key = JSON.stringify([xLabel, log, lines.map(l => [l.label, l.scale || "y", !!l.points])]);
  const existing = kCharts[name];
  if (existing && existing.key === key) { existing.plot.setData(data); return; }
  if (existing) existing.plot.destroy();
  const scales = {x: {time: false}, y: {distr: log ? 3 : 1}};
  const axes = [{label: xLabel}, {size: 64, values: (u, values) => values.map(compact)}];
  for (const line of lines) {
    if (line.scale && !scales[line.scale]) {
      scales[line.scale] = {};
      axes.push({scale: line.scale, side: 1, size: 64, grid: {show: false},
                 values: (u, values) => values.map(compact)});
    }
  }
  const plot = new uPlot({
    width: plotWidth(box), height: 220, scales, axes,
    series: [{label: xLabel}, ...lines.map((line, i) => {
      const color = line.color || kColors[i % kColors.length];
      return line.points
        ? {label: line.label, stroke: color, scale: line.scale || "y", paths: () => null,
           points: {show: true, size: 7, fill: color}}
        : {label: line.label, stroke: color, width: 1.5, scale: line.scale || "y",
           spanGaps: Boolean(line.spanGaps)};
    })],
    hooks: {draw: [u => {
      box.setAttribute("data-drawn", String(drawnSeries(u)));
      // The left axis' labels as drawn (on the canvas, so not otherwise in the DOM).
      box.setAttribute("data-y-labels", (u.axes[1]._values || []).filter(Boolean).join(" "));
    }]},
  }, data, box);
  kCharts[name] = {plot, key};
}

function plotWidth(box) { return Math.max(320, (box.clientWidth || 460) - 4); }

// Charts follow the window's width.
window.addEventListener("resize", () => {
  for (const [name, chart] of Object.entries(kCharts)) {
    chart.plot.setSize({width: plotWidth(chartBox(name)), height: 220});
  }
});

// The controls above the charts: log scale, smoothing, x axis. `redraw` is called on a change.
function chartControls(redraw) {
  const bar = document.getElementById("chart-controls");
  if (!bar) return;
  const changed = () => { keepSettingsInAddress(); redraw(); };
  const log = el("input", {type: "checkbox", id: "control-log"});
  log.checked = chartSettings.log;
  log.addEventListener("change", () => { chartSettings.log = log.checked; changed(); });
  const smoothing = el("input", {type: "range", id: "control-smoothing", min: "0", max: "0.99",
                                 step: "0.01", value: String(chartSettings.smoothing)});
  const shown = el("span", {}, String(chartSettings.smoothing));
  smoothing.addEventListener("input", () => {
    chartSettings.smoothing = Number(smoothing.value);
    shown.textContent = smoothing.value;
    changed();
  });
  const x = el("select", {id: "control-x"}, el("option", {value: "step"}, "step"),
               el("option", {value: "time"}, "training time"));
  x.value = chartSettings.x;
  x.addEventListener("change", () => { chartSettings.x = x.value; changed(); });
  bar.replaceChildren(el("label", {}, log, " log scale (loss, gradient norm)"),
                      el("label", {}, "smoothing ", smoothing, " ", shown),
                      el("label", {}, "x axis ", x));
}

// A job's telemetry records as columns. `time` is the training time at each record: the sum
// of the step times (the records carry no clock; a record stands for the steps since the one
// before it).
function telemetryColumns(records) {
  const columns = {step: [], time: [], loss: [], grad_norm: [], loss_scale: [], skipped: [],
                   step_time_ms: [], samples_per_second: [], lr: [], accuracy: [],
                   eval_loss: [], eval_accuracy: []};
  let seconds = 0, previousStep = 0;
  for (const record of records) {
    const step = Number(record.step || 0);
    const stepTime = finiteOrNull(record.step_time_ms) || 0;
    seconds += (stepTime / 1000) * Math.max(1, step - previousStep);
    previousStep = step;
    columns.step.push(step);
    columns.time.push(seconds);
    for (const key of ["loss", "grad_norm", "loss_scale", "step_time_ms", "samples_per_second",
                       "lr", "accuracy", "eval_loss", "eval_accuracy"]) {
      columns[key].push(record[key] === undefined ? null : finiteOrNull(record[key]));
    }
    columns.skipped.push(Boolean(record.skipped));
  }
  return columns;
}

function xColumn(columns) { return chartSettings.x === "time" ? columns.time : columns.step; }
