// The sample checks catch what they promise to: each case below breaks one
// invariant of a consistent pair of results and expects it named.
// Run with `node --test` (no NATS needed).

import assert from "node:assert/strict";
import { test } from "node:test";

import { encode } from "@msgpack/msgpack";

import {
  checkEvaluation,
  checkSamples,
  checkServer,
  evaluationMetrics,
  MIN_SERVER_VERSION,
  outcome,
  PlanactError,
  versionAtLeast,
  waitResult,
} from "./planact.js";

// results builds a consistent rollout of two episodes (rollout 42), one act
// each, the way planact sends them.
function results() {
  const planner = (e) => ({
    group_index: 0,
    index: e,
    rollout_id: `42-${e}`,
    prompt: "Q: capital of France?",
    tokens: [101, 102, 103, 7, 8, 9, 10],
    response: "<graph>…</graph><answer>Paris</answer>",
    response_length: 4,
    loss_mask: [1, 0, 1, 1],
    rollout_log_probs: [-0.5, 0, -0.25, -0.125],
    reward: 1,
    status: "completed",
    weight_versions: ["planner-v7"],
  });
  const actor = (e) => ({
    group_index: 0,
    index: e,
    rollout_id: `42-${e}`,
    prompt: "search: capital of France",
    tokens: [201, 202, 11, 12],
    response_length: 2,
    loss_mask: [1, 1],
    rollout_log_probs: [-0.1, -0.2],
    reward: 1,
    status: "completed",
    weight_versions: ["actor-v3"],
  });
  const stats = { episodes: 2, completed: 2, acts: 2, tokens: { planner: 14, actor: 8 } };
  return {
    planner: {
      schema: "rollout.result/1",
      role: "planner",
      status: "ok",
      sample_count: 2,
      samples: [planner(0), planner(1)],
      stats,
    },
    actor: {
      schema: "rollout.result/1",
      role: "actor",
      status: "ok",
      sample_count: 2,
      samples: [actor(0), actor(1)],
      stats,
    },
  };
}

test("a consistent rollout passes", () => {
  assert.deepEqual(checkSamples(results()), { ok: true, errors: [] });
});

test("log-probs an engine did not return are absent, saying why", () => {
  const r = results();
  delete r.planner.samples[1].rollout_log_probs;
  r.planner.samples[1].metadata = { log_probs_missing: "turn 1: the engine returned no meta_info.output_token_logprobs" };
  assert.deepEqual(checkSamples(r), { ok: true, errors: [] });
});

const broken = [
  ["tokens shorter than the response", (r) => (r.planner.samples[0].response_length = 7), /at least one prompt token/],
  ["a loss mask of the wrong length", (r) => r.actor.samples[1].loss_mask.pop(), /loss_mask 1/],
  ["log-probs of the wrong length", (r) => r.planner.samples[1].rollout_log_probs.push(0), /rollout_log_probs 5/],
  ["a loss mask value not 0 or 1", (r) => (r.planner.samples[0].loss_mask[1] = 2), /loss_mask\[1\] is 2/],
  [
    "a positive log-prob on a trained token",
    (r) => (r.actor.samples[0].rollout_log_probs[0] = 0.3),
    /rollout_log_probs\[0\] is 0.3/,
  ],
  ["a NaN log-prob", (r) => (r.planner.samples[0].rollout_log_probs[1] = NaN), /rollout_log_probs\[1\] is NaN/],
  [
    "log-probs absent without a reason",
    (r) => delete r.actor.samples[0].rollout_log_probs,
    /no rollout_log_probs for 2 response tokens, and no metadata.log_probs_missing/,
  ],
  ["a reward that is not finite", (r) => (r.planner.samples[1].reward = Infinity), /reward Infinity/],
  ["an unknown sample status", (r) => (r.actor.samples[0].status = "done"), /status "done"/],
  ["no weight versions", (r) => (r.planner.samples[0].weight_versions = []), /no weight_versions/],
  ["samples out of group order", (r) => r.planner.samples.reverse(), /not grouped/],
  ["the same prompt with other token ids", (r) => (r.planner.samples[1].tokens[0] = 999), /other prompt token ids/],
  [
    "two planner samples of one episode",
    (r) => (r.planner.samples[1].rollout_id = "42-0"),
    /two samples for episode 42-0/,
  ],
  ["an actor sample of no episode", (r) => (r.actor.samples[1].rollout_id = "42-9"), /episode 42-9: no planner sample/],
  ["samples missing from the result", (r) => r.actor.samples.pop(), /sample_count 2 \+ group_samples 0, 1 samples/],
  [
    "a group's samples left out and not read",
    (r) => Object.assign(r.actor, { sample_count: 1, group_samples: 2, delivered_groups: [0] }),
    /sample_count 1 \+ group_samples 2, 2 samples/,
  ],
  ["more acts than actor samples", (r) => (r.actor.stats = { ...r.actor.stats, acts: 3 }), /stats.acts says 3/],
  [
    "token totals that disagree with the stats",
    (r) => r.planner.samples[0].tokens.unshift(100),
    /15 tokens in the samples, stats.tokens says 14/,
  ],
];

for (const [name, breakIt, want] of broken) {
  test(`caught: ${name}`, () => {
    const r = results();
    breakIt(r);
    const got = checkSamples(r);
    assert.equal(got.ok, false);
    assert.ok(
      got.errors.some((e) => want.test(e)),
      `errors ${JSON.stringify(got.errors)} do not match ${want}`,
    );
  });
}

test("statuses map to samples, fall back or error", () => {
  for (const status of ["ok", "partial", "aborted"]) {
    assert.equal(outcome({ status }).status, status);
  }
  for (const [status, code] of [
    ["timeout", "timeout"],
    ["invalid", "rejected"],
    ["failed", "failed"],
  ]) {
    assert.throws(
      () => outcome({ status, role: "planner", reason: "why" }),
      (err) => err instanceof PlanactError && err.code === code && /why/.test(err.message),
    );
  }
});

test("an evaluation yields metrics, per dataset; a training result is not one", () => {
  const result = {
    rollout: 3,
    role: "actor",
    status: "ok",
    evaluation: true,
    episodes: [{ status: "completed", reward: 1 }, { status: "failed", reward: 0 }],
    stats: {
      episodes: 2,
      ended: 2,
      accuracy: 0.5,
      mean_reward: 0.5,
      mean_turns: 2,
      acts_per_episode: 1.5,
      failures: { timeout: 1 },
      datasets: { nq: { episodes: 2, ended: 2, accuracy: 0.5, mean_reward: 0.5, mean_turns: 2, acts_per_episode: 1.5 } },
    },
  };
  const m = evaluationMetrics(checkEvaluation(result));
  assert.equal(m.samples, 0);
  assert.equal(m.episodes_reported, 2);
  assert.deepEqual(m.failures, { timeout: 1 });
  assert.equal(m.datasets.nq.accuracy, 0.5);
  assert.throws(
    () => checkEvaluation({ rollout: 3, role: "actor", status: "ok", sample_count: 7 }),
    (err) => err instanceof PlanactError && err.code === "rejected" && /not an evaluation/.test(err.message),
  );
});

// A nats-server older than planact needs is named, with the version needed.
test("versionAtLeast compares major, minor and patch as numbers", () => {
  for (const [have, ok] of [
    ["2.12.0", true],
    ["2.15.2", true],
    ["v2.12.1", true],
    ["2.12.0-RC.3", true],
    ["2.100.0", true],
    ["3.0.0", true],
    ["2.11.9", false],
    ["2.9.10", false],
    ["", false],
    [undefined, false],
    ["2.12", false],
  ]) {
    assert.equal(versionAtLeast(have, MIN_SERVER_VERSION), ok, `versionAtLeast(${have})`);
  }
});

test("checkServer refuses an old nats-server in one line", () => {
  const conn = (version) => ({ info: version === undefined ? undefined : { version }, getServer: () => "127.0.0.1:4222" });
  assert.doesNotThrow(() => checkServer(conn("2.12.0")));
  assert.throws(
    () => checkServer(conn("2.9.10")),
    (err) =>
      err instanceof PlanactError &&
      err.code === "failed" &&
      err.message === "nats-server too old for planact: nats://127.0.0.1:4222 runs 2.9.10, planact needs 2.12.0 or later",
  );
  assert.throws(() => checkServer(conn(undefined)), /runs an unknown version, planact needs 2.12.0 or later/);
});

// standIn is a connection that answers direct gets from stored messages
// (subject -> body), a 404 for the rest, and lets subscriptions wait.
function standIn(stored) {
  return {
    info: { version: "2.12.0" },
    getServer: () => "127.0.0.1:4222",
    isClosed: () => false,
    subscribe: () => ({ unsubscribe() {} }),
    request: async (subject) => {
      const body = stored[subject.replace("$JS.API.DIRECT.GET.ROLLOUT.", "")];
      return body ? { data: encode(body), headers: undefined } : { data: new Uint8Array(), headers: { hasError: true } };
    },
  };
}

test("a result that leaves the groups out is made whole from them, and its counts are checked", async () => {
  const sample = (g, index) => ({ group_index: g, index, rollout_id: `5-${index}`, tokens: [1, 2], response_length: 1 });
  const stored = (counts) => ({
    "rollout.5.result.actor": {
      schema: "rollout.result/1", rollout: 5, role: "actor", status: "ok",
      samples: [sample(1, 2)], sample_count: counts.own, delivered_groups: [0, 2], group_samples: counts.groups,
    },
    "rollout.5.result.actor.group.0": { schema: "rollout.group/1", rollout: 5, role: "actor", group_index: 0, samples: [sample(0, 0), sample(0, 1)] },
    "rollout.5.result.actor.group.2": { schema: "rollout.group/1", rollout: 5, role: "actor", group_index: 2, samples: [sample(2, 4)] },
  });
  const r = await waitResult(standIn(stored({ own: 1, groups: 3 })), 5, "actor", { timeoutMs: 5000 });
  assert.deepEqual(r.samples.map((s) => [s.group_index, s.index]), [[0, 0], [0, 1], [1, 2], [2, 4]]);
  await assert.rejects(waitResult(standIn(stored({ own: 1, groups: 4 })), 5, "actor", { timeoutMs: 5000 }),
    /the 2 groups its actor result names delivered hold 3 samples, the result counts 4 \(group_samples\)/);
  await assert.rejects(waitResult(standIn(stored({ own: 2, groups: 3 })), 5, "actor", { timeoutMs: 5000 }),
    /its actor result holds 1 samples and counts 2 \(sample_count\)/);
});
