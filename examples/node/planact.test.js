// The sample checks catch what they promise to: each case below breaks one
// invariant of a consistent pair of results and expects it named; the
// waits, cancel, pause and resume run against stand-in connections.
// Run with `node --test` (no NATS needed). With PLANACT_TEST_NATS_URL
// naming a running planact (e2e/node_trainer_test.go starts one), pause
// and resume run against it too.

import assert from "node:assert/strict";
import { test } from "node:test";

import { decode, encode } from "@msgpack/msgpack";
import { connect, errors } from "@nats-io/transport-node";

import {
  arrive,
  cancel,
  cancelAnswerSubject,
  checkEvaluation,
  checkSamples,
  checkServer,
  evaluationMetrics,
  MIN_SERVER_VERSION,
  outcome,
  pause,
  pauseMessage,
  PlanactError,
  resume,
  sendControl,
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
  [
    "more actor samples than acts",
    (r) => (r.actor.stats = { ...r.actor.stats, acts: 1 }),
    /actor: 2 samples, stats.acts says 1: more samples than acts/,
  ],
  [
    "a trained task without samples",
    (r) => {
      listTasks(r, ["trained", "trained"]);
      dropEpisode(r, 1);
    },
    /planner: task 1 \(group 0 index 1\) is trained, and the result has no sample of it/,
  ],
  [
    "samples of a filtered task",
    (r) => listTasks(r, ["trained", "filtered"]),
    /actor: 1 samples of task 1 \(group 0 index 1\), whose state is filtered .*: such a task has none/,
  ],
  [
    "samples of a task the result does not list",
    (r) => {
      listTasks(r, ["trained", "trained"]);
      r.actor.tasks.pop();
    },
    /actor: 1 samples of group 0 index 1, a task the result does not list/,
  ],
  [
    "token totals that disagree with the stats",
    (r) => r.planner.samples[0].tokens.unshift(100),
    /15 tokens in the samples, stats.tokens says 14/,
  ],
];

// listTasks gives both results of r a task list (rollout 42's two
// episodes, in the states given), as planact's results carry one.
function listTasks(r, states) {
  for (const res of [r.planner, r.actor]) {
    res.rollout = 42;
    res.tasks = states.map((state, e) => ({
      episode: e,
      group_index: 0,
      index: e,
      state,
      ...(state === "trained" ? {} : { reason: `episode ${e} is ${state}` }),
    }));
  }
}

// dropEpisode takes episode e's samples out of both results of r, with
// their counts and tokens, as planact leaves out those of an episode
// whose samples it does not deliver; stats.acts still counts its acts.
function dropEpisode(r, e) {
  const tokens = { ...r.planner.stats.tokens };
  for (const [role, res] of Object.entries(r)) {
    const gone = res.samples.filter((s) => s.rollout_id === `42-${e}`);
    res.samples = res.samples.filter((s) => s.rollout_id !== `42-${e}`);
    res.sample_count -= gone.length;
    tokens[role] -= gone.reduce((n, s) => n + s.tokens.length, 0);
  }
  const stats = { ...r.planner.stats, tokens };
  r.planner.stats = stats;
  r.actor.stats = stats;
}

// planact counts in stats.acts the acts of every episode that ended,
// those of quarantined episodes and filtered or surplus groups too, and
// delivers no samples of these: fewer actor samples than acts is no
// violation, as long as the tasks' states say why.
for (const state of ["filtered", "quarantined", "aborted"]) {
  test(`stats.acts counts the acts of a task in state ${state}, which has no samples`, () => {
    const r = results();
    listTasks(r, ["trained", state]);
    dropEpisode(r, 1);
    assert.equal(r.actor.stats.acts, 2);
    assert.equal(r.actor.samples.length, 1);
    assert.deepEqual(checkSamples(r), { ok: true, errors: [] });
  });
}

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
    "rollout.5.result.actor.group.0": { schema: "rollout.group/1", rollout: 5, role: "actor", samples: [sample(0, 0), sample(0, 1)], sample_count: 2 },
    "rollout.5.result.actor.group.2": { schema: "rollout.group/1", rollout: 5, role: "actor", group_index: 2, samples: [sample(2, 4)], sample_count: 1 },
  });
  const r = await waitResult(standIn(stored({ own: 1, groups: 3 })), 5, "actor", { timeoutMs: 5000 });
  assert.deepEqual(r.samples.map((s) => [s.group_index, s.index]), [[0, 0], [0, 1], [1, 2], [2, 4]]);
  await assert.rejects(waitResult(standIn(stored({ own: 1, groups: 4 })), 5, "actor", { timeoutMs: 5000 }),
    /the 2 groups its actor result names delivered hold 3 samples, the result counts 4 \(group_samples\)/);
  await assert.rejects(waitResult(standIn(stored({ own: 2, groups: 3 })), 5, "actor", { timeoutMs: 5000 }),
    /its actor result holds 1 samples and counts 2 \(sample_count\)/);
});

const sample = (g, index) => ({ group_index: g, index, rollout_id: `5-${index}`, tokens: [1, 2], response_length: 1 });
const ask = (stored, role = "actor", options = {}) => waitResult(standIn(stored), 5, role, { timeoutMs: 5000, ...options });

// planact omits every zero value (msgpack omitempty), sample_count and
// group_samples included: an absent count is 0, and samples beyond it are
// refused.
test("an absent sample_count is 0: a result carrying samples without one is refused", async () => {
  const stored = { "rollout.5.result.actor": { schema: "rollout.result/1", rollout: 5, role: "actor", status: "ok", samples: [sample(0, 0)] } };
  await assert.rejects(ask(stored), /rollout 5: its actor result holds 1 samples and counts 0 \(sample_count\)/);
  const none = { "rollout.5.result.actor": { schema: "rollout.result/1", rollout: 5, role: "actor", status: "failed" } };
  assert.deepEqual((await ask(none)).samples, []);
});

test("an absent group_samples is 0: groups that hold samples, or a count without groups, are refused", async () => {
  const group = { schema: "rollout.group/1", rollout: 5, role: "actor", samples: [sample(0, 0)], sample_count: 1 };
  const result = (extra) => ({
    "rollout.5.result.actor": { schema: "rollout.result/1", rollout: 5, role: "actor", status: "ok", ...extra },
    "rollout.5.result.actor.group.0": group,
  });
  await assert.rejects(ask(result({ delivered_groups: [0] })),
    /the 1 groups its actor result names delivered hold 1 samples, the result counts 0 \(group_samples\)/);
  await assert.rejects(ask(result({ group_samples: 1 })),
    /the 0 groups its actor result names delivered hold 0 samples, the result counts 1 \(group_samples\)/);
});

// A group message is merged into the result only if it is the group the
// result names: its rollout, role and group_index, and it holds the
// samples it counts.
for (const [name, changed, want] of [
  ["another rollout", { rollout: 6 }, /rollout\.5\.result\.actor\.group\.2: the group message's rollout is 6, the result names rollout 5/],
  ["another role", { role: "planner" }, /group\.2: the group message's role is "planner", the result names role "actor"/],
  ["another group", { group_index: 0 }, /group\.2: the group message's group_index is 0, the result names group_index 2/],
  ["samples other than it counts", { sample_count: 3 }, /group\.2: group 2 holds 2 samples and counts 3 \(sample_count\)/],
  ["a count omitted", { sample_count: undefined }, /group\.2: group 2 holds 2 samples and counts 0 \(sample_count\)/],
]) {
  test(`a group message of ${name} is refused`, async () => {
    const group = { schema: "rollout.group/1", rollout: 5, role: "actor", group_index: 2, samples: [sample(2, 0), sample(2, 1)], sample_count: 2 };
    const stored = {
      "rollout.5.result.actor": { schema: "rollout.result/1", rollout: 5, role: "actor", status: "ok", delivered_groups: [2], group_samples: 2 },
      "rollout.5.result.actor.group.2": { ...group, ...changed },
    };
    assert.equal((await ask({ ...stored, "rollout.5.result.actor.group.2": group })).samples.length, 2);
    await assert.rejects(ask(stored), want);
  });
}

// soon settles as p does, or rejects after ms (then aborts stop, so that a
// wait that would never end does end).
async function soon(p, ms, stop) {
  let timer;
  try {
    return await Promise.race([
      p,
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`still waiting after ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
    stop?.abort();
    await p.catch(() => {});
  }
}

const refused = (want) => (err) => err instanceof PlanactError && err.code === "rejected" && want.test(err.message);

test("waitResult and cancel refuse an unknown role at once", async () => {
  for (const role of ["Actor", "both", ""]) {
    const stop = new AbortController();
    await assert.rejects(soon(ask({}, role, { timeoutMs: 60_000, signal: stop.signal }), 1000, stop),
      refused(/^role .*: want planner or actor$/), `waitResult role ${role}`);
    await assert.rejects(soon(cancel(standIn({}), 5, role, "why", { timeoutMs: 1000 }), 1000),
      refused(/^role .*: want planner or actor$/), `cancel role ${role}`);
  }
});

test("a timeoutMs that is not a number of milliseconds is refused, naming the option", async () => {
  for (const timeoutMs of [NaN, -1, "5000", null]) {
    const stop = new AbortController();
    await assert.rejects(soon(ask({}, "actor", { timeoutMs, signal: stop.signal }), 1000, stop),
      refused(/^timeoutMs .*: want a number of milliseconds >= 0$/), `waitResult timeoutMs ${timeoutMs}`);
    await assert.rejects(soon(cancel(standIn({}), 5, "actor", "why", { timeoutMs }), 1000),
      refused(/^timeoutMs .*: want a number of milliseconds >= 0$/), `cancel timeoutMs ${timeoutMs}`);
  }
  const stop = new AbortController();
  await assert.rejects(soon(ask({}, "actor", { recheckMs: NaN, signal: stop.signal }), 1000, stop),
    refused(/^recheckMs NaN \(number\): want a number of milliseconds > 0$/));
});

// After an arrival of ours, a result that names no arrival (one an older
// planact left, of an earlier rollout of the number) is not known to answer
// it and is passed over, as the Go client does; the answer that names the
// arrival (here its rejection) is the one taken.
test("after an arrival, a result or rejection that names no arrival is passed over", async () => {
  const mine = { id: "arrive.5.actor..1000", atMs: 1000 };
  const old = { schema: "rollout.result/1", rollout: 5, role: "actor", status: "ok", samples: [sample(0, 0)], sample_count: 1 };
  const oldRejection = { schema: "rollout.result/1", rollout: 5, role: "actor", status: "invalid", reason: "old", rejected: true };
  const rejection = { schema: "rollout.result/1", rollout: 5, role: "actor", status: "invalid", reason: "engine.url: bad", rejected: true, arrival_id: mine.id };
  await assert.rejects(
    ask({ "rollout.5.result.actor": old, "rollout.5.result.actor.rejected": rejection }, "actor", { arrival: mine }).then(outcome),
    refused(/engine\.url: bad/),
  );
  const theirs = { ...old, arrival_id: "arrive.5.actor..2000", stats: { finished_ms: 3000 } };
  assert.deepEqual(
    (await ask({ "rollout.5.result.actor": theirs, "rollout.5.result.actor.rejected": oldRejection }, "actor", { arrival: mine })).samples,
    [sample(0, 0)],
  );
  // Without an arrival of ours, every result counts.
  assert.equal((await ask({ "rollout.5.result.actor": old })).status, "ok");
});

// objectStandIn is standIn with an object store results_actor holding
// object name: its metadata (info) and its chunks, as the JetStream API's
// STREAM.MSG.GET answers them; reads counts the metadata reads, and
// chunks(reads) gives the chunks served on that read.
function objectStandIn(stored, name, info, chunks) {
  const conn = standIn(stored);
  const direct = conn.request;
  const ok = (seq, data) => ({ data: new TextEncoder().encode(JSON.stringify({ message: { seq, data: Buffer.from(data).toString("base64") } })) });
  const meta = `$O.results_actor.M.${Buffer.from(name).toString("base64").replace(/\+/g, "-").replace(/\//g, "_")}`;
  conn.reads = 0;
  conn.request = async (subject, body) => {
    if (!subject.startsWith("$JS.API.STREAM.MSG.GET.OBJ_results_actor")) {
      return direct(subject, body);
    }
    const q = JSON.parse(body);
    if (q.last_by_subj === meta) {
      conn.reads++;
      return ok(1, JSON.stringify(info));
    }
    const all = chunks(conn.reads);
    const i = Math.max(0, q.seq - 2); // chunk i is message 2 + i, the first at or after seq
    if (q.next_by_subj === `$O.results_actor.C.${info.nuid}` && i < all.length) {
      return ok(2 + i, all[i]);
    }
    return { data: new TextEncoder().encode(JSON.stringify({ error: { code: 404, err_code: 10037, description: "no message found" } })) };
  };
  return conn;
}

// Data that does not have its object's digest is no read to try again
// (the object is there: its chunks are not what it says), as in the Go
// client: the wait ends at once with the error, not at its deadline.
test("samples whose object does not match its digest are an error at once, not read again", async () => {
  const { createHash } = await import("node:crypto");
  const blob = Buffer.from(encode([sample(0, 0)]));
  const digest = `SHA-256=${createHash("sha256").update(blob).digest("base64").replace(/\+/g, "-").replace(/\//g, "_")}`;
  const info = { name: "r5.samples", nuid: "N1", size: blob.length, chunks: 2, digest };
  const stored = { "rollout.5.result.actor": { schema: "rollout.result/1", rollout: 5, role: "actor", status: "ok", samples_object: "r5.samples", sample_count: 1 } };
  const half = Math.floor(blob.length / 2);
  const good = [blob.subarray(0, half), blob.subarray(half)];
  const good_ = objectStandIn(stored, "r5.samples", info, () => good);
  const r = await waitResult(good_, 5, "actor", { timeoutMs: 60_000 });
  assert.deepEqual(r.samples, [sample(0, 0)]);
  // The first read serves other bytes of the same length; a read again
  // would find the right ones, and must not be made.
  const bad = Buffer.from(blob);
  bad[bad.length - 1] ^= 1;
  const conn = objectStandIn(stored, "r5.samples", info, (reads) => (reads === 1 ? [bad.subarray(0, half), bad.subarray(half)] : good));
  await assert.rejects(waitResult(conn, 5, "actor", { timeoutMs: 60_000 }), (err) =>
    err instanceof PlanactError && err.code === "failed" && /results_actor\/r5\.samples: .*do not match its digest/.test(err.message));
  assert.equal(conn.reads, 1);
  // More bytes than its metadata says: no read mends that either.
  const more = objectStandIn(stored, "r5.samples", info, (reads) => (reads === 1 ? [good[0], Buffer.concat([good[1], Buffer.from([1])])] : good));
  await assert.rejects(waitResult(more, 5, "actor", { timeoutMs: 60_000 }), /more than the \d+ bytes its metadata says/);
  assert.equal(more.reads, 1);
});

// cancelStandIn takes a cancel's publish (a stored PubAck) and then
// answers it on rollout.5.status as planact's session-store does: first
// another cancel's answer, then answer(who) for this one (who: "cancel
// <msg id> by the actor trainer").
function cancelStandIn(answer) {
  const conn = { ...standIn({}), options: {} };
  const subs = new Map();
  conn.subscribe = (subject, { callback }) => {
    subs.set(subject, callback);
    return { unsubscribe: () => subs.delete(subject) };
  };
  conn.request = async (subject, _data, opts) => {
    if (subject.startsWith("$JS.API.DIRECT.GET.ROLLOUT.")) {
      return { data: new Uint8Array(), headers: { hasError: true } }; // nothing stored
    }
    assert.equal(subject, "rollout.5.cancel.actor");
    const who = `cancel ${opts.headers.get("Nats-Msg-Id")} by the actor trainer`;
    queueMicrotask(() => {
      const status = subs.get("rollout.5.status");
      status?.(null, { data: encode({ schema: "rollout.status/1", rollout: 5, event: "cancelled", detail: "cancel cancel.5.actor.1 by the actor trainer: rollout 5 aborted", at_ms: 1 }) });
      status?.(null, { data: encode({ schema: "rollout.status/1", rollout: 5, ...answer(who), at_ms: 2 }) });
    });
    return { data: new TextEncoder().encode(JSON.stringify({ stream: "TRAINER_ACTOR", seq: 1 })) };
  };
  return conn;
}

// As the Go client's Cancel: it returns once planact answered this cancel,
// and says so when there was nothing to abort or the cancel was not
// recorded, instead of reporting a cancel that did nothing as done.
test("cancel waits for planact's answer to it, and surfaces a refusal", async () => {
  await cancel(cancelStandIn((who) => ({ event: "cancelled", detail: `${who}: rollout 5 aborted` })), 5, "actor", "enough");
  await assert.rejects(
    cancel(cancelStandIn((who) => ({ event: "rejected", detail: `${who}: rollout 5 had already ended (ok at 2026-01-01T00:00:00Z)` })), 5, "actor", "enough"),
    refused(/^cancel rollout 5: nothing to cancel: rollout 5 had already ended \(ok at/),
  );
  await assert.rejects(
    cancel(cancelStandIn((who) => ({ event: "rejected", detail: `${who}: could not be recorded (3 tries): timeout; cancel again` })), 5, "actor", "enough"),
    (err) => err instanceof PlanactError && err.code === "failed" && /not done: planact could not be recorded/.test(err.message),
  );
});

// planact names the cancel it answers in cancel_id and says what became
// of it in cancel_outcome: cancel goes by those, not by the detail's
// words (an answer to another cancel whose detail reads as this one's is
// passed over), and a cancel planact could not read is "refused".
test("cancel knows its answer by cancel_id and cancel_outcome", async () => {
  const answerWith = (outcome) => (who) => ({
    event: outcome === "aborted" ? "cancelled" : "rejected",
    cancel_id: who.split(" ")[1],
    cancel_outcome: outcome,
    detail: "a reason",
  });
  const conn = (outcome) => {
    const c = cancelStandIn(answerWith(outcome));
    const request = c.request;
    c.request = async (subject, data, opts) => {
      if (subject === "rollout.5.cancel.actor") {
        // Another cancel's answer, whose words would do for this one.
        const id = opts.headers.get("Nats-Msg-Id");
        queueMicrotask(() => c.statusSub?.(null, { data: encode({ schema: "rollout.status/1", rollout: 5, event: "cancelled",
          cancel_id: `${id}-other`, cancel_outcome: "aborted", detail: `cancel ${id} by the actor trainer: rollout 5 aborted`, at_ms: 1 }) }));
      }
      return request(subject, data, opts);
    };
    const subscribe = c.subscribe;
    c.subscribe = (subject, o) => {
      if (subject === "rollout.5.status") {
        c.statusSub = o.callback;
      }
      return subscribe(subject, o);
    };
    return c;
  };
  await cancel(conn("aborted"), 5, "actor", "enough", { timeoutMs: 5000 });
  await assert.rejects(cancel(conn("refused"), 5, "actor", "enough", { timeoutMs: 5000 }),
    (err) => err instanceof PlanactError && err.code === "refused" && /refused by planact: a reason$/.test(err.message));
  await assert.rejects(cancel(conn("not-recorded"), 5, "actor", "enough", { timeoutMs: 5000 }),
    (err) => err instanceof PlanactError && err.code === "failed" && /not done: planact a reason$/.test(err.message));
  await assert.rejects(cancel(conn("nothing-to-abort"), 5, "actor", "enough", { timeoutMs: 5000 }), refused(/nothing to cancel: a reason$/));
});

// An answer published while the connection was down never comes on the
// subscription: cancel reads it from the stream (the last message on the
// cancel's answer subject), as waitResult and pause do, instead of
// waiting its whole timeoutMs.
test("a cancel's answer missed on the subscription is read from the stream", async () => {
  const conn = { ...standIn({}), options: {} };
  const stored = {};
  conn.request = async (subject, _data, opts) => {
    const direct = "$JS.API.DIRECT.GET.ROLLOUT.";
    if (subject.startsWith(direct)) {
      const body = stored[subject.slice(direct.length)];
      return body ? { data: encode(body), headers: undefined } : { data: new Uint8Array(), headers: { hasError: true } };
    }
    const id = opts.headers.get("Nats-Msg-Id");
    stored[cancelAnswerSubject(5, "actor", id)] = { schema: "rollout.status/1", rollout: 5, event: "cancelled", cancel_id: id,
      cancel_outcome: "aborted", detail: `cancel ${id} by the actor trainer: rollout 5 aborted`, at_ms: 2 };
    return { data: new TextEncoder().encode(JSON.stringify({ stream: "TRAINER_ACTOR", seq: 1 })) };
  };
  await cancel(conn, 5, "actor", "enough", { timeoutMs: 10_000 });
  // The subject the Go session-store stores it on (subject.CancelAnswer).
  assert.equal(cancelAnswerSubject(5, "actor", "cancel.5.actor.1"), "rollout.5.result.actor.cancel.ff55fd3d8e12ce392dbad1acff06967d");
});

// Two cancels of a rollout by one role made in the same millisecond (two
// processes of one trainer, a retry loop) are two messages, each answered:
// with one Nats-Msg-Id, JetStream stores the first only, and the second
// waited its whole timeoutMs for an answer naming it. A publish tried
// again (planact's streams not up yet) keeps its id. The stand-in is
// JetStream and the session-store: it drops a copy of an id it stored,
// and answers each stored cancel (the first aborts, a later one finds the
// rollout ended).
test("two cancels in one millisecond each have an id of their own, kept when a publish is tried again", async () => {
  const conn = { ...standIn({}), options: {} };
  const subs = new Map();
  const stored = [];
  conn.published = [];
  conn.subscribe = (subject, { callback }) => {
    subs.set(subject, callback);
    return { unsubscribe: () => subs.delete(subject) };
  };
  conn.request = async (subject, _data, opts) => {
    if (subject.startsWith("$JS.API.DIRECT.GET.ROLLOUT.")) {
      return { data: new Uint8Array(), headers: { hasError: true } }; // nothing stored
    }
    assert.equal(subject, "rollout.5.cancel.actor");
    const id = opts.headers.get("Nats-Msg-Id");
    conn.published.push(id);
    if (conn.published.length % 2 === 1) {
      throw new errors.TimeoutError(); // each cancel's first publish
    }
    if (stored.includes(id)) {
      return { data: new TextEncoder().encode(JSON.stringify({ stream: "TRAINER_ACTOR", seq: stored.indexOf(id) + 1, duplicate: true })) };
    }
    stored.push(id);
    const who = `cancel ${id} by the actor trainer`;
    const answer = stored.length === 1
      ? { event: "cancelled", detail: `${who}: rollout 5 aborted` }
      : { event: "rejected", detail: `${who}: rollout 5 had already ended (aborted at 2026-01-01T00:00:00Z); nothing to abort` };
    queueMicrotask(() => subs.get("rollout.5.status")?.(null, { data: encode({ schema: "rollout.status/1", rollout: 5, ...answer, at_ms: 2 }) }));
    return { data: new TextEncoder().encode(JSON.stringify({ stream: "TRAINER_ACTOR", seq: stored.length })) };
  };
  const realNow = Date.now;
  Date.now = () => 1767225600000;
  try {
    await cancel(conn, 5, "actor", "enough", { timeoutMs: 5000 });
    await assert.rejects(cancel(conn, 5, "actor", "enough", { timeoutMs: 5000 }),
      refused(/^cancel rollout 5: nothing to cancel: rollout 5 had already ended/));
  } finally {
    Date.now = realNow;
  }
  const [a, aRetry, b, bRetry] = conn.published;
  assert.match(a, /^cancel\.5\.actor\.1767225600000\.[0-9a-f]{16}$/);
  assert.equal(aRetry, a, "a publish tried again keeps its id");
  assert.equal(bRetry, b, "a publish tried again keeps its id");
  assert.notEqual(a, b, "two cancels in one millisecond share an id");
  assert.equal(stored.length, 2);
});

// Two arrivals of a role made in the same millisecond (a corrected
// arrival sent at once after a rejection) are two messages: with one
// Nats-Msg-Id, JetStream stored the first only, arrive returned as if the
// correction were sent, and the wait got the old rejection. A publish tried
// again (planact's streams not up yet) keeps its id.
test("two arrivals in one millisecond each have an id of their own, kept when a publish is tried again", async () => {
  const conn = { ...standIn({}), options: {} };
  conn.published = [];
  conn.request = async (subject, _data, opts) => {
    assert.equal(subject, "rollout.5.arrive.actor");
    conn.published.push(opts.headers.get("Nats-Msg-Id"));
    if (conn.published.length % 2 === 1) {
      throw new errors.TimeoutError(); // each arrival's first publish
    }
    return { data: new TextEncoder().encode(JSON.stringify({ stream: "TRAINER_ACTOR", seq: conn.published.length / 2 })) };
  };
  const realNow = Date.now;
  Date.now = () => 1767225600000;
  let first, second;
  try {
    first = await arrive(conn, { rollout: 5, role: "actor", engine: { url: "http://e" }, sampling: { temperature: 170 } });
    second = await arrive(conn, { rollout: 5, role: "actor", engine: { url: "http://e" } });
  } finally {
    Date.now = realNow;
  }
  const [a, aRetry, b, bRetry] = conn.published;
  assert.match(a, /^arrive\.5\.actor\.\.1767225600000\.[0-9a-f]{16}$/);
  assert.equal(aRetry, a, "a publish tried again keeps its id");
  assert.equal(bRetry, b, "a publish tried again keeps its id");
  assert.notEqual(a, b, "two arrivals in one millisecond share an id");
  assert.deepEqual([first.id, second.id], [a, b], "arrive returns the id it sent");
});

test("an arrival whose attempt makes its Nats-Msg-Id too long is refused before anything is sent", async () => {
  const conn = { ...standIn({}), options: {} };
  conn.request = async () => assert.fail("an over-long arrival was sent");
  await assert.rejects(
    arrive(conn, { rollout: 5, role: "actor", engine: { url: "http://e" }, attempt: "x".repeat(300) }),
    refused(/^arrival of actor for rollout 5: an attempt of 300 bytes makes its Nats-Msg-Id \d+: want at most 256$/),
  );
});

// controlStandIn takes pauses and resumes as JetStream publishes (each
// recorded in published: subject, id, headers, body; the first failFirst
// time out, as when planact's streams are not up yet), and answers each as
// answer(id, body, verb) says: a list of [subject, answer], published on
// the control subjects in that order. Direct gets on CONTROL find stored.
function controlStandIn(answer, { stored = {}, failFirst = 0 } = {}) {
  const conn = { ...standIn({}), options: {} };
  const subs = new Map();
  conn.published = [];
  conn.subscribe = (subject, { callback }) => {
    subs.set(subject, callback);
    return { unsubscribe: () => subs.delete(subject) };
  };
  conn.request = async (subject, data, opts) => {
    const direct = "$JS.API.DIRECT.GET.CONTROL.";
    if (subject.startsWith(direct)) {
      const body = stored[subject.slice(direct.length)];
      return body ? { data: encode(body), headers: undefined } : { data: new Uint8Array(), headers: { hasError: true } };
    }
    const id = opts.headers.get("Nats-Msg-Id");
    const body = decode(data);
    conn.published.push({ subject, id, headers: opts.headers, body });
    if (conn.published.length <= failFirst) {
      throw new errors.TimeoutError();
    }
    queueMicrotask(() => {
      for (const [s, a] of answer(id, body, subject.split(".")[2])) {
        subs.get(s)?.(null, { subject: s, data: encode(a) });
      }
    });
    return { data: new TextEncoder().encode(JSON.stringify({ stream: `TRAINER_${body.role.toUpperCase()}`, seq: conn.published.length })) };
  };
  return conn;
}

// others are answers on role's control subjects to other messages than
// id: a refusal of another id, a refusal of this id as the other verb,
// another pause's and another resume's answers.
const others = (role, id, verb) => [
  [`control.${role}.refused`, { schema: "control.refused/1", role, verb, id: `${id}-other`, reason: "not yours", at_ms: 1 }],
  [`control.${role}.refused`, { schema: "control.refused/1", role, verb: verb === "pause" ? "resume" : "pause", id, reason: "another verb", at_ms: 1 }],
  [`control.${role}.paused`, { schema: "control.paused/1", role, epoch: 1, pause_id: `pause.${role}.1`, mode: "wait", at_ms: 1 }],
  [`control.${role}.resumed`, { schema: "control.resumed/1", role, resume_id: `resume.${role}.1`, at_ms: 1 }],
];

// takes answers each pause and resume as the session-store does when it
// takes it, after others' answers.
const takes = (id, body, verb) => [
  ...others(body.role, id, verb),
  verb === "pause"
    ? [`control.${body.role}.paused`, { schema: "control.paused/1", role: body.role, epoch: 2, pause_id: id, mode: body.mode, drained: ["gw-1"], at_ms: 2 }]
    : [`control.${body.role}.resumed`, { schema: "control.resumed/1", role: body.role, resume_id: id, weight_version: body.weight_version, at_ms: 2 }],
];

// As the Go client's Pause and Resume: each returns planact's answer to
// it, passing over the answers to other pauses and resumes and the
// refusals of other messages, and sends what planact reads: a
// control.<verb>/1 body, the Planact headers of a message that names no
// rollout, and a Nats-Msg-Id unique to the request.
test("pause and resume wait for planact's answer to them", async () => {
  const conn = controlStandIn(takes);
  const p = await pause(conn, "actor", { mode: "abort", timeoutS: 60, reason: "weight swap" });
  assert.equal(p.epoch, 2);
  assert.deepEqual(p.drained, ["gw-1"]);
  const r = await resume(conn, "actor", "actor-v9");
  assert.equal(r.weight_version, "actor-v9");
  const [sentPause, sentResume] = conn.published;
  assert.equal(sentPause.subject, "control.actor.pause");
  assert.equal(sentPause.id, p.pause_id);
  assert.match(sentPause.id, /^pause\.actor\.\d+\.[0-9a-f]{16}$/);
  assert.deepEqual(sentPause.body, {
    schema: "control.pause/1", role: "actor", mode: "abort", timeout_s: 60, reason: "weight swap", at_ms: sentPause.body.at_ms,
  });
  assert.equal(sentResume.subject, "control.actor.resume");
  assert.equal(sentResume.id, r.resume_id);
  assert.match(sentResume.id, /^resume\.actor\.\d+\.[0-9a-f]{16}$/);
  assert.deepEqual(sentResume.body, { schema: "control.resume/1", role: "actor", weight_version: "actor-v9", at_ms: sentResume.body.at_ms });
  for (const [sent, kind] of [[sentPause, "control.pause/1"], [sentResume, "control.resume/1"]]) {
    assert.equal(sent.headers.get("Planact-Schema"), kind);
    assert.equal(sent.headers.get("Planact-Role"), "actor");
    assert.equal(sent.headers.get("Content-Type"), "application/msgpack");
    assert.equal(sent.headers.has("Planact-Rollout"), false, "a control message names no rollout");
  }
  // Left out, the mode is wait and the time-out planact's default.
  await pause(conn, "planner");
  assert.deepEqual(conn.published[2].body, { schema: "control.pause/1", role: "planner", mode: "wait", timeout_s: 600, at_ms: conn.published[2].body.at_ms });
});

// Two pauses made in the same millisecond (two trainers of a role, a
// script) are two messages: JetStream would store only the first of two
// with one Nats-Msg-Id, and the second would take the first's answer. A
// publish tried again (planact's streams not up yet) is the same message.
test("a pause or resume has an id of its own, kept when its publish is tried again", async () => {
  const a = pauseMessage("actor", { atMs: 1767225600000 });
  const b = pauseMessage("actor", { atMs: 1767225600000 });
  assert.notEqual(a.id, b.id);
  assert.ok(a.id.startsWith("pause.actor.1767225600000."));
  const conn = controlStandIn(takes, { failFirst: 2 });
  const p = await sendControl(conn, a, { waitMs: 60_000 });
  assert.equal(p.pause_id, a.id);
  assert.deepEqual(conn.published.map((m) => m.id), [a.id, a.id, a.id]);
  await resume(controlStandIn(takes, { failFirst: 1 }), "planner", "v2").then((r) => assert.match(r.resume_id, /^resume\.planner\./));
});

// planact refuses a pause or resume on control.<role>.refused (a rule of a
// newer planact): the client throws its reason, as the Go client's
// ErrRefused, instead of waiting out its time-out or returning as if the
// resume were taken.
test("a pause or resume planact refuses throws planact's reason", async () => {
  const refuses = (id, body, verb) => [
    ...others(body.role, id, verb),
    [`control.${body.role}.refused`, { schema: "control.refused/1", role: body.role, verb, id, reason: `${verb} of actor: a newer rule`, at_ms: 2 }],
  ];
  const isRefusal = (verb) => (err) =>
    err instanceof PlanactError && err.code === "refused" &&
    new RegExp(`^${verb} actor \\(${verb}\\.actor\\.\\d+\\.[0-9a-f]{16}\\): refused by planact: ${verb} of actor: a newer rule$`).test(err.message) &&
    err.result?.verb === verb;
  await assert.rejects(pause(controlStandIn(refuses), "actor", { timeoutS: 60 }), isRefusal("pause"));
  await assert.rejects(resume(controlStandIn(refuses), "actor", "actor-v2"), isRefusal("resume"));
});

// An answer published while the connection was down is found by reading
// the last one on the subject.
test("an answer missed on the subscription is read from the CONTROL stream", async () => {
  const msg = pauseMessage("actor", { timeoutS: 60 });
  const stored = { "control.actor.paused": { schema: "control.paused/1", role: "actor", epoch: 7, pause_id: msg.id, mode: "wait", at_ms: 3 } };
  const p = await sendControl(controlStandIn(() => [], { stored }), msg, { waitMs: 60_000 });
  assert.equal(p.epoch, 7);
});

test("a pause or resume nobody answers times out, saying it stays published", async () => {
  await assert.rejects(pause(controlStandIn(() => []), "actor", { timeoutS: 60, waitMs: 100, recheckMs: 20 }), (err) =>
    err instanceof PlanactError && err.code === "timeout" &&
    /^pause actor \(pause\.actor\.[^)]+\): sent, but no answer from planact within 100 ms .*the pause stays published/.test(err.message));
  await assert.rejects(resume(controlStandIn(() => []), "actor", "v2", { waitMs: 100, recheckMs: 20 }), (err) =>
    err instanceof PlanactError && err.code === "timeout" && /^resume actor .*no answer from planact within 100 ms/.test(err.message));
});

// What planact would refuse, or what is no pause or resume at all (an
// option of the Go client's, a version that is not a string), is an error
// at once, naming it, and nothing is sent.
test("a pause or resume planact would refuse is an error before anything is sent", async () => {
  const conn = controlStandIn(takes);
  for (const [name, call, want] of [
    ["an unknown role", () => pause(conn, "critic"), /^role "critic": want planner or actor$/],
    ["an unknown mode", () => pause(conn, "actor", { mode: "soon" }), /^pause of actor: mode "soon": want wait or abort$/],
    ["an empty mode", () => pause(conn, "actor", { mode: "" }), /^pause of actor: mode "": want wait or abort$/],
    ["a time-out under a second", () => pause(conn, "actor", { timeoutS: 0.5 }), /^pause of actor: timeoutS 0.5 \(number\): want a number of seconds from 1 to 604800$/],
    ["a time-out over a week", () => pause(conn, "actor", { timeoutS: 604801 }), /timeoutS 604801 \(number\)/],
    ["a time-out as a string", () => pause(conn, "actor", { timeoutS: "60" }), /timeoutS "60" \(string\)/],
    ["a NaN time-out", () => pause(conn, "actor", { timeoutS: NaN }), /timeoutS NaN \(number\)/],
    ["the Go client's option names", () => pause(conn, "actor", { abort: true, timeout: 60 }), /^pause: unknown option "abort", "timeout": want mode, timeoutS, reason, waitMs, recheckMs$/],
    ["a reason that is not a string", () => pause(conn, "actor", { reason: 7 }), /^pause of actor: reason 7 \(number\): want a string$/],
    ["a reason over 1 KiB", () => pause(conn, "actor", { reason: "é".repeat(513) }), /^pause of actor: reason "é+"… \(1026 bytes\): want at most 1024 bytes/],
    ["a negative wait", () => pause(conn, "actor", { waitMs: -1 }), /^waitMs -1 \(number\): want a number of milliseconds >= 0$/],
    ["a resume of an unknown role", () => resume(conn, "Actor", "v2"), /^role "Actor": want planner or actor$/],
    ["a version that is a number", () => resume(conn, "actor", 7), /^resume of actor: weight_version 7 \(number\): want a string \("" leaves the role's version as it was\)$/],
    ["no version", () => resume(conn, "actor"), /^resume of actor: weight_version undefined \(undefined\): want a string/],
    ["a version over 1 KiB", () => resume(conn, "actor", "é".repeat(513)), /^resume of actor: weight_version "é+"… \(1026 bytes\): want at most 1024 bytes$/],
    ["an unknown resume option", () => resume(conn, "actor", "v2", { timeoutMs: 5 }), /^resume: unknown option "timeoutMs": want waitMs, recheckMs$/],
    ["an id over 256 bytes", () => sendControl(conn, { ...pauseMessage("actor"), id: "x".repeat(257) }, { waitMs: 1000 }), /^pause of actor: Nats-Msg-Id "x+": want 1 to 256 bytes$/],
  ]) {
    await assert.rejects(call(), (err) => err instanceof PlanactError && err.code === "rejected" && want.test(err.message), name);
  }
  assert.deepEqual(conn.published, []);
  // The longest version and reason planact takes are sent.
  await resume(conn, "actor", "é".repeat(512));
  await pause(conn, "actor", { reason: "é".repeat(512) });
  assert.equal(conn.published.length, 2);
});

// As the Go client's Cancel: a reason planact would refuse (it repeats it
// in the rollout's results and answers) is an error at once, naming it,
// and nothing is sent; the longest it takes is sent.
test("a cancel reason planact would refuse is an error before anything is sent", async () => {
  const conn = cancelStandIn((who) => ({ event: "cancelled", detail: `${who}: rollout 5 aborted` }));
  const request = conn.request;
  const sent = [];
  conn.request = async (subject, data, opts) => {
    if (subject === "rollout.5.cancel.actor") {
      sent.push(decode(data).reason);
    }
    return request(subject, data, opts);
  };
  await assert.rejects(cancel(conn, 5, "actor", "é".repeat(513), { timeoutMs: 5000 }),
    refused(/^cancel of rollout 5: reason "é+"… \(1026 bytes\): want at most 1024 bytes/));
  await assert.rejects(cancel(conn, 5, "actor", 7, { timeoutMs: 5000 }), refused(/^cancel of rollout 5: reason 7 \(number\): want a string$/));
  assert.deepEqual(sent, []);
  await cancel(conn, 5, "actor", "é".repeat(512), { timeoutMs: 5000 });
  assert.deepEqual(sent, ["é".repeat(512)]);
});

// Against planact (e2e/node_trainer_test.go runs this with its URL): the
// session-store takes what this client sends and answers it by its id; a
// pause it refuses (sent past the client's checks) comes back with its
// reason; two pauses of one millisecond are answered each.
const natsURL = process.env.PLANACT_TEST_NATS_URL;
test(
  "against planact: pause, resume, and a refusal",
  { skip: natsURL ? false : "PLANACT_TEST_NATS_URL names no running planact" },
  async () => {
    const nc = await connect({ servers: natsURL });
    try {
      const p = await pause(nc, "actor", { mode: "abort", timeoutS: 60, reason: "weight swap" });
      assert.match(p.pause_id, /^pause\.actor\.\d+\.[0-9a-f]{16}$/);
      assert.equal(p.mode, "abort");
      assert.ok((p.drained ?? []).length > 0 && (p.missing ?? []).length === 0, `drained ${p.drained}, missing ${p.missing}`);
      const r = await resume(nc, "actor", "actor-v9");
      assert.match(r.resume_id, /^resume\.actor\.\d+\.[0-9a-f]{16}$/);
      assert.equal(r.weight_version, "actor-v9");
      assert.equal(r.paused ?? false, false);

      const atMs = Date.now();
      const [a, b] = [pauseMessage("planner", { timeoutS: 60, atMs }), pauseMessage("planner", { timeoutS: 60, atMs })];
      const pa = await sendControl(nc, a, { waitMs: 90_000 });
      const pb = await sendControl(nc, b, { waitMs: 90_000 });
      assert.equal(pa.pause_id, a.id);
      assert.equal(pb.pause_id, b.id);
      assert.ok(pb.epoch > pa.epoch, `epochs ${pa.epoch}, ${pb.epoch}: the second pause was not applied`);
      await resume(nc, "planner", "");

      const bad = pauseMessage("actor", { timeoutS: 60 });
      bad.body.mode = "soon";
      await assert.rejects(sendControl(nc, bad, { waitMs: 60_000 }), (err) =>
        err instanceof PlanactError && err.code === "refused" && err.result?.id === bad.id &&
        /refused by planact: pause of actor: mode "soon": want wait or abort/.test(err.message));
    } finally {
      await nc.close();
    }
  },
);
