// The jobs page: every job the coordinator holds, refreshed every 2 s.
"use strict";

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
      return el("tr", {"data-job": job.job_id},
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
