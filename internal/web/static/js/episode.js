// The Episode page: the planner's turns (prompt, output, observation), each
// turn's plan as a graph (cytoscape, laid out by dagre) and the timeline
// of the episode's acts (Chart.js floating bars: released → started →
// finished), the critical path outlined in both.
"use strict";

const n = ids.rollout, e = ids.episode;
crumbs({text: "rollouts", href: "/"}, {text: `rollout ${n}`, href: `/rollouts/${n}`}, {text: `episode ${e}`});

const colors = {done: "#2e9e5b", failed: "#d64545", skipped: "#9aa3b2", cached: "#3b82c4", running: "#e0a100", pending: "#c8ced8"};
const criticalColor = "#1d2433";

// Tests and curious people find the live objects here.
window.planactGraphs = {}; // turn -> cytoscape instance
window.planactTimeline = null;

const head = el("div", {});
const canvas = el("canvas", {id: "timeline"});
const chartBox = el("div", {style: "position:relative;height:120px"}, canvas);
const turnsBox = el("div", {id: "turns"});
document.getElementById("main").replaceChildren(
  el("h1", {}, `Rollout ${n}, episode ${e}`), head,
  el("h2", {}, "Acts"),
  el("div", {class: "timeline"}, legend(), chartBox),
  el("h2", {}, "Turns"), turnsBox);

function legend() {
  return el("div", {class: "legend"},
    Object.entries(colors).map(([s, c]) => el("span", {}, el("i", {style: `background:${c}`}), s)),
    el("span", {}, el("i", {style: `background:#fff;border:2px solid ${criticalColor}`}), "critical path"),
    el("span", {}, el("i", {style: "background:#e4e7ec"}), "released, waiting to start"));
}

function render(ep) {
  const fact = (name, value) => el("div", {}, el("span", {}, name), value);
  head.replaceChildren(el("div", {class: "facts"},
    fact("status", badge(ep.status)), fact("reward", num(ep.reward)), fact("turns", ep.turns),
    fact("acts done / failed / skipped / cached / running", `${ep.acts.done} / ${ep.acts.failed} / ${ep.acts.skipped} / ${ep.acts.cached} / ${ep.acts.running}`),
    fact("answer", (ep.answers || []).join(" | ") || "—"), fact("label", ep.label || "—"), fact("wall time", secs(ep.wall_ms))),
    ep.question ? el("p", {}, el("b", {}, "Question: "), ep.question) : "",
    ep.reason && ep.status !== "completed" ? el("p", {class: "muted"}, ep.reason) : "");
  renderTimeline(ep);
  ep.turn_list.forEach(renderTurn);
}

// --- the timeline of acts ---

function renderTimeline(ep) {
  const t0 = ep.start_ms || Math.min(...ep.timeline.map((a) => a.released_ms).filter((v) => v > 0), Date.now());
  const at = (ms) => (ms - t0) / 1000;
  const acts = ep.timeline;
  const labels = acts.map((a) => `${a.key} ${a.tool}`);
  const waiting = acts.map((a) => a.released_ms > 0 && a.started_ms > 0 ? [at(a.released_ms), at(a.started_ms)] : null);
  const working = acts.map((a) => {
    const from = a.started_ms || a.released_ms || a.ended_ms;
    const to = a.status === "running" ? Date.now() : (a.ended_ms || from);
    return from > 0 ? [at(from), Math.max(at(to), at(from) + 0.005)] : null;
  });
  const data = {
    labels,
    datasets: [
      {label: "waiting", data: waiting, backgroundColor: "#e4e7ec", grouped: false, order: 2},
      {label: "act", data: working, grouped: false, order: 1,
        backgroundColor: acts.map((a) => colors[a.status] || colors.pending),
        borderColor: acts.map((a) => a.critical ? criticalColor : "rgba(0,0,0,0)"),
        borderWidth: acts.map((a) => a.critical ? 2 : 0)},
    ],
  };
  chartBox.style.height = `${60 + 24 * Math.max(acts.length, 1)}px`;
  if (window.planactTimeline) {
    window.planactTimeline.$acts = acts;
    window.planactTimeline.data = data;
    window.planactTimeline.update("none");
    return;
  }
  window.planactTimeline = new Chart(canvas, {
    type: "bar",
    data,
    options: {
      indexAxis: "y", animation: false, maintainAspectRatio: false,
      scales: {x: {type: "linear", min: 0, title: {display: true, text: "seconds since the episode's first turn was asked for"}}},
      plugins: {
        legend: {display: false},
        // $acts: the acts of the last render, which the bars show.
        tooltip: {callbacks: {label: (c) => describe(window.planactTimeline.$acts[c.dataIndex], c.dataset.label)}},
      },
    },
  });
  window.planactTimeline.$acts = acts;
}

function describe(a, part) {
  if (!a) return "";
  if (part === "waiting") return "waiting to start";
  const bits = [a.status];
  if (a.retries) bits.push(`${a.retries} retr${a.retries === 1 ? "y" : "ies"}`);
  if (a.replica) bits.push(`replica ${a.replica}`);
  if (a.error_kind) bits.push(a.error_kind);
  if (a.critical) bits.push("critical path");
  return bits.join(", ");
}

// --- the turns and their plans ---

const turnViews = {}; // turn -> {box, texts, graphBox, shape}

function renderTurn(t) {
  let v = turnViews[t.turn];
  if (!v) {
    v = {outcome: el("span", {}), prompt: el("pre", {}), output: el("pre", {}), observation: el("pre", {}),
      graphBox: el("div", {class: "graph", "data-turn": t.turn}), shape: ""};
    v.box = el("section", {class: "turn", "data-turn": t.turn},
      el("h2", {}, `Turn ${t.turn} `, v.outcome),
      el("details", {open: ""}, el("summary", {}, t.turn === 1 ? "prompt" : "observation before this turn"), v.prompt),
      el("details", {open: ""}, el("summary", {}, "planner output"), v.output),
      v.graphBox,
      el("details", {}, el("summary", {}, "observation after this turn"), v.observation));
    turnViews[t.turn] = v;
    turnsBox.append(v.box);
  }
  v.outcome.replaceChildren(t.outcome ? badge(t.outcome) : badge("running"),
    t.answers ? ` ${t.answers.join(" | ")}` : "", t.error ? el("span", {class: "error"}, ` ${t.error}`) : "");
  v.prompt.textContent = t.prompt || "";
  v.output.textContent = t.output || "(the planner is writing)";
  v.observation.textContent = t.observation || "—";
  v.graphBox.style.display = t.graph.nodes.length ? "" : "none";
  renderGraph(t, v);
}

function renderGraph(t, v) {
  const ids = new Set(t.graph.nodes.map((n) => n.id));
  const edges = t.graph.edges.filter((d) => ids.has(d.from) && ids.has(d.to));
  const shape = JSON.stringify([[...ids], edges]);
  const critical = new Set(t.graph.nodes.filter((n) => n.critical).map((n) => n.id));
  let cy = window.planactGraphs[t.turn];
  if (cy && v.shape === shape) { // same plan: only statuses change
    for (const node of t.graph.nodes) cy.getElementById(node.id).data({status: node.status, critical: node.critical});
    for (const d of edges) cy.getElementById(`${d.from}->${d.to}`).data("critical", critical.has(d.from) && critical.has(d.to));
    return;
  }
  if (cy) cy.destroy();
  if (!ids.size) { delete window.planactGraphs[t.turn]; return; }
  v.shape = shape;
  cy = cytoscape({
    container: v.graphBox,
    elements: [
      ...t.graph.nodes.map((node) => ({data: {id: node.id, label: `${node.id}\n${node.tool}`, status: node.status, critical: node.critical}})),
      ...edges.map((d) => ({data: {id: `${d.from}->${d.to}`, source: d.from, target: d.to, critical: critical.has(d.from) && critical.has(d.to)}})),
    ],
    layout: {name: "dagre", rankDir: "LR", nodeSep: 20, rankSep: 50},
    userZoomingEnabled: false,
    maxZoom: 1.2, // a small plan stays readable, not blown up to fill the box
    style: [
      {selector: "node", style: {"label": "data(label)", "text-wrap": "wrap", "text-valign": "center", "font-size": 10,
        "shape": "round-rectangle", "width": 70, "height": 34, "color": "#fff", "background-color": colors.pending}},
      ...Object.entries(colors).map(([s, c]) => ({selector: `node[status = "${s}"]`, style: {"background-color": c}})),
      {selector: "node[?critical]", style: {"border-width": 3, "border-color": criticalColor}},
      {selector: "edge", style: {"width": 1.5, "line-color": "#9aa3b2", "target-arrow-color": "#9aa3b2", "target-arrow-shape": "triangle", "curve-style": "bezier"}},
      {selector: "edge[?critical]", style: {"width": 3, "line-color": criticalColor, "target-arrow-color": criticalColor}},
    ],
  });
  v.graphBox.dataset.nodes = cy.nodes().length;
  window.planactGraphs[t.turn] = cy;
}

live(`/api/rollouts/${n}/episodes/${e}/events`, render);
