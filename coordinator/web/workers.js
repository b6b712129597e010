// The workers page: every worker daemon, its slots, devices and memory, and the ranks of the
// running jobs the caller may read that each runs (from the jobs' placements), every 2 s.
"use strict";

function gib(bytes) { return bytes ? `${(Number(bytes) / 2 ** 30).toFixed(1)} GiB` : ""; }

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
      el("td", {}, gib(worker.memory_bytes)),
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
