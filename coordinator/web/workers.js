// The workers page: every worker daemon, its slots and devices, refreshed every 2 s.
"use strict";

function gib(bytes) { return bytes ? `${(Number(bytes) / 2 ** 30).toFixed(1)} GiB` : ""; }

async function refresh() {
  try {
    const body = await getJson("/api/workers");
    const rows = (body.workers || []).map(worker => el("tr", {"data-worker": worker.worker_id},
      el("td", {}, worker.worker_id), el("td", {}, worker.host),
      el("td", {class: `state ${worker.state === "ALIVE" ? "SUCCEEDED" : "FAILED"}`}, worker.state),
      el("td", {}, (worker.device || "").toLowerCase()), el("td", {}, worker.slots || 0),
      el("td", {}, worker.free_slots || 0),
      el("td", {}, (worker.devices || []).map(d => `${d.index || 0}: ${d.name || ""} ${gib(d.memory_bytes)}`).join(", ")),
      el("td", {}, gib(worker.memory_bytes)),
      el("td", {}, `${age(worker.last_heartbeat_unix_ms)} ago`), el("td", {}, worker.principal || "")));
    document.querySelector("#workers tbody").replaceChildren(...rows);
    showError(null);
  } catch (error) {
    showError(error);
  }
}

refresh();
setInterval(refresh, 2000);
