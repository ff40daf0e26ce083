// The Rollouts page: every rollout the streams hold, newest first.
"use strict";

crumbs({text: "rollouts"});

live("/api/rollouts/events", (rollouts) => {
  const rows = rollouts.map((r) => {
    const end = ending(r);
    return el("tr", {"data-rollout": r.rollout},
      el("td", {}, el("a", {href: `/rollouts/${r.rollout}`}, r.rollout)),
      el("td", {class: "status"}, end.status, end.reason ? el("div", {class: "muted"}, end.reason) : null),
      el("td", {class: "progress"}, progress(r.ended, r.episodes),
        r.quarantined ? el("div", {class: "error"}, `${r.quarantined} quarantined (token drift)`) : null),
      el("td", {class: "num"}, `${r.acts.running} / ${r.acts.done} / ${r.acts.failed}`),
      el("td", {class: "num"}, pct(r.accuracy)),
      el("td", {class: "num"}, num(r.mean_reward)),
      el("td", {}, versions(r.weight_versions)),
      el("td", {class: "num"}, secs(r.wall_ms)),
      el("td", {}, when(r.started_at || r.arrived_at)));
  });
  document.getElementById("main").replaceChildren(
    el("h1", {}, "Rollouts"),
    rollouts.length === 0 ? el("p", {class: "muted"}, "No rollout yet: trainers arrive on rollout.<N>.arrive.<role>.") :
      el("table", {id: "rollouts"},
        el("thead", {}, el("tr", {}, ["rollout", "status", "episodes ended", "acts running / done / failed",
          "accuracy", "mean reward", "weight versions", "wall time", "started"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows)));
});
