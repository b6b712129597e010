// The jobs page: every job the coordinator holds, refreshed every 2 s. Ticked jobs (kept
// across refreshes) open together on the compare page: their curves on one chart.
"use strict";

const selected = new Set();
const kMaxCompared = 8;

function showCompareLink() {
  const link = document.getElementById("compare");
  const ids = [...selected].slice(0, kMaxCompared);
  link.href = `/compare?ids=${ids.map(encodeURIComponent).join(",")}`;
  link.hidden = ids.length < 2;
  link.textContent = `compare ${ids.length} jobs`;
}

function selectCell(jobId) {
  const box = el("input", {type: "checkbox", "data-select": jobId});
  box.checked = selected.has(jobId);
  box.addEventListener("change", () => {
    if (box.checked) selected.add(jobId); else selected.delete(jobId);
    showCompareLink();
  });
  return el("td", {}, box);
}

async function refresh() {
  try {
    const jobs = [];
    let token = "";
    for (let page = 0; page < 50; ++page) {  // 50,000 jobs at most.
      const body = await getJson(`/api/jobs?page_size=1000&page_token=${encodeURIComponent(token)}`);
      jobs.push(...(body.jobs || []));
      token = body.next_page_token || "";
      if (!token) break;
    }
    const rows = jobs.reverse().map(job => {
      const spec = job.spec || {};
      const step = (job.latest_telemetry || {}).step || 0;
      return el("tr", {"data-job": job.job_id}, selectCell(job.job_id),
        el("td", {}, el("a", {href: `/job?id=${encodeURIComponent(job.job_id)}`}, job.job_id)),
        el("td", {}, spec.name || ""), stateCell(job.state),
        progressCell(Number(step), Number(spec.steps || 0)),
        el("td", {}, `${spec.world_size || 0} × ${(spec.device || "").toLowerCase()}`),
        el("td", {}, job.owner || ""), el("td", {}, `${age(job.submitted_unix_ms)} ago`),
        el("td", {class: job.state === "FAILED" ? "error" : "muted"},
           job.error || job.pending_reason || ""));
    });
    document.querySelector("#jobs tbody").replaceChildren(...rows);
    showError(null);
  } catch (error) {
    showError(error);
  }
}

refresh();
setInterval(refresh, 2000);
