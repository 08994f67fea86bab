// fanfold trace page. Every text from the log is untrusted (model and tool output):
// it is only ever put in the page with textContent or as an attribute value, never
// as markup. The data comes from a JSON block (not a script), parsed with JSON.parse.
"use strict";
(function () {
  const ROW = 22;
  const LONG = 600;
  const SHOWN = 100;
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function secs(s) {
    if (s === null || s === undefined) return "?";
    if (Math.abs(s) < 1) return (s * 1000).toFixed(1) + " ms";
    if (Math.abs(s) < 120) return s.toFixed(2) + " s";
    return (s / 60).toFixed(1) + " min";
  }

  function short(text, n) {
    text = String(text || "").replace(/\s+/g, " ");
    return text.length > n ? text.slice(0, n - 1) + "…" : text;
  }

  const GLYPH = { completed: "✓", failed: "✗", cancelled: "⊘", error: "✗", idle: "●",
    running: "…", unknown: "?" };

  // ------------------------------------------------------------------ state
  let data = null;
  let view = [];          // indices of agents shown (filtered), in tree order
  let selected = 0;       // agent index
  let step = 0;           // slider position
  let phaseAt = [];       // phase of each agent after `step` (null: not created yet)
  let liveAtEnd = true;
  let live = null;        // fanfold ui's URLs, or null for a file
  let zoomed = false;     // false: the timeline shows the whole trace
  let zoomFrom = 0;       // the window shown: [zoomFrom, zoomFrom + zoomSpan] seconds
  let zoomSpan = 1;
  let hay = null;         // the searchable texts, built at the first search
  let hits = [];          // the last search's hits
  let hitAt = -1;         // the hit last jumped to
  let parted = new Map(); // agent index -> its pair in data.compare, when it parts
  let searching = 0;      // the typed search's pending timer
  let searchedFor = "";   // the text the hits are for

  function load(newData) {
    data = newData;
    const steps = data.steps;
    if (liveAtEnd || step >= steps.length) step = Math.max(0, steps.length - 1);
    if (selected >= data.agents.length) selected = 0;
    hay = null;
    if (!zoomed) { zoomFrom = 0; zoomSpan = full(); }
    indexParted();
    renderHeader();
    renderRequests();
    applyFilter();
    if ($("search").value.trim()) runSearch();
    const slider = $("step");
    slider.max = String(Math.max(0, steps.length - 1));
    slider.value = String(step);
    slider.disabled = steps.length === 0;
    setStep(step);
    showDetail(selected);
  }

  // ------------------------------------------------------------------ header
  function renderHeader() {
    const root = data.agents[0];
    const totals = data.agents.reduce((acc, a) => {
      acc.input += a.tokens.input; acc.output += a.tokens.output; return acc;
    }, { input: 0, output: 0 });
    const counts = {};
    for (const a of data.agents) counts[a.status] = (counts[a.status] || 0) + 1;
    const when = new Date(data.started_at * 1000);
    const h = $("summary");
    h.replaceChildren(
      el("h1", { text: "fanfold trace " + data.root }),
      el("span", { class: "stat", text: root ? root.status : "" }),
      el("span", { class: "stat", text: when.toISOString().replace("T", " ").slice(0, 19) + " UTC" }),
      el("span", { class: "stat", text: "duration " + secs(data.duration) }),
      el("span", { class: "stat", text: data.agents.length + " agent(s): " +
        Object.entries(counts).map(([k, v]) => v + " " + k).join(", ") }),
      el("span", { class: "stat", text: "tokens " + totals.input + " in / " + totals.output + " out" }),
      ...[forkNode(), compareButton()].filter((n) => n !== null),
    );
    const banner = $("banner");
    banner.replaceChildren();
    if (data.divergence) {
      banner.append(
        el("span", { text: "This log fails verify: " + data.divergence.headline + " " }),
        el("button", { id: "open-divergence", class: "btn", text: "Show divergence (d)",
          onclick: openDivergence }),
      );
      banner.hidden = false;
    } else if (data.findings.length) {
      banner.append(el("span", { text: "The log is damaged: " + data.findings.join("; ") }));
      banner.hidden = false;
    } else {
      banner.hidden = true;
    }
  }

  // ------------------------------------------------------------------ requests
  // Requests for a person's decision (issue 35): every agent's, open ones first.
  // Their texts (arguments, questions, reasons, answers) are the model's or a
  // person's: textContent only. In fanfold ui an open request gets Approve (its
  // arguments editable as JSON) / Deny (a reason) or, for a question, an answer;
  // each POSTs JSON to the server, which writes the decision as `fanfold approve`.
  let requestsKey = null;

  function when(t) {
    return new Date((data.started_at + t) * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  function pretty(text) {
    try { return JSON.stringify(JSON.parse(text), null, 1); } catch (e) { return String(text); }
  }

  function renderRequests() {
    const all = [];
    for (const a of data.agents) for (const r of a.requests || []) all.push([a, r]);
    // Redrawn only when a request or a decision changed: a live update must not wipe
    // what a person is typing.
    const key = JSON.stringify(all.map(([, r]) => [r.id, r.open, r.decision]));
    if (key === requestsKey) return;
    requestsKey = key;
    const box = $("requests");
    if (!all.length) { box.replaceChildren(); box.hidden = true; return; }
    all.sort((x, y) => (y[1].open - x[1].open) || (x[1].asked_at - y[1].asked_at));
    const open = all.filter(([, r]) => r.open).length;
    // A decision of another request, arriving live, redraws the panel: what a person
    // typed in a request still open (a reason, an answer, edited arguments) and where
    // the cursor was survive it (seen: a typed reason lost to an approval's redraw).
    const fields = () => box.querySelectorAll("[data-request] input, [data-request] textarea");
    const fieldKey = (f) => f.closest("[data-request]").dataset.request + " " + f.className;
    const typed = new Map();
    let focused = null;
    for (const f of fields()) {
      if (f.value !== f.defaultValue) typed.set(fieldKey(f), f.value);
      if (f === document.activeElement) focused = fieldKey(f);
    }
    box.replaceChildren(el("h2", { text: open + " open request(s) for a decision, " +
      (all.length - open) + " closed" }), ...approveAll(all), ...all.map(([a, r]) => requestNode(a, r)));
    box.hidden = false;
    for (const f of fields()) {
      const key = fieldKey(f);
      if (typed.has(key)) f.value = typed.get(key);
      if (key === focused) f.focus();
    }
  }

  // "Approve all": one POST granting every open approval request shown here (the
  // ids the page shows: never one asked after the person looked); questions are
  // left to be answered.
  function approveAll(all) {
    const ids = all.filter(([, r]) => r.open && !r.decision && r.question === null).map(([, r]) => r.id);
    if (!live || ids.length < 2) return [];
    const status = el("span", { class: "decide-status", role: "status" });
    const button = el("button", { id: "approve-all", class: "btn approve",
      text: "Approve all " + ids.length + " open call(s)" });
    button.addEventListener("click", () => {
      button.disabled = true;
      status.textContent = "sending…";
      fetch("/api/approve-all", { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ requests: ids }), credentials: "same-origin" })
        .then((answer) => answer.text().then((text) => {
          if (!answer.ok) { status.textContent = "not written: " + text; button.disabled = false; return; }
          const done = JSON.parse(text);
          const missed = Object.entries(done.closed).map(([id, why]) => id + ": " + why)
            .concat(done.decided_already.map((id) => id + ": decided already"),
              done.not_open.map((id) => id + ": no longer open"));
          status.textContent = done.approved.length + " approved: the run takes them within a moment" +
            (missed.length ? "; not approved: " + missed.join("; ") : "");
        }))
        .catch((e) => { status.textContent = "not sent: " + e; button.disabled = false; });
    });
    return [el("div", { class: "decide" }, button, " ", status)];
  }

  function requestNode(agent, r) {
    const node = el("div", { class: "request " + (r.open ? "open" : "closed"), "data-request": r.id });
    const what = r.question !== null ? "asks: " + r.question : r.tool;
    node.append(el("div", { class: "request-head" },
      el("b", { text: agent.id }), " ", el("span", { text: what }),
      el("span", { class: "kv", text: " · " + r.rule + " · asked " + when(r.asked_at) })));
    if (r.question !== null) {
      if (r.choices.length) node.append(el("div", { class: "kv", text: "choices: " + r.choices.join(" | ") }));
    } else {
      node.append(el("pre", { class: "args", text: pretty(r.arguments) }));
    }
    const d = r.decision;
    if (d) {
      const verb = { grant: "approved", deny: "denied", answer: "answered" }[d.kind] || d.kind;
      const line = el("div", { class: "decision " + d.kind,
        text: verb + (d.kind === "grant" && d.arguments !== null ? " with edited arguments" : "") +
          " by " + (d.by || "(unnamed)") + " at " + when(d.at) +
          " (" + secs(d.at - r.asked_at) + " after it was asked)" });
      node.append(line);
      if (d.kind === "grant" && d.arguments !== null) node.append(el("pre", { class: "args edited", text: pretty(d.arguments) }));
      if (d.kind !== "grant" && d.text) node.append(el("div", { class: "kv", text: (d.kind === "deny" ? "reason: " : "answer: ") + d.text }));
    } else if (r.open) {
      const age = Date.now() / 1000 - (data.started_at + r.asked_at);
      node.append(el("div", { class: "kv", text: "waiting " + secs(Math.max(0, age)) }));
      if (live) node.append(decideControls(r));
      else node.append(el("div", { class: "kv", text: "decide with: fanfold approve / deny / answer " + r.id + " (or in fanfold ui)" }));
    } else {
      node.append(el("div", { class: "kv", text: "ended without a decision (a cancel, a deadline or its approval timeout)" }));
    }
    return node;
  }

  function decideControls(r) {
    const status = el("span", { class: "decide-status", role: "status" });
    const box = el("div", { class: "decide" });
    const send = (route, body, buttons) => {
      for (const b of buttons) b.disabled = true;
      status.textContent = "sending…";
      fetch(route, { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body), credentials: "same-origin" })
        .then((answer) => answer.text().then((text) => {
          if (answer.ok) {
            status.textContent = "decision written: the run takes it within a moment (or at its next resume)";
            box.setAttribute("data-sent", "1");
          } else {
            status.textContent = "not written: " + text;
            for (const b of buttons) b.disabled = false;
          }
        }))
        .catch((e) => { status.textContent = "not sent: " + e; for (const b of buttons) b.disabled = false; });
    };
    const reason = el("input", { type: "text", class: "reason", placeholder: "reason (shown to the model)",
      "aria-label": "reason for denying " + r.id, size: 32 });
    const deny = el("button", { class: "btn deny", text: r.question !== null ? "Decline" : "Deny" });
    if (r.question !== null) {
      const text = el("input", { type: "text", class: "answer", placeholder: "your answer",
        "aria-label": "answer to " + r.id, size: 32 });
      const answer = el("button", { class: "btn answer", text: "Answer" });
      const buttons = [answer, deny];
      answer.addEventListener("click", () => send("/api/answer", { request: r.id, text: text.value }, buttons));
      const choices = r.choices.map((c) => el("button", { class: "btn choice", text: c,
        onclick: () => { text.value = c; } }));
      box.append(el("div", {}, text, " ", answer, " ", ...choices));
    } else {
      const original = pretty(r.arguments);
      const args = el("textarea", { class: "edit-args", rows: 3, cols: 60, spellcheck: "false",
        "aria-label": "arguments of " + r.id + " (edit to approve with other arguments)" });
      args.value = original;
      const approve = el("button", { class: "btn approve", text: "Approve" });
      const buttons = [approve, deny];
      approve.addEventListener("click", () => {
        const body = { request: r.id };
        if (args.value !== original) {
          try { body.arguments = JSON.parse(args.value); } catch (e) {
            status.textContent = "the edited arguments are not JSON: " + e.message; return;
          }
        }
        send("/api/approve", body, buttons);
      });
      box.append(args, el("div", {}, approve));
    }
    deny.addEventListener("click", () => send("/api/deny", { request: r.id, reason: reason.value },
      Array.from(box.querySelectorAll("button"))));
    box.append(el("div", {}, reason, " ", deny, " ", status));
    return box;
  }

  // Where a fork came from, and a link to the original's page: fanfold ui's route,
  // or, in a file, the file `fanfold trace ORIGINAL` writes beside this one (its
  // name is made of safe characters by the builder).
  function forkNode() {
    const f = data.fork;
    if (!f) return null;
    const node = el("span", { id: "fork", class: "stat" }, "fork of " + f.source + "@" + f.seq + " ");
    if (f.source_tree === null) {
      node.append(el("span", { text: "(the original is not in this database)" }));
    } else {
      const href = live ? "/trace/" + encodeURIComponent(f.source_tree) : f.file;
      node.append(el("a", { id: "original", href: href,
        title: live ? null : "the page `fanfold trace " + f.source_tree + "` writes next to this one",
        text: "original " + f.source_tree }));
    }
    return node;
  }

  function compareButton() {
    const c = data.compare;
    if (!c) return null;
    if (c.error) return el("span", { class: "stat bad", text: "cannot show it beside " +
      (c.this === "b" ? c.a : c.b) + ": " + c.error });
    const other = c.this === "b" ? c.a : c.b;
    return el("button", { id: "open-compare", class: "btn", onclick: () => openCompare(null),
      text: (c.this === "b" ? "Beside the original" : "Beside " + other) + " (" +
        parted.size + " agent(s) part) (c)" });
  }

  function indexParted() {
    parted = new Map();
    const c = data.compare;
    if (!c || c.error) return;
    const byId = new Map(data.agents.map((a) => [a.id, a.index]));
    for (const pair of c.agents) {
      const mine = c.this === "b" ? pair.b : pair.a;
      const differs = pair.parting !== null || pair.a === null || pair.b === null;
      if (mine !== null && differs && byId.has(mine)) parted.set(byId.get(mine), pair);
    }
  }

  // ------------------------------------------------------------------ zoom
  // The timeline shows a window of the trace, [zoomFrom, zoomFrom + zoomSpan] seconds;
  // marks are placed in percent of the window and clipped to it.
  function full() { return data.duration > 0 ? data.duration : 1; }

  function setWindow(from, span) {
    const all = full();
    span = Math.max(Math.min(span, all), all / 1e6, 1e-6);
    from = Math.max(0, Math.min(from, all - span));
    zoomFrom = from;
    zoomSpan = span;
    zoomed = span < all;
    $("zoom-label").textContent = zoomed ? "zoom " + (all / span).toPrecision(3) + "x from +" +
      secs(from) : "whole trace";
    renderAxis();
    renderRows();
  }

  // Zoom by `factor` keeping the time at `frac` (0..1 across the window) in place.
  function zoomAt(factor, frac) {
    const at = zoomFrom + frac * zoomSpan;
    const span = zoomSpan / factor;
    setWindow(at - frac * span, span);
  }

  function panBy(frac) { setWindow(zoomFrom + frac * zoomSpan, zoomSpan); }

  // Where clientX falls across the bars, 0..1 (null: outside them).
  function barsFraction(clientX) {
    const bars = document.querySelector("#rows .bars") || $("axis");
    const r = bars.getBoundingClientRect();
    if (r.width <= 0 || clientX < r.left || clientX > r.right) return null;
    return (clientX - r.left) / r.width;
  }

  // The keyboard's zoom keeps the step cursor in place when it is in view.
  function keyFraction() {
    if (data.steps.length) {
      const f = (data.steps[step][2] - zoomFrom) / zoomSpan;
      if (f >= 0 && f <= 1) return f;
    }
    return 0.5;
  }

  function onWheel(ev, always) {
    const horizontal = Math.abs(ev.deltaX) > Math.abs(ev.deltaY);
    if (ev.ctrlKey || ev.metaKey || (always && !ev.shiftKey && !horizontal)) {
      const frac = barsFraction(ev.clientX);
      const steps = Math.max(-5, Math.min(5, -ev.deltaY / 100));
      zoomAt(Math.pow(1.25, steps), frac === null ? 0.5 : frac);
      ev.preventDefault();
    } else if (ev.shiftKey || horizontal) {
      const delta = horizontal ? ev.deltaX : ev.deltaY;
      panBy(Math.max(-0.5, Math.min(0.5, delta / 1000)));
      ev.preventDefault();
    }
  }

  function onAxisDrag(ev) {
    if (ev.button !== 0) return;
    const axis = $("axis");
    const width = axis.getBoundingClientRect().width || 1;
    let lastX = ev.clientX;
    const move = (e) => { panBy(-(e.clientX - lastX) / width); lastX = e.clientX; };
    const up = () => {
      window.removeEventListener("mousemove", move);
      window.removeEventListener("mouseup", up);
    };
    window.addEventListener("mousemove", move);
    window.addEventListener("mouseup", up);
    ev.preventDefault();
  }

  // ------------------------------------------------------------------ timeline
  function applyFilter() {
    const query = $("filter").value.trim().toLowerCase();
    const badOnly = $("bad-only").checked;
    view = [];
    for (const a of data.agents) {
      if (badOnly && !["failed", "cancelled", "error"].includes(a.status)) continue;
      if (query && !(a.id.toLowerCase().includes(query) || a.task.toLowerCase().includes(query)
        || a.status.includes(query))) continue;
      view.push(a.index);
    }
    $("rows-inner").style.height = view.length * ROW + "px";
    $("shown").textContent = view.length + " of " + data.agents.length + " agent(s) shown";
    renderAxis();
    renderRows();
  }

  // A time's place across the window, in percent (outside 0..100 when out of it).
  function pct(t) { return ((t - zoomFrom) / zoomSpan) * 100; }

  // The style placing [t0, t1] in the window, clipped to it; null when out of view.
  function place(t0, t1, minWidth) {
    const end = zoomFrom + zoomSpan;
    if (t1 < zoomFrom || t0 > end) return null;
    const left = Math.max(0, pct(t0));
    const right = Math.min(100, pct(t1));
    return "left:" + left + "%;width:" + Math.max(minWidth, right - left) + "%";
  }

  function renderAxis() {
    const axis = $("axis");
    axis.replaceChildren();
    const raw = zoomSpan / 8;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const tick = [1, 2, 5, 10].map((m) => m * mag).find((v) => v >= raw) || raw;
    const first = Math.ceil(zoomFrom / tick - 1e-9);
    for (let k = first; k * tick <= zoomFrom + zoomSpan + 1e-9; k++) {
      axis.append(el("span", { text: "+" + secs(k * tick), style: "left:" + pct(k * tick) + "%" }));
    }
  }

  function markClass(m) {
    let c = "m m-" + m.k;
    if (m.error === "aborted") c += " aborted";
    else if (m.error && m.k !== "retry") c += " err";
    if (m.open) c += " open";
    return c;
  }

  function renderRows() {
    const box = $("rows");
    const inner = $("rows-inner");
    const first = Math.max(0, Math.floor(box.scrollTop / ROW) - 5);
    const last = Math.min(view.length, Math.ceil((box.scrollTop + box.clientHeight) / ROW) + 5);
    const nodes = [];
    const div = data.divergence;
    for (let i = first; i < last; i++) {
      const a = data.agents[view[i]];
      const phase = phaseAt[a.index];
      let cls = "row " + a.status;
      if (a.index === selected) cls += " selected";
      if (phase === null || phase === undefined) cls += " absent";
      if (div && div.agent === a.index) cls += " diverged";
      const bars = el("div", { class: "bars" });
      const life = place(a.start, a.end, 0.1);
      if (life) bars.append(el("div", { class: "life", "data-a": a.index, "data-m": -1, style: life }));
      a.marks.forEach((m, j) => {
        const where = place(m.t0, m.t1, 0);
        if (where) bars.append(el("div", { class: markClass(m), "data-a": a.index, "data-m": j, style: where }));
      });
      if (div && div.agent === a.index && place(div.at, div.at, 0)) {
        bars.append(el("div", { class: "m m-div", "data-a": a.index, "data-m": -2,
          style: "left:" + pct(div.at) + "%" }));
      }
      const label = el("div", { class: "label" },
        el("span", { style: "display:inline-block;width:" + Math.min(a.depth, 12) * 12 + "px" }),
        el("span", { class: "glyph", text: GLYPH[a.status] || "?" }),
        parted.has(a.index) ? el("span", { class: "parts", text: "≠",
          title: "parts from " + (data.compare.this === "b" ? "the original" : data.compare.b) }) : null,
        el("span", { class: "aid", text: a.index === 0 ? a.id : a.id.slice(a.id.lastIndexOf(".")) }),
        " ",
        el("span", { class: "task", text: short(a.task, 60) }),
        el("span", { class: "phase", text: phase ? phase : "" }),
      );
      nodes.push(el("div", { class: cls, role: "option", "aria-selected": a.index === selected,
        id: "row-" + a.index, "data-index": a.index, style: "top:" + i * ROW + "px" }, label, bars));
    }
    const cursor = el("div", { id: "cursor" });
    if (data.steps.length) {
      const at = data.steps[step][2];
      cursor.style.left = "calc(var(--label) + (100% - var(--label)) * " + pct(at) / 100 + ")";
      cursor.style.height = Math.max(view.length * ROW, box.clientHeight) + "px";
      cursor.hidden = !place(at, at, 0);
    }
    inner.replaceChildren(...nodes, cursor);
    box.setAttribute("aria-activedescendant", "row-" + selected);
  }

  function tooltipText(a, j) {
    if (j === -1) {
      return [a.id + " (" + a.status + ")", "lifetime " + secs(a.end - a.start) +
        " from +" + secs(a.start), "tokens " + a.tokens.input + " in / " + a.tokens.output +
        " out" + (a.tokens.cached ? " (" + a.tokens.cached + " cached)" : ""),
        "subtree tokens " + a.tokens.subtree, "task: " + short(a.task, 80)].join("\n");
    }
    if (j === -2) return "first divergence: " + data.divergence.headline;
    const m = a.marks[j];
    const lines = [m.label, "duration " + secs(m.t1 - m.t0) + " from +" + secs(m.t0)];
    if (m.tokens) lines.push("tokens " + m.tokens.input + " in / " + m.tokens.output + " out" +
      (m.tokens.cached ? " (" + m.tokens.cached + " cached)" : ""));
    if (m.stop) lines.push("stop reason " + m.stop);
    if (m.tools && m.tools.length) lines.push("tool calls: " + short(m.tools.join(", "), 80));
    if (m.error) lines.push("error: " + m.error + (m.message ? " — " + short(m.message, 80) : ""));
    if (m.open) lines.push("still in flight when the log ends");
    // The latest progress report of a running tool call: the server's own text, shown
    // as text (the tooltip's textContent), never as markup.
    if (m.progress) lines.push("progress: " + short(m.progress, 120) + " (" + m.progress_reports + " report(s))");
    return lines.join("\n");
  }

  function onHover(ev) {
    const tip = $("tooltip");
    const target = ev.target.closest("[data-m]");
    if (!target) { tip.hidden = true; return; }
    const a = data.agents[Number(target.getAttribute("data-a"))];
    tip.textContent = tooltipText(a, Number(target.getAttribute("data-m")));
    tip.hidden = false;
    const x = Math.min(ev.clientX + 12, window.innerWidth - tip.offsetWidth - 8);
    const y = Math.min(ev.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }

  function select(index, scroll) {
    selected = index;
    const pos = view.indexOf(index);
    const box = $("rows");
    if (scroll && pos >= 0) {
      const top = pos * ROW;
      if (top < box.scrollTop) box.scrollTop = top;
      else if (top + ROW > box.scrollTop + box.clientHeight) box.scrollTop = top + ROW - box.clientHeight;
    }
    renderRows();
    showDetail(index);
  }

  function onRowsKey(ev) {
    if (!view.length) return;
    if (ev.shiftKey && (ev.key === "ArrowLeft" || ev.key === "ArrowRight")) {
      panBy(ev.key === "ArrowLeft" ? -0.2 : 0.2);
      ev.preventDefault();
      return;
    }
    let pos = Math.max(0, view.indexOf(selected));
    const page = Math.max(1, Math.floor($("rows").clientHeight / ROW) - 1);
    switch (ev.key) {
      case "ArrowDown": pos += 1; break;
      case "ArrowUp": pos -= 1; break;
      case "PageDown": pos += page; break;
      case "PageUp": pos -= page; break;
      case "Home": pos = 0; break;
      case "End": pos = view.length - 1; break;
      case "ArrowRight": {
        const a = data.agents[selected];
        if (a.children.length) { select(a.children[0], true); ev.preventDefault(); }
        return;
      }
      case "ArrowLeft": {
        const a = data.agents[selected];
        if (a.parent !== null) { select(a.parent, true); ev.preventDefault(); }
        return;
      }
      case "Enter": $("detail").focus(); ev.preventDefault(); return;
      default: return;
    }
    ev.preventDefault();
    pos = Math.max(0, Math.min(view.length - 1, pos));
    select(view[pos], true);
  }

  // ------------------------------------------------------------------ steps
  function setStep(k) {
    const steps = data.steps;
    step = Math.max(0, Math.min(k, steps.length - 1));
    liveAtEnd = step === steps.length - 1;
    phaseAt = new Array(data.agents.length).fill(null);
    for (let i = 0; i <= step && i < steps.length; i++) phaseAt[steps[i][0]] = steps[i][3];
    $("step").value = String(step);
    const info = $("step-info");
    if (!steps.length) { info.textContent = "no steps"; return; }
    const s = steps[step];
    const a = data.agents[s[0]];
    const lines = [
      "step " + (step + 1) + "/" + steps.length + "  " + a.id + " seq " + s[1] + "  +" + secs(s[2]),
      "event: " + s[4],
      "effects:" + (s[5].length ? "" : " (none)"),
      ...s[5].map((e) => "  - " + e),
      "state after: " + s[6],
    ];
    if (!s[7]) lines.push("the reducer does not reproduce this step (see the divergence)");
    info.textContent = lines.join("\n");
    info.classList.toggle("mismatch", !s[7]);
    $("step-label").textContent = "step " + (step + 1) + " of " + steps.length;
    renderRows();
  }

  // ------------------------------------------------------------------ detail
  function folded(text, cls) {
    text = String(text === null || text === undefined ? "" : text);
    if (text.length <= LONG) return el("div", { class: "text " + (cls || ""), text: text });
    return el("details", { class: cls || "" },
      el("summary", { text: short(text, 160) + " (" + text.length + " characters)" }),
      el("div", { class: "text", text: text }));
  }

  function prettyJson(text) {
    try { return JSON.stringify(JSON.parse(text), null, 2); } catch (e) { return String(text); }
  }

  function agentLink(index) {
    const a = data.agents[index];
    return el("button", { class: "linkish", text: a.id, onclick: () => select(index, true) });
  }

  function outcomeNode(o) {
    const bad = ["failed", "error"].includes(o.status);
    const what = o.status + " (" + refusedOr(o) + ")";
    const text = o.explanation !== undefined ? o.explanation : o.text;
    return el("div", { class: "outcome " + (bad ? "bad" : o.status === "cancelled" ? "cancel" : "") },
      el("strong", { text: o.kind ? what : o.status }), text ? folded(text) : null);
  }

  // A failure's kind; a refusal as "refused (its category)", its explanation apart.
  function refusedOr(o) {
    if (o.explanation !== undefined) return "refused" + (o.category ? ": " + o.category : "");
    return o.kind + (o.reason ? ", " + o.reason : "");
  }

  function showDetail(index) {
    const a = data.agents[index];
    const d = $("detail");
    if (!a) { d.replaceChildren(); return; }
    const byId = {};
    for (const c of a.children) byId[data.agents[c].id] = c;
    const parts = [
      el("h2", { text: a.id }),
      el("div", { class: "kv", text: "depth " + a.depth + " · " + a.rounds + " model round(s) · " +
        "lifetime " + secs(a.end - a.start) + " · tokens " + a.tokens.input + " in / " +
        a.tokens.output + " out" + (a.tokens.cached ? " (" + a.tokens.cached + " cached)" : "") +
        " · subtree " + a.tokens.subtree + (a.model ? " · model " + a.model : "") +
        (a.agent ? " · agent " + a.agent : "") +
        (a.refused_calls ? " · " + a.refused_calls + " tool call(s) refused by its permissions" : "") }),
      a.parent !== null ? el("div", {}, "parent: ", agentLink(a.parent)) : null,
      partsNode(a),
      el("h3", { text: "Outcome" }), outcomeNode(a.outcome),
      el("h3", { text: "Task" }), folded(a.task),
      el("h3", { text: "System prompt" }), folded(data.prompts[a.system_prompt] || "(none)"),
    ];
    if (a.child_outcomes.length) {
      parts.push(el("h3", { text: "Sub-agents' outcomes, as received (" + a.child_outcomes.length + ")" }));
      const box = el("div", { id: "child-outcomes" });
      const outcome = (c) => {
        const link = byId[c.id] !== undefined ? agentLink(byId[c.id]) : el("span", { text: c.id });
        const what = c.ok ? "completed" + (c.truncated ? " (truncated)" : "")
          : "failed (" + refusedOr(c) + ")";
        return el("div", { class: "msg " + (c.ok ? "assistant" : "tool error") },
          link, el("span", { text: " +" + secs(c.at) + " " + what + " · " + c.tokens + " tokens" }),
          folded(c.explanation !== undefined ? c.explanation : c.text));
      };
      // A large fan-out delivers hundreds: the first ones, then more on demand.
      const more = (from) => {
        const upto = Math.min(a.child_outcomes.length, from + SHOWN);
        box.append(...a.child_outcomes.slice(from, upto).map(outcome));
        if (upto < a.child_outcomes.length) {
          const button = el("button", { class: "btn", text: "show " +
            Math.min(SHOWN, a.child_outcomes.length - upto) + " more of " +
            (a.child_outcomes.length - upto),
            onclick: () => { button.remove(); more(upto); } });
          box.append(button);
        }
      };
      more(0);
      parts.push(box);
    }
    parts.push(el("h3", { text: "Messages (" + a.messages.length + ")" }));
    for (const [i, m] of a.messages.entries()) {
      const who = m.role === "tool" ? "tool result " + m.name + (m.error ? " (error)" : "")
        : m.role + (m.truncated ? " (cut off at the token limit)" : "");
      const box = el("div", { class: "msg " + m.role + (m.error ? " error" : ""), "data-msg": i },
        el("div", { class: "who", text: who }));
      if (m.text) box.append(folded(m.text));
      for (const call of m.calls || []) {
        box.append(el("div", { class: "who", text: "→ " + call.name + " (" + call.id + ")" }),
          folded(prettyJson(call.arguments)));
      }
      parts.push(box);
    }
    parts.push(el("h3", { text: "Timeline marks" }));
    const table = el("table", { class: "marks" },
      el("tr", {}, ...["what", "start", "duration", "tokens", "error"].map((t) => el("th", { text: t }))));
    for (const m of a.marks) {
      const what = m.progress ? m.label + " — progress: " + m.progress : m.label;
      table.append(el("tr", {}, el("td", { text: what, "data-progress": m.progress ? "1" : null }),
        el("td", { text: "+" + secs(m.t0) }),
        el("td", { text: secs(m.t1 - m.t0) + (m.open ? " (open)" : "") }),
        el("td", { text: m.tokens ? m.tokens.input + "/" + m.tokens.output : "" }),
        el("td", { text: m.error || "" })));
    }
    parts.push(table);
    d.replaceChildren(...parts.filter((p) => p !== null));
  }

  function partsNode(a) {
    const pair = parted.get(a.index);
    if (!pair) return null;
    const c = data.compare;
    const what = pair.a === null || pair.b === null ? "only in this tree"
      : "parts from " + (c.this === "b" ? "the original" : c.b) + " at item " + pair.parting;
    return el("div", { class: "parts-note" }, what + " ",
      el("button", { class: "linkish", text: "side by side", onclick: () => openCompare(pair) }));
  }

  // ------------------------------------------------------------------ search
  // Every message's text, tool call (name and arguments) and tool result, lower-cased
  // once, at the first search (and again after a live update).
  function buildHay() {
    hay = [];
    for (const a of data.agents) {
      a.messages.forEach((m, i) => {
        const field = m.role === "tool" ? "tool result " + m.name : m.role;
        if (m.text) hay.push({ a: a.index, m: i, field: field, text: m.text, low: m.text.toLowerCase() });
        for (const c of m.calls || []) {
          const text = c.name + " " + c.arguments;
          hay.push({ a: a.index, m: i, field: "tool call " + c.name, text: text, low: text.toLowerCase() });
        }
      });
    }
  }

  function snippet(h, query) {
    // Lower-casing keeps the length of nearly every text; where it does not, the
    // snippet is the text's start rather than a wrong slice.
    let at = h.low.indexOf(query);
    if (h.low.length !== h.text.length) at = -1;
    const node = el("span", { class: "snip" });
    if (at < 0) { node.append(short(h.text, 120)); return node; }
    const from = Math.max(0, at - 50);
    node.append((from > 0 ? "…" : "") + h.text.slice(from, at).replace(/\s+/g, " "),
      el("mark", { text: h.text.slice(at, at + query.length) }),
      short(h.text.slice(at + query.length), 80));
    return node;
  }

  function runSearch() {
    const query = $("search").value.trim().toLowerCase();
    const box = $("hits");
    hits = [];
    hitAt = -1;
    searchedFor = query;
    if (!query) { box.hidden = true; box.replaceChildren(); return; }
    const started = performance.now();
    if (hay === null) buildHay();
    const agents = new Set();
    for (const h of hay) {
      if (h.low.includes(query)) { hits.push(h); agents.add(h.a); }
    }
    const ms = performance.now() - started;
    const head = el("div", { id: "hits-head", text: hits.length + " hit(s) in " + agents.size +
      " agent(s) (" + ms.toFixed(1) + " ms) · Enter: next, Shift+Enter: previous" });
    const list = el("div", { id: "hits-list" });
    const more = (from) => {
      const upto = Math.min(hits.length, from + SHOWN);
      for (let k = from; k < upto; k++) {
        const h = hits[k];
        list.append(el("button", { class: "hit", "data-k": k, onclick: () => jump(k) },
          el("span", { class: "who", text: data.agents[h.a].id + " · " + h.field + " " }),
          snippet(h, query)));
      }
      if (upto < hits.length) {
        const button = el("button", { class: "btn", text: "show " +
          Math.min(SHOWN, hits.length - upto) + " more of " + (hits.length - upto),
          onclick: () => { button.remove(); more(upto); } });
        list.append(button);
      }
    };
    more(0);
    box.replaceChildren(head, list);
    box.setAttribute("data-ms", ms.toFixed(2));
    box.hidden = false;
  }

  // Show hit k: its agent selected (the filter cleared if it hides it), the message
  // in view in the detail, every match in it marked.
  function jump(k) {
    if (!hits.length) return;
    hitAt = ((k % hits.length) + hits.length) % hits.length;
    const h = hits[hitAt];
    if (!view.includes(h.a)) {
      $("filter").value = "";
      $("bad-only").checked = false;
      applyFilter();
    }
    select(h.a, true);
    for (const b of document.querySelectorAll("#hits-list .hit.current")) b.classList.remove("current");
    const button = document.querySelector('#hits-list .hit[data-k="' + hitAt + '"]');
    if (button) button.classList.add("current");
    const box = document.querySelector('#detail .msg[data-msg="' + h.m + '"]');
    if (!box) return;
    box.classList.add("found");
    for (const d of box.querySelectorAll("details")) d.open = true;
    highlight(box, $("search").value.trim().toLowerCase());
    box.scrollIntoView({ block: "center" });
  }

  // Mark every occurrence of `query` in the texts of `node`: the text split into text
  // nodes and <mark> elements (textContent only, as everywhere).
  function highlight(node, query) {
    for (const t of node.querySelectorAll(".text")) {
      const text = t.textContent;
      const low = text.toLowerCase();
      if (!query || low.length !== text.length || !low.includes(query)) continue;
      const pieces = [];
      let from = 0;
      for (let at = low.indexOf(query); at >= 0; at = low.indexOf(query, at + query.length)) {
        pieces.push(document.createTextNode(text.slice(from, at)),
          el("mark", { text: text.slice(at, at + query.length) }));
        from = at + query.length;
      }
      pieces.push(document.createTextNode(text.slice(from)));
      t.replaceChildren(...pieces);
    }
  }

  function onSearchKey(ev) {
    if (ev.key === "Enter") {
      clearTimeout(searching);  // Enter searches now: not again after the pause
      if ($("search").value.trim().toLowerCase() !== searchedFor) runSearch();
      jump(ev.shiftKey ? hitAt - 1 : hitAt + 1);
      ev.preventDefault();
    } else if (ev.key === "Escape") {
      $("search").value = "";
      runSearch();
      $("rows").focus();
      ev.preventDefault();
    }
  }

  // ------------------------------------------------------------------ side by side
  // The tree beside another (a fork beside its original), per agent: the items from
  // a few before the first where they part, aligned; the parting row and the lines
  // that differ marked. The pairs and lines are computed by the builder
  // (fanfold.replay.compare), not here.
  function openCompare(pair) {
    const c = data.compare;
    if (!c || c.error) return;
    const mine = (p) => (c.this === "b" ? p.b : p.a);
    if (!pair) {
      const chosen = data.agents[selected];
      pair = c.agents.find((p) => chosen && mine(p) === chosen.id && parted.has(chosen.index))
        || c.agents.find((p) => p.parting !== null || p.a === null || p.b === null) || c.agents[0];
    }
    const panel = $("compare");
    const label = (side) => (c.this === side ? " (this tree)" : c.this === "b" ? " (original)" : "");
    const picker = el("select", { id: "cmp-agent", "aria-label": "agent" });
    c.agents.forEach((p, k) => {
      const state = p.a === null ? "only in B" : p.b === null ? "only in A"
        : p.parting === null ? "the same" : "parts at item " + p.parting;
      const option = el("option", { value: k, text: p.path + " — " + state });
      if (p === pair) option.selected = true;
      picker.append(option);
    });
    picker.addEventListener("change", () => showPair(c.agents[Number(picker.value)]));
    panel.replaceChildren(
      el("button", { id: "close-compare", class: "btn", text: "Close (Esc)", onclick: closeCompare }),
      el("h2", { text: "Side by side" }),
      el("p", { class: "kv", text: "A: " + c.a + label("a") + " · B: " + c.b + label("b") +
        " · agents matched by their place in the tree; tool-call ids and the trees' own ids " +
        "are not differences" }),
      el("label", {}, "Agent ", picker),
      el("div", { id: "cmp-body" }));
    showPair(pair);
    panel.hidden = false;
    $("close-compare").focus();
  }

  function itemCell(item, differs) {
    const td = el("td", { class: "cmp-item" });
    if (item === null) { td.append(el("div", { class: "none", text: "(nothing: it ends before)" })); return td; }
    const [seq, kind, text, marked] = item;
    td.append(el("div", { class: "who", text: "seq " + seq + " · " + kind }));
    const lines = String(text).split("\n");
    const shown = new Set(marked || []);
    const whole = differs && marked === null;
    const box = el("div", { class: "text" });
    lines.forEach((line, n) => {
      box.append(el("div", { class: "ln" + (whole || shown.has(n) ? " dl" : ""), text: line || " " }));
    });
    td.append(box);
    return td;
  }

  function showPair(pair) {
    const body = $("cmp-body");
    const parts = [el("p", { id: "cmp-state", text: pair.a === null ? pair.path + " is only in B (" + pair.b + ")"
      : pair.b === null ? pair.path + " is only in A (" + pair.a + ")"
      : pair.parting === null ? pair.path + ": the same " + pair.a_count + " item(s) in both"
      : pair.path + " (" + pair.a + " / " + pair.b + ") parts at item " + pair.parting +
        " (" + pair.a_count + " / " + pair.b_count + " items)" })];
    if (pair.rows.length) {
      const table = el("table", { id: "cmp-table" },
        el("tr", {}, el("th", { text: "#" }), el("th", { text: "A " + (pair.a || "") }),
          el("th", { text: "B " + (pair.b || "") })));
      if (pair.from > 0) {
        table.append(el("tr", { class: "skipped" }, el("td", { colspan: 3,
          text: "items 0–" + (pair.from - 1) + ": the same in both (see the agents' messages)" })));
      }
      pair.rows.forEach(([a, b, differs], k) => {
        const index = pair.from + k;
        let cls = differs ? "differs" : "same";
        if (index === pair.parting) cls += " parting";
        table.append(el("tr", { class: cls, "data-item": index },
          el("td", { class: "idx", text: index + (index === pair.parting ? " ≠ first" : "") }),
          itemCell(a, differs), itemCell(b, differs)));
      });
      parts.push(table);
    }
    body.replaceChildren(...parts);
    const first = body.querySelector("tr.parting");
    if (first) first.scrollIntoView({ block: "nearest" });
  }

  function closeCompare() {
    $("compare").hidden = true;
    $("rows").focus();
  }

  // ------------------------------------------------------------------ divergence
  function openDivergence() {
    const v = data.divergence;
    if (!v) return;
    if (data.steps.length) setStep(v.step);
    select(v.agent, true);
    const panel = $("divergence");
    const cols = (left, right, a, b) => el("div", { class: "cols" },
      el("div", {}, el("h3", { text: left }), el("pre", { text: a })),
      el("div", {}, el("h3", { text: right }), el("pre", { text: b })));
    const parts = [
      el("button", { id: "close-divergence", class: "btn", text: "Close (Esc)", onclick: closeDivergence }),
      el("h2", { text: "First divergence" }),
      el("p", { text: v.headline }),
      v.before ? el("p", { class: "kv", text: "state before: " + v.before }) : null,
      ...v.notes.map((n) => el("p", { text: "note: " + n })),
      el("h3", { text: "Event" }), el("pre", { text: v.event }),
      el("h3", { text: "Effects" + (v.effects_match ? " (identical)" : " differ") }),
      cols("recorded", "recomputed", v.recorded_effects, v.recomputed_effects),
      el("h3", { text: "State fingerprint" + (v.fingerprint_match ? " (identical)" : " differs") }),
      el("pre", { text: v.fingerprint.join("\n") }),
    ];
    if (v.recorded_state !== null) {
      parts.push(el("h3", { text: "State (recorded snapshot vs recomputed)" }),
        cols("recorded", "recomputed", v.recorded_state, v.recomputed_state));
    }
    parts.push(el("p", { class: "kv", text: "recomputed state after: " + v.after }));
    panel.replaceChildren(...parts.filter((p) => p !== null));
    panel.hidden = false;
    $("close-divergence").focus();
  }

  function closeDivergence() {
    $("divergence").hidden = true;
    $("rows").focus();
  }

  // ------------------------------------------------------------------ wiring
  function typing(ev) {
    const t = ev.target;
    return t && (t.tagName === "TEXTAREA" ||
      (t.tagName === "INPUT" && (t.type === "text" || t.type === "search")));
  }

  function init() {
    const liveBlock = $("trace-live");
    if (liveBlock) live = JSON.parse(liveBlock.textContent);
    const source = $("trace-data");
    load(JSON.parse(source.textContent));
    const rows = $("rows");
    let pending = false;
    rows.addEventListener("scroll", () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => { pending = false; renderRows(); });
    });
    rows.addEventListener("click", (ev) => {
      const row = ev.target.closest(".row");
      if (row) select(Number(row.getAttribute("data-index")), false);
    });
    rows.addEventListener("keydown", onRowsKey);
    rows.addEventListener("wheel", (ev) => onWheel(ev, false), { passive: false });
    $("axis").addEventListener("wheel", (ev) => onWheel(ev, true), { passive: false });
    $("axis").addEventListener("mousedown", onAxisDrag);
    $("zoom-in").addEventListener("click", () => zoomAt(2, keyFraction()));
    $("zoom-out").addEventListener("click", () => zoomAt(0.5, keyFraction()));
    $("zoom-fit").addEventListener("click", () => setWindow(0, full()));
    $("search").addEventListener("input", () => {
      clearTimeout(searching);
      searching = setTimeout(runSearch, 120);
    });
    $("search").addEventListener("keydown", onSearchKey);
    rows.addEventListener("mousemove", onHover);
    rows.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
    $("step").addEventListener("input", (ev) => setStep(Number(ev.target.value)));
    $("prev").addEventListener("click", () => setStep(step - 1));
    $("next").addEventListener("click", () => setStep(step + 1));
    $("filter").addEventListener("input", applyFilter);
    $("bad-only").addEventListener("change", applyFilter);
    window.addEventListener("resize", renderRows);
    document.addEventListener("keydown", (ev) => {
      if (ev.key === "Escape" && !$("divergence").hidden) { closeDivergence(); return; }
      if (ev.key === "Escape" && !$("compare").hidden) { closeCompare(); return; }
      if (typing(ev) || ev.ctrlKey || ev.metaKey || ev.altKey) return;
      if (ev.target && ev.target.tagName === "SELECT") return;
      if (ev.key === "[" || ev.key === ",") { setStep(step - 1); ev.preventDefault(); }
      else if (ev.key === "]" || ev.key === ".") { setStep(step + 1); ev.preventDefault(); }
      else if (ev.key === "d" && data.divergence) { openDivergence(); ev.preventDefault(); }
      else if (ev.key === "c" && data.compare && !data.compare.error) { openCompare(null); ev.preventDefault(); }
      else if (ev.key === "/") { $("filter").focus(); ev.preventDefault(); }
      else if (ev.key === "s") { $("search").focus(); $("search").select(); ev.preventDefault(); }
      else if (ev.key === "+" || ev.key === "=") { zoomAt(2, keyFraction()); ev.preventDefault(); }
      else if (ev.key === "-") { zoomAt(0.5, keyFraction()); ev.preventDefault(); }
      else if (ev.key === "0") { setWindow(0, full()); ev.preventDefault(); }
    });
    if (live && window.EventSource) {
      const cfg = live;
      const events = new EventSource(cfg.events);
      const refresh = () => {
        fetch(cfg.data).then((r) => r.json()).then(load).catch(() => {});
      };
      events.addEventListener("changed", refresh);
      // The stream compares with the version it read before it opened: what changed
      // since this page was made is fetched now (and again after a reconnection).
      events.addEventListener("open", refresh);
    }
    rows.focus();
    document.body.setAttribute("data-ready", "1");
  }

  init();
})();
