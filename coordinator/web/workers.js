// The workers page: every worker daemon, its slots, devices and memory, the ranks of the
// running jobs the caller may read that each runs (from the jobs' placements), and its latest
// usage (Worker.usage, from its heartbeats: host memory available, each GPU's memory and
// utilization, "n/a" where not read), every 2 s.
"use strict";

function gib(bytes) { return bytes ? `${(Number(bytes) / 2 ** 30).toFixed(1)} GiB` : ""; }

// A small bar filled to `fraction` (0..1).
function bar(fraction) {
  const width = Math.min(100, Math.max(0, 100 * fraction)).toFixed(1);
  return el("span", {class: "bar small"}, el("span", {style: `width: ${width}%`}));
}

// Host memory the worker's ranks could take now, of what they could have at most; the bar
// shows the part in use. "n/a" before a reading (or for a lost worker).
function memoryCell(worker) {
  const usage = worker.usage || {};
  const total = Number(usage.memory_total_bytes || 0);
  if (!Number(worker.usage_unix_ms || 0) || !total) return el("td", {"data-memory": "n/a"}, "n/a");
  const available = Number(usage.memory_available_bytes || 0);
  return el("td", {"data-memory": available, title: `read ${age(worker.usage_unix_ms)} ago`},
            bar(1 - available / total),
            ` ${(available / 2 ** 30).toFixed(1)} / ${gib(total)} available`);
}

// Per registered device: its memory in use of its total (bar) and its utilization, or "n/a"
// when its worker could not read it (no NVML, a failed reading) or has sent no reading yet.
function gpuCell(worker) {
  const readings = new Map();
  if (Number(worker.usage_unix_ms || 0)) {
    for (const d of (worker.usage || {}).devices || []) readings.set(Number(d.index || 0), d);
  }
  const lines = (worker.devices || []).map(device => {
    const index = Number(device.index || 0);
    const d = readings.get(index);
    if (!d || !d.available) {
      return el("div", {class: "gpu", "data-gpu": index, "data-utilization": "n/a"}, `${index}: n/a`);
    }
    const used = Number(d.memory_used_bytes || 0), total = Number(d.memory_total_bytes || 0);
    const utilization = Number(d.utilization_percent || 0);
    return el("div", {class: "gpu", "data-gpu": index, "data-utilization": utilization},
              `${index}: `, bar(total ? used / total : 0),
              ` ${(used / 2 ** 30).toFixed(1)} / ${gib(total)} · `, bar(utilization / 100),
              ` ${utilization}%`);
  });
  return el("td", {title: Number(worker.usage_unix_ms || 0) ? `read ${age(worker.usage_unix_ms)} ago` : ""},
            ...(lines.length ? lines : ["-"]));
}

async function refresh() {
  try {
    const body = await getJson("/api/workers");
    // worker id -> [{job, rank, device}] of the running jobs (the first 1000).
    const ranks = new Map();
    const jobs = (await getJson("/api/jobs?page_size=1000")).jobs || [];
    for (const job of jobs.filter(j => j.state === "RUNNING")) {
      for (const p of job.placement || []) {
        if (!ranks.has(p.worker_id)) ranks.set(p.worker_id, []);
        ranks.get(p.worker_id).push({job: job.job_id, rank: Number(p.rank || 0),
                                     device: Number(p.device_index || 0)});
      }
    }
    const onDevice = (worker, index) => (ranks.get(worker.worker_id) || [])
      .filter(r => worker.device === "CUDA" && r.device === index)
      .map(r => `${r.job}/${r.rank}`).join(" ");
    const rows = (body.workers || []).map(worker => el("tr", {"data-worker": worker.worker_id},
      el("td", {}, worker.worker_id), el("td", {}, worker.host),
      el("td", {class: `state ${worker.state === "ALIVE" ? "SUCCEEDED" : "FAILED"}`}, worker.state),
      el("td", {}, (worker.device || "").toLowerCase()), el("td", {}, worker.slots || 0),
      el("td", {}, worker.free_slots || 0),
      el("td", {}, (worker.devices || []).map(d => {
        const used = onDevice(worker, Number(d.index || 0));
        return `${d.index || 0}: ${d.name || ""} ${gib(d.memory_bytes)}${used ? ` (${used})` : ""}`;
      }).join(", ")),
      el("td", {}, gib(worker.memory_bytes)), memoryCell(worker), gpuCell(worker),
      el("td", {"data-ranks": (ranks.get(worker.worker_id) || []).length},
         (ranks.get(worker.worker_id) || []).map(r => `${r.job} rank ${r.rank}`).join(", ")),
      el("td", {}, `${age(worker.last_heartbeat_unix_ms)} ago`), el("td", {}, worker.principal || "")));
    document.querySelector("#workers tbody").replaceChildren(...rows);
    showError(null);
  } catch (error) {
    showError(error);
  }
}

refresh();
setInterval(refresh, 2000);
