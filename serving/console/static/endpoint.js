"use strict";
// One endpoint: its charts per served entity (the last hour, then a point a second from the server-sent events of
// /console/api/endpoints/NAME/events), the autoscaler's decisions, the replicas and their logs, the canary, and for
// an admin the traffic split.
(function () {
  const root = document.getElementById("endpoint");
  const name = root.dataset.endpoint;
  const api = "/console/api/endpoints/" + encodeURIComponent(name);
  const status = document.getElementById("status");
  const HOUR = 3600;
  const CHARTS = [
    { title: "replicas", series: ["desired", "ready", "provisioned", "standby"] },
    { title: "requests a second", series: ["requests", "completed", "errors"] },
    { title: "latency (ms)", series: ["p50_ms", "p99_ms", "goal"] },
    { title: "queue and in flight", series: ["queue", "in_flight"] },
    { title: "target concurrency per replica", series: ["target"] },
  ];
  const COLOURS = ["#1f6feb", "#2da44e", "#bf8700", "#8250df"];
  const entities = {}; // name -> {data: {t: [], <series>: []}, plots: [uPlot]}
  let after = 0;
  let goals = {};

  function element(tag, text, parent) {
    const node = document.createElement(tag);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  function entity(entityName) {
    if (entities[entityName]) return entities[entityName];
    const box = element("div", undefined, document.getElementById("charts"));
    box.className = "entity";
    element("h2", entityName, box);
    const row = element("div", undefined, box);
    row.className = "charts";
    const data = { t: [] };
    for (const chart of CHARTS) for (const s of chart.series) data[s] = [];
    const plots = CHARTS.map((chart) => {
      const options = {
        title: chart.title,
        width: 420,
        height: 200,
        series: [{}, ...chart.series.map((s, i) => ({ label: s, stroke: COLOURS[i % COLOURS.length] }))],
      };
      return new uPlot(options, [data.t, ...chart.series.map((s) => data[s])], row);
    });
    entities[entityName] = { data, plots };
    return entities[entityName];
  }

  function addPoints(points) {
    for (const [entityName, list] of Object.entries(points)) {
      const e = entity(entityName);
      for (const p of list) {
        if (e.data.t.length && p.t <= e.data.t[e.data.t.length - 1]) continue; // sent again after a reconnect
        e.data.t.push(p.t);
        for (const chart of CHARTS) {
          for (const s of chart.series) e.data[s].push(s === "goal" ? goals[entityName] ?? null : p[s]);
        }
        after = Math.max(after, p.t);
      }
      while (e.data.t.length && e.data.t[0] < after - HOUR) {
        for (const key of Object.keys(e.data)) e.data[key].shift();
      }
      e.plots.forEach((plot, i) => plot.setData([e.data.t, ...CHARTS[i].series.map((s) => e.data[s])]));
    }
  }

  function table(id, header, rows) {
    const node = document.getElementById(id);
    node.replaceChildren();
    const head = element("tr", undefined, node);
    for (const h of header) element("th", h, head);
    for (const r of rows) {
      const tr = element("tr", undefined, node);
      for (const c of r) element("td", c === null || c === undefined ? "-" : String(c), tr);
    }
  }

  const decisions = [];
  const logs = {};
  const seen = new Set();
  function render(snapshot) {
    const row = snapshot.endpoint;
    goals = Object.fromEntries(row.entities.map((e) => [e.name, e.slo_ms]));
    document.getElementById("flags").textContent = row.flags.join("; ");
    table(
      "entities",
      ["served entity", "model", "version", "share", "ready", "desired", "requests/s", "5xx/s", "p99 / goal (ms)"],
      row.entities.map((e) => [
        e.name, e.model, e.version, e.traffic_percentage + " %", e.ready, e.desired,
        e.requests_per_s.toFixed(1), e.errors_per_s.toFixed(2),
        `${e.p99_ms === null ? "-" : e.p99_ms.toFixed(0)} / ${e.slo_ms ?? "-"}`,
      ]),
    );
    for (const d of snapshot.decisions) {
      const key = `${d.t} ${d.entity}`;
      if (!seen.has(key)) { seen.add(key); decisions.push(d); }
    }
    decisions.splice(0, Math.max(0, decisions.length - 50));
    table(
      "decisions",
      ["time", "served entity", "replicas", "target", "reason", "applied"],
      decisions.slice().reverse().map((d) => [
        new Date(d.t * 1000).toLocaleTimeString(), d.entity, d.replicas, d.target_concurrency.toFixed(2),
        d.reason, d.applied === null ? "-" : d.applied ? "yes" : "failed: " + (d.error || ""),
      ]),
    );
    const replicas = document.getElementById("replicas");
    replicas.replaceChildren();
    for (const r of snapshot.replicas) {
      element("h3", `${r.served_entity} v${r.model_version}: pid ${r.pid}, ${r.alive ? "alive" : "dead"}, ` +
        `${r.outstanding} in flight`, replicas);
      if (r.log !== null) logs[r.pid] = r.log.join("\n"); // sent every few seconds: kept in between
      element("pre", logs[r.pid] || "", replicas);
    }
    const canary = snapshot.canary;
    document.getElementById("canary").textContent = canary
      ? `${canary.status}: challenger ${canary.challenger} at ${canary.traffic} % against ${canary.champion}; ` +
        `last decision ${canary.last_decision ?? "-"}: ${canary.last_reason ?? ""}`
      : "none";
    monitoring(snapshot.monitoring);
    splitForm(row.entities);
    addPoints(snapshot.points);
    status.textContent = `${row.ready}, live at ${new Date(snapshot.t * 1000).toLocaleTimeString()}`;
  }

  function monitoring(latest) {
    const box = document.getElementById("monitoring");
    if (!latest) return;
    box.replaceChildren();
    element("p", `${latest.verdict} (${latest.rows} served rows), ${new Date(latest.at).toLocaleString()}`, box);
    if (latest.findings.length) element("p", latest.findings.join("; "), box).className = "error";
    for (const [label, v] of Object.entries(latest.versions)) {
      const drifted = (v.drifted || []).join(", ") || "none";
      element("p", `${label}: drift share ${v.drift_share ?? "-"}, drifted ${drifted}; report ${v.report ?? "-"}`, box);
    }
  }

  let formFor = "";
  function splitForm(list) {
    const form = document.getElementById("split");
    const names = list.map((e) => e.name).join(",");
    if (!form || names === formFor) return;
    formFor = names;
    form.replaceChildren();
    for (const e of list) {
      const label = element("label", e.name + " ", form);
      const input = element("input", undefined, label);
      input.type = "number"; input.min = "0"; input.max = "100"; input.name = e.name; input.value = e.traffic_percentage;
      element("span", " %", label);
    }
    element("button", "Set the split", form).type = "submit";
  }

  const form = document.getElementById("split");
  if (form) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const routes = [...form.querySelectorAll("input")].map((i) => ({
        served_model_name: i.name, traffic_percentage: Number(i.value),
      }));
      const shown = routes.map((r) => `${r.served_model_name} ${r.traffic_percentage} %`).join(", ");
      if (!window.confirm(`Set the traffic split of ${name} to ${shown}?`)) return;
      const answer = await fetch(api + "/traffic", {
        method: "POST",
        headers: { "content-type": "application/json", "x-tollfree-console": "1" },
        body: JSON.stringify({ routes }),
      });
      const body = await answer.json();
      document.getElementById("split-status").textContent = answer.ok
        ? `set: the endpoint's config update is ${body.state.config_update}`
        : `refused: ${body.message}`;
    });
  }

  fetch(api).then((r) => r.json()).then((snapshot) => {
    render(snapshot);
    const events = new EventSource(`${api}/events?after=${after}`);
    events.addEventListener("tick", (event) => render(JSON.parse(event.data)));
    events.addEventListener("gone", () => { status.textContent = "this endpoint was deleted"; events.close(); });
    events.onerror = () => { status.textContent = "reconnecting..."; };
  });
})();
