// planact web view: what every page shares. Each page's script calls
// live(url, render): render gets the endpoint's JSON at once and again each
// time the server says it changed (Server-Sent Events).
"use strict";

const ids = document.body.dataset; // page, rollout, episode

// el builds an element: el("a", {href: "/"}, "text", child, …). Text is
// always text, never HTML.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function badge(status) { return el("span", {class: "badge " + status}, status); }
// ending is how rollout r ended, as `planact watch` says it: its status
// and why once when every role's result says the same, else each role's
// ("planner ok, actor failed", with "actor: why"). Before a result comes it
// is the rollout's status.
function ending(r) {
  const rs = r.results || [];
  const same = rs.every((x) => x.status === rs[0].status && (x.reason || "") === (rs[0].reason || ""));
  if (same) {
    const first = rs[0] || r;
    return {status: badge(first.status), reason: first.reason || ""};
  }
  return {
    status: el("span", {class: "results"}, rs.flatMap((x, i) => [i ? ", " : "", el("span", {"data-role": x.role}, x.role + " ", badge(x.status))])),
    reason: rs.filter((x) => x.reason).map((x) => `${x.role}: ${x.reason}`).join("; "),
  };
}
function pct(v) { return v === null || v === undefined ? "—" : (100 * v).toFixed(1) + "%"; }
function num(v, digits = 3) { return v === null || v === undefined ? "—" : v.toFixed(digits); }
function secs(ms) { return ms > 0 ? (ms / 1000).toFixed(1) + " s" : "—"; }
function when(t) { return t ? new Date(t).toLocaleTimeString() : "—"; }
function progress(ended, total) {
  const share = total > 0 ? Math.min(1, ended / total) : 0;
  return el("span", {}, el("span", {class: "bar"}, el("span", {style: `width:${(100 * share).toFixed(1)}%`})), `${ended} / ${total}`);
}
function versions(wv) {
  return Object.entries(wv || {}).map(([role, vs]) => `${role}: ${vs.join(", ")}`).join("; ") || "—";
}

function crumbs(...links) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren(...links.flatMap((l, i) => [i ? " / " : "", l.href ? el("a", {href: l.href}, l.text) : l.text]));
}

// live follows url's events; window.planactUpdates counts the renders
// (tests watch it), and the header says whether updates are flowing.
window.planactUpdates = 0;
let source = null;
function live(url, render) {
  if (source) source.close();
  const state = document.getElementById("live");
  source = new EventSource(url);
  source.onopen = () => { state.className = "live on"; state.textContent = "live"; };
  source.onerror = () => {
    state.className = "live off";
    state.textContent = "reconnecting…";
    if (source.readyState === EventSource.CLOSED) { // refused: the JSON endpoint says why
      state.textContent = "stopped";
      fetch(url.replace("/events", "")).then((r) => r.json()).then((body) => {
        document.getElementById("main").replaceChildren(el("p", {class: "error"}, body.error || "no live updates"));
      });
    }
  };
  // The server could not read what the page shows (NATS away, or its
  // history not read yet): it says why and tries again; the page keeps
  // what it shows until then.
  source.addEventListener("stalled", (e) => {
    state.className = "live off"; state.textContent = "stalled"; state.title = e.data;
  });
  source.addEventListener("failure", (e) => {
    source.close();
    state.className = "live off"; state.textContent = "stopped";
    document.getElementById("main").replaceChildren(el("p", {class: "error"}, e.data));
  });
  source.onmessage = (e) => {
    state.className = "live on"; state.textContent = "live"; state.title = "live updates";
    render(JSON.parse(e.data));
    window.planactUpdates++;
    document.body.dataset.updates = window.planactUpdates;
  };
}
