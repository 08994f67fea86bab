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

  function load(newData) {
    data = newData;
    const steps = data.steps;
    if (liveAtEnd || step >= steps.length) step = Math.max(0, steps.length - 1);
    if (selected >= data.agents.length) selected = 0;
    renderHeader();
    applyFilter();
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

  function pct(t) {
    const span = data.duration > 0 ? data.duration : 1;
    return Math.max(0, Math.min(100, (t / span) * 100));
  }

  function renderAxis() {
    const axis = $("axis");
    axis.replaceChildren();
    const span = data.duration > 0 ? data.duration : 1;
    const raw = span / 8;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const tick = [1, 2, 5, 10].map((m) => m * mag).find((v) => v >= raw) || raw;
    for (let t = 0; t <= span + 1e-9; t += tick) {
      axis.append(el("span", { text: "+" + secs(t), style: "left:" + pct(t) + "%" }));
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
      bars.append(el("div", { class: "life", "data-a": a.index, "data-m": -1,
        style: "left:" + pct(a.start) + "%;width:" + Math.max(0.1, pct(a.end) - pct(a.start)) + "%" }));
      a.marks.forEach((m, j) => {
        bars.append(el("div", { class: markClass(m), "data-a": a.index, "data-m": j,
          style: "left:" + pct(m.t0) + "%;width:" + (pct(m.t1) - pct(m.t0)) + "%" }));
      });
      if (div && div.agent === a.index) {
        bars.append(el("div", { class: "m m-div", "data-a": a.index, "data-m": -2,
          style: "left:" + pct(div.at) + "%" }));
      }
      const label = el("div", { class: "label" },
        el("span", { style: "display:inline-block;width:" + Math.min(a.depth, 12) * 12 + "px" }),
        el("span", { class: "glyph", text: GLYPH[a.status] || "?" }),
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
    for (const m of a.messages) {
      const who = m.role === "tool" ? "tool result " + m.name + (m.error ? " (error)" : "")
        : m.role + (m.truncated ? " (cut off at the token limit)" : "");
      const box = el("div", { class: "msg " + m.role + (m.error ? " error" : "") },
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
      table.append(el("tr", {}, el("td", { text: m.label }), el("td", { text: "+" + secs(m.t0) }),
        el("td", { text: secs(m.t1 - m.t0) + (m.open ? " (open)" : "") }),
        el("td", { text: m.tokens ? m.tokens.input + "/" + m.tokens.output : "" }),
        el("td", { text: m.error || "" })));
    }
    parts.push(table);
    d.replaceChildren(...parts.filter((p) => p !== null));
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
    return t && (t.tagName === "INPUT" && t.type === "text");
  }

  function init() {
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
      if (typing(ev) || ev.ctrlKey || ev.metaKey || ev.altKey) return;
      if (ev.key === "[" || ev.key === ",") { setStep(step - 1); ev.preventDefault(); }
      else if (ev.key === "]" || ev.key === ".") { setStep(step + 1); ev.preventDefault(); }
      else if (ev.key === "d" && data.divergence) { openDivergence(); ev.preventDefault(); }
      else if (ev.key === "/") { $("filter").focus(); ev.preventDefault(); }
    });
    const live = $("trace-live");
    if (live && window.EventSource) {
      const cfg = JSON.parse(live.textContent);
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
