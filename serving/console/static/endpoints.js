"use strict";
// The endpoints' table, refreshed by the server-sent events of /console/api/events (every 2 s).
(function () {
  const status = document.getElementById("status");
  const body = document.querySelector("#endpoints tbody");
  const fmt = (x, digits) => (x === null || x === undefined ? "-" : Number(x).toFixed(digits));

  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }

  function render(rows) {
    body.replaceChildren();
    for (const r of rows) {
      const row = document.createElement("tr");
      const link = document.createElement("a");
      link.href = "/console/endpoints/" + encodeURIComponent(r.name);
      link.textContent = r.name;
      cell(row, "").appendChild(link);
      cell(row, r.ready + (r.config_update === "IN_PROGRESS" ? " (updating)" : ""));
      cell(row, r.entities.map((e) => `${e.name}: ${e.model} v${e.version}, ${e.traffic_percentage} %`).join("; "));
      cell(row, String(r.ready_replicas));
      cell(row, fmt(r.requests_per_s, 1));
      cell(row, r.error_ratio === null ? "-" : (100 * r.error_ratio).toFixed(1) + " %");
      cell(row, r.entities.map((e) => `${fmt(e.p99_ms, 0)} / ${fmt(e.slo_ms, 0)} ms`).join("; "));
      cell(row, r.flags.join("; "), r.flags.length ? "flag" : "");
      body.appendChild(row);
    }
  }

  const events = new EventSource("/console/api/events");
  events.addEventListener("endpoints", (event) => {
    const data = JSON.parse(event.data);
    render(data.endpoints);
    status.textContent = `${data.endpoints.length} endpoint(s), live at ${new Date(data.t * 1000).toLocaleTimeString()}`;
  });
  events.onerror = () => {
    status.textContent = "reconnecting...";
  };
})();
