// The Rollout page: one rollout's figures and its episodes, filterable by
// status or to the lowest rewards; the filter lives in the page's URL.
"use strict";

const n = ids.rollout;
crumbs({text: "rollouts", href: "/"}, {text: `rollout ${n}`});
const query = new URLSearchParams(location.search);

function filters() {
  const status = el("select", {id: "status", onchange: apply},
    ["", "running", "unfinished", "completed", "truncated", "failed", "aborted", "quarantined"].map((s) => el("option", {value: s}, s || "all")));
  status.value = query.get("status") || "";
  const lowest = el("input", {id: "lowest", type: "number", min: "1", placeholder: "all", style: "width:5rem", onchange: apply});
  lowest.value = query.get("lowest") || "";
  function apply() {
    const q = new URLSearchParams();
    if (status.value) q.set("status", status.value);
    if (lowest.value) q.set("lowest", lowest.value);
    history.replaceState(null, "", q.toString() ? "?" + q : location.pathname);
    follow(q);
  }
  return el("div", {class: "filters"}, el("label", {}, "status ", status), el("label", {}, "lowest rewards ", lowest));
}

const head = el("div", {});
const body = el("div", {});
document.getElementById("main").replaceChildren(el("h1", {}, `Rollout ${n}`), head, filters(), body);

function render(r) {
  const end = ending(r);
  head.replaceChildren(el("div", {class: "facts"},
    fact("status", el("span", {id: "status-of-rollout"}, end.status)), fact("episodes ended", progress(r.ended, r.episodes)),
    r.quarantined ? fact("quarantined (token drift)", el("span", {id: "quarantined", class: "error"}, String(r.quarantined))) : "",
    fact("acts running / done / failed", `${r.acts.running} / ${r.acts.done} / ${r.acts.failed}`),
    fact("accuracy", pct(r.accuracy)), fact("mean reward", num(r.mean_reward)),
    fact("weight versions", versions(r.weight_versions)), fact("wall time", secs(r.wall_ms)),
    fact("plan format", r.plan_format || "—"), fact("reward", r.reward || "—")),
    end.reason ? el("p", {class: "muted", id: "reason-of-rollout"}, end.reason) : "");
  body.replaceChildren(el("table", {id: "episodes"},
    el("thead", {}, el("tr", {}, ["episode", "status", "reward", "turns", "acts done / failed", "answer", "label", "question"].map((h) => el("th", {}, h)))),
    el("tbody", {}, r.episode_list.map((e) => el("tr", {"data-episode": e.episode},
      el("td", {}, el("a", {href: `/rollouts/${n}/episodes/${e.episode}`}, e.episode)),
      el("td", {}, badge(e.status), e.reason && e.status !== "completed" ? el("div", {class: "muted"}, e.reason) : null),
      el("td", {class: "num"}, num(e.reward)),
      el("td", {class: "num"}, e.turns),
      el("td", {class: "num"}, `${e.acts.done} / ${e.acts.failed}`),
      el("td", {}, (e.answers || []).join(" | ")),
      el("td", {}, e.label || ""),
      el("td", {}, e.question || ""))))));
}

function fact(name, value) { return el("div", {}, el("span", {}, name), value); }
function follow(q) { live(`/api/rollouts/${n}/events` + (q.toString() ? "?" + q : ""), render); }
follow(query);
