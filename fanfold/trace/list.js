// fanfold ui: the list of trees. Texts from the log go in with textContent only.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);

  function cell(text) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "—" : String(text);
    return td;
  }

  function secs(s) {
    if (s < 1) return (s * 1000).toFixed(0) + " ms";
    if (s < 120) return s.toFixed(1) + " s";
    return (s / 60).toFixed(1) + " min";
  }

  function render(data) {
    $("db").textContent = data.db;
    const table = $("trees");
    const head = document.createElement("tr");
    for (const name of ["tree", "status", "waits for you", "started (UTC)", "duration", "agents", "tokens", "cost", "task"]) {
      const th = document.createElement("th");
      th.textContent = name;
      head.append(th);
    }
    const rows = [head];
    for (const t of data.trees) {
      const tr = document.createElement("tr");
      tr.className = "tree " + t.status + (t.requests ? " asking" : "");
      const link = document.createElement("a");
      link.href = "/trace/" + encodeURIComponent(t.id);
      link.textContent = t.id;
      const first = document.createElement("td");
      first.append(link);
      const status = t.status + (t.running ? " (" + t.running + " running)" : "");
      // Open requests for a person's decision (issue 35), if the server counted them.
      const asking = t.requests ? t.requests + " request(s)" : "";
      const waits = cell(asking);
      if (t.requests) waits.className = "requests";
      tr.append(first, cell(status), waits,
        cell(new Date(t.created_at * 1000).toISOString().replace("T", " ").slice(0, 19)),
        cell(secs(t.duration)), cell(t.agents), cell(t.tokens),
        cell(t.cost === null ? null : "$" + t.cost.toFixed(4)), cell(t.task.slice(0, 120)));
      rows.push(tr);
    }
    table.replaceChildren(...rows);
  }

  render(JSON.parse($("trees-data").textContent));
  if (window.EventSource) {
    const events = new EventSource("/events");
    const refresh = () => {
      fetch("/api/trees").then((r) => r.json()).then((trees) => {
        render({ db: $("db").textContent, trees: trees });
      }).catch(() => {});
    };
    events.addEventListener("changed", refresh);
    // What changed since this page was made (the stream compares with the version
    // it read before it opened), and again after a reconnection.
    events.addEventListener("open", refresh);
  }
  document.body.setAttribute("data-ready", "1");
})();
