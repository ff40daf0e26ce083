// A planact trainer in Node.js, written from the wire contract (schemas/ and
// the README): arrive for rollout N as a role, wait for that role's result
// without a JetStream consumer, fetch its samples, and tell samples, fall
// back and error apart. checkSamples verifies what a trainer relies on.

import { createHash, randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";

import { decode, encode } from "@msgpack/msgpack";
import { jetstream } from "@nats-io/jetstream";
import { Objm } from "@nats-io/obj";
import { Empty, errors, headers } from "@nats-io/transport-node";

export const ROLES = ["planner", "actor"];
export const RESULT_STATUSES = ["ok", "timeout", "partial", "aborted", "invalid", "failed"];
export const SAMPLE_STATUSES = ["completed", "truncated", "aborted", "failed"];

export const ARRIVE_SCHEMA = "rollout.arrive/1";
export const CANCEL_SCHEMA = "rollout.cancel/1";
export const RESULT_SCHEMA = "rollout.result/1";
export const PAUSE_SCHEMA = "control.pause/1";
export const RESUME_SCHEMA = "control.resume/1";

const ROLLOUT_STREAM = "ROLLOUT";
/** planact's answers to pauses and resumes. */
const CONTROL_STREAM = "CONTROL";
const CONTENT_TYPE = "application/msgpack";
/** Each role's task lists go to its own object store, which only its trainer writes. */
export const tasksStore = (role) => `tasks_${role}`;
/** The JetStream API's "message not found". */
const NOT_FOUND = 10037;

/** Above this many encoded bytes, a task list goes to the object store (as the Go client does). */
export const DEFAULT_INLINE_TASKS_LIMIT = 256 * 1024;
/** How often a wait reads the result subjects again. */
export const DEFAULT_RECHECK_MS = 2000;
/** Bound on one request to the server (a publish, a direct get). */
const REQUEST_TIMEOUT_MS = 5000;

/**
 * PlanactError is what a rollout ends with when it gives no samples:
 * code "timeout" (fall back to the standard rollout), "rejected" (the
 * arrival or the rollout was refused; the message names the field) or
 * "failed". pause and resume throw "refused" when planact refused the
 * message (control.<role>.refused; nothing of the role changed). result is
 * planact's answer, when there was one.
 */
export class PlanactError extends Error {
  constructor(code, message, result) {
    super(message);
    this.name = "PlanactError";
    this.code = code;
    this.result = result;
  }
}

/**
 * The oldest nats-server planact runs on: the rollouts' time-outs are
 * scheduled messages (2.12), and its buckets' keys expire with limit
 * markers (2.11). An older server refuses some of these settings and
 * silently drops others.
 */
export const MIN_SERVER_VERSION = "2.12.0";

/**
 * versionAtLeast says whether version have ("2.9.10", "v2.12.0-RC.1") is
 * want or later, by major, minor and patch (a pre-release counts as its
 * release); a version it cannot read is not.
 */
export function versionAtLeast(have, want) {
  const parse = (v) => {
    const m = /^v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?$/.exec(String(v ?? "").trim());
    return m ? m.slice(1, 4).map(Number) : undefined;
  };
  const h = parse(have);
  const w = parse(want);
  if (!h || !w) {
    return false;
  }
  for (let i = 0; i < 3; i++) {
    if (h[i] !== w[i]) {
      return h[i] > w[i];
    }
  }
  return true;
}

/**
 * checkServer throws a PlanactError "failed", in one line naming the
 * server's version and the one planact needs, when nc is connected to a
 * nats-server older than MIN_SERVER_VERSION: nothing planact does could
 * work there, and waiting would only hide why.
 */
export function checkServer(nc) {
  const have = nc.info?.version;
  if (!versionAtLeast(have, MIN_SERVER_VERSION)) {
    throw new PlanactError(
      "failed",
      `nats-server too old for planact: nats://${nc.getServer()} runs ${have || "an unknown version"}, planact needs ${MIN_SERVER_VERSION} or later`,
    );
  }
}

export const resultSubject = (rollout, role) => `rollout.${rollout}.result.${role}`;
export const rejectedSubject = (rollout, role) => `rollout.${rollout}.result.${role}.rejected`;

/**
 * traceparent returns a W3C traceparent whose trace id is the rollout's, as
 * the Go and Python trainers derive it, so that both jobs' arrivals join the
 * rollout's trace; the span id comes from msgId, so a republished message
 * carries the same header.
 */
export function traceparent(rollout, msgId) {
  const sha = (s) => createHash("sha256").update(s).digest("hex");
  const spanId = msgId ? sha(msgId).slice(0, 16) : randomBytes(8).toString("hex");
  return `00-${sha(`planact-rollout-${rollout}`).slice(0, 32)}-${spanId}-01`;
}

/**
 * arrive publishes arrival (the fields of rollout.arrive/1: rollout, role,
 * engine, weight_version, tasks, config, sampling, attempt) on
 * rollout.<N>.arrive.<role>. A task list larger than inlineTasksLimit
 * encoded bytes goes to the role's object store tasks_<role>, named by its
 * SHA-256, and the arrival names it in tasks_object and its digest in
 * tasks_sha256 (planact runs the rollout on that list only). Returns what
 * names the arrival: { id, atMs, tasksObject }. The id is its Nats-Msg-Id,
 * which a rejection of it carries as arrival_id. Connect nc with your
 * user's inbox prefix (inboxPrefix: "_INBOX_<user>"): planact's accounts
 * let a user read its own inboxes only.
 */
export async function arrive(nc, arrival, { inlineTasksLimit = DEFAULT_INLINE_TASKS_LIMIT, timeoutMs = 60_000 } = {}) {
  checkServer(nc);
  const { rollout, role } = arrival;
  checkTarget(rollout, role);
  checkMs("timeoutMs", timeoutMs);
  if (!arrival.engine?.url) {
    throw new PlanactError("rejected", `${role} arrives without an engine url`);
  }
  const deadline = Date.now() + timeoutMs;
  const atMs = arrival.at_ms ?? Date.now();
  const body = omitZero({ schema: ARRIVE_SCHEMA, ...arrival, at_ms: atMs });
  // One id per arrival call: a retried publish of it is stored once; a
  // corrected arrival after a rejection, even in the same millisecond, is
  // a new message with its own answer (planact answers any id, the older
  // clients' arrive.<N>.<role>.<attempt>.<at_ms> too, up to MAX_CONTROL_ID
  // bytes: a longer attempt is refused before anything is sent).
  const id = `arrive.${rollout}.${role}.${arrival.attempt ?? ""}.${atMs}.${randomBytes(8).toString("hex")}`;
  if (Buffer.byteLength(id) > MAX_CONTROL_ID) {
    throw new PlanactError(
      "rejected",
      `arrival of ${role} for rollout ${rollout}: an attempt of ${Buffer.byteLength(String(arrival.attempt))} bytes makes its Nats-Msg-Id ${Buffer.byteLength(id)}: want at most ${MAX_CONTROL_ID}`,
    );
  }
  let tasksObject;
  if (body.tasks) {
    const list = encode({ tasks: body.tasks }, { ignoreUndefined: true });
    if (list.length > inlineTasksLimit) {
      const sha = createHash("sha256").update(list).digest("hex");
      // A list is written once, under a name of its own: a trainer may not
      // purge its store, which replacing an object would need.
      tasksObject = `rollout-${rollout}-${role}-${sha.slice(0, 16)}.tasks`;
      await untilUp(deadline, async () => {
        const store = await new Objm(jetstream(nc)).open(tasksStore(role));
        const info = await store.info(tasksObject);
        if (info === null || info.deleted || info.digest !== objectDigest(list)) {
          await store.putBlob({ name: tasksObject }, list);
        }
      });
      delete body.tasks;
      body.tasks_object = tasksObject;
      body.tasks_sha256 = sha;
    }
  }
  const h = planactHeaders(ARRIVE_SCHEMA, rollout, role);
  h.set("traceparent", traceparent(rollout, id));
  const js = jetstream(nc, { timeout: REQUEST_TIMEOUT_MS });
  await untilUp(deadline, () =>
    js.publish(`rollout.${rollout}.arrive.${role}`, encode(body, { ignoreUndefined: true }), { msgID: id, headers: h }),
  );
  return { id, atMs, tasksObject };
}

/** What became of a cancel, in its answer's cancel_outcome (schema.Cancel* in Go). */
export const CANCEL_OUTCOMES = ["aborted", "nothing-to-abort", "not-recorded", "refused"];

/**
 * cancelAnswerSubject is where planact stores its answer to the cancel
 * msgID of rollout by role, besides rollout.<N>.status (as the Go
 * subject.CancelAnswer): the token is the first 32 hex digits of the id's
 * SHA-256.
 */
export const cancelAnswerSubject = (rollout, role, msgID) =>
  `rollout.${rollout}.result.${role}.cancel.${createHash("sha256").update(msgID).digest("hex").slice(0, 32)}`;

/**
 * cancel aborts rollout as the trainer of role: both roles get an aborted
 * result with the samples of the episodes that ended. As the Go client's
 * Cancel, it returns once planact answered (on rollout.<N>.status, naming
 * this cancel in cancel_id), within timeoutMs: it throws a PlanactError
 * "rejected" when there was nothing to abort (the rollout had already
 * ended, or is not known: the message says which), "refused" when planact
 * could not read the cancel, "failed" when planact could not record the
 * cancel (cancel again), and "timeout" when no answer came (the cancel
 * stays published, and is acted on once planact's session-store runs);
 * "rejected" too, before sending anything, for a rollout, role or reason
 * planact would refuse (a reason is a string of at most MAX_REASON bytes).
 * The answer is read from the stream too (its own subject,
 * cancelAnswerSubject) now and every recheckMs, so one published while the
 * connection was down is found.
 */
export async function cancel(nc, rollout, role, reason = "", { timeoutMs = 60_000, recheckMs = DEFAULT_RECHECK_MS } = {}) {
  checkServer(nc);
  checkTarget(rollout, role);
  checkReason(`cancel of rollout ${rollout}`, reason);
  checkMs("timeoutMs", timeoutMs);
  checkMs("recheckMs", recheckMs, { positive: true });
  const deadline = Date.now() + timeoutMs;
  const atMs = Date.now();
  const body = omitZero({ schema: CANCEL_SCHEMA, rollout, role, reason, at_ms: atMs });
  // One id per cancel call (a retried publish is stored once; another
  // cancel, even in the same millisecond, is new and gets its own answer);
  // planact's answer names it.
  const msgID = `cancel.${rollout}.${role}.${atMs}.${randomBytes(8).toString("hex")}`;
  // A planact before cancel_id names the cancel at the head of the detail.
  const mine = `cancel ${msgID} by the ${role} trainer: `;
  const stored = cancelAnswerSubject(rollout, role, msgID);
  // answer returns the status in data if it answers this cancel, else null.
  const answer = (data) => {
    let st;
    try {
      st = data && data.length > 0 ? decode(data) : null;
    } catch {
      return null;
    }
    if (st?.event !== "cancelled" && st?.event !== "rejected") {
      return null;
    }
    if (st.cancel_id !== undefined) {
      return st.cancel_id === msgID ? st : null;
    }
    return typeof st.detail === "string" && st.detail.startsWith(mine) ? st : null;
  };
  // The answer may come before the publish is acknowledged: listen first.
  let answered;
  const got = new Promise((resolve) => (answered = resolve));
  const subs = [`rollout.${rollout}.status`, stored].map((s) =>
    nc.subscribe(s, {
      callback: (err, msg) => {
        const st = err ? null : answer(msg.data);
        if (st) {
          answered(st);
        }
      },
    }),
  );
  let timer;
  try {
    const js = jetstream(nc, { timeout: REQUEST_TIMEOUT_MS });
    await untilUp(deadline, () =>
      js.publish(`rollout.${rollout}.cancel.${role}`, encode(body, { ignoreUndefined: true }), {
        msgID,
        headers: planactHeaders(CANCEL_SCHEMA, rollout, role),
      }),
    );
    let st = null;
    while (st === null) {
      st = answer(await lastOn(nc, stored));
      if (st !== null) {
        break;
      }
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new PlanactError(
          "timeout",
          `cancel rollout ${rollout}: sent, but no answer from planact within ${timeoutMs} ms (is its session-store running?)`,
        );
      }
      if (nc.isClosed?.()) {
        throw new PlanactError("timeout", `cancel rollout ${rollout}: sent, but the connection closed before planact answered`);
      }
      st = await Promise.race([
        got,
        new Promise((resolve) => {
          timer = setTimeout(resolve, Math.min(left, recheckMs), null);
        }),
      ]);
      clearTimeout(timer);
    }
    const why = st.detail?.startsWith(mine) ? st.detail.slice(mine.length) : (st.detail ?? "");
    let outcome = st.cancel_outcome;
    if (outcome === undefined) {
      // A planact before cancel_outcome: its words say.
      outcome = st.event === "cancelled" ? "aborted" : why.startsWith("could not be recorded") ? "not-recorded" : "nothing-to-abort";
    }
    switch (outcome) {
      case "aborted":
        return;
      case "not-recorded":
        // Given up, not done: the rollout may still run.
        throw new PlanactError("failed", `cancel rollout ${rollout}: not done: planact ${why}`);
      case "refused":
        throw new PlanactError("refused", `cancel rollout ${rollout} (${msgID}): refused by planact: ${why}`);
      case "nothing-to-abort":
        throw new PlanactError("rejected", `cancel rollout ${rollout}: nothing to cancel: ${why}`);
    }
    throw new PlanactError("failed", `cancel rollout ${rollout}: planact's answer says ${st.event} ${show(outcome)}, which this client does not know: ${why}`);
  } finally {
    clearTimeout(timer);
    for (const sub of subs) {
      sub.unsubscribe();
    }
  }
}

/** Pause modes: running generations finish (wait) or are aborted and sent again after the resume (abort). */
export const PAUSE_MODES = ["wait", "abort"];
/** How long a pause lasts, not resumed, unless it says (planact's default). */
export const DEFAULT_PAUSE_TIMEOUT_S = 600;
/** The range of a pause's timeoutS planact takes: a second to a week. */
export const MIN_PAUSE_TIMEOUT_S = 1;
export const MAX_PAUSE_TIMEOUT_S = 604_800;
/** How much longer than its time-out a pause waits for planact's answer, which comes by then. */
export const PAUSE_ANSWER_MARGIN_MS = 30_000;
/** How long a resume waits for planact's answer. */
export const RESUME_ANSWER_WAIT_MS = 120_000;
/** The longest Nats-Msg-Id of a trainer's message (an arrival, a cancel, a pause, a resume), and weight_version of a resume, planact takes (bytes). */
export const MAX_CONTROL_ID = 256;
export const MAX_WEIGHT_VERSION = 1024;
/** The longest reason of a pause or cancel planact takes (bytes): it repeats it in its answers. */
export const MAX_REASON = 1024;

/**
 * pause stops planact sending new generations of role to its engine, so
 * that its trainer can swap the weights, as the Go client's Pause. mode
 * "wait" (the default) lets the running generations finish, "abort" aborts
 * them (planact sends them again after the resume). Not resumed within
 * timeoutS seconds (1 to 604800, default 600), the pause ends: the work
 * that waited for the role fails, saying so. It returns planact's answer
 * (control.paused/1: epoch, pause_id, mode, drained, missing: gateways
 * that did not say they stopped in time, aborted) once no generation of
 * the role runs, and throws a PlanactError "refused" with planact's reason
 * when planact refused the pause, "timeout" when no answer came within
 * waitMs (default timeoutS and 30 s more: planact answers by the pause's
 * time-out at the latest), and "rejected", before sending anything, for a
 * role, mode, timeoutS, reason (over MAX_REASON bytes) or option planact
 * would refuse. Call resume after.
 */
export async function pause(nc, role, options = {}) {
  checkOptions("pause", options, ["mode", "timeoutS", "reason", "waitMs", "recheckMs"]);
  const { mode, timeoutS = DEFAULT_PAUSE_TIMEOUT_S, reason, recheckMs } = options;
  const msg = pauseMessage(role, { mode, timeoutS, reason });
  const { waitMs = timeoutS * 1000 + PAUSE_ANSWER_MARGIN_MS } = options;
  return sendControl(nc, msg, { waitMs, recheckMs });
}

/**
 * resume lets planact send the generations of role again, from the weights
 * of weightVersion (a string: what the engine runs now, which samples
 * record and staleness counts from; "" leaves the role's version as it
 * was), as the Go client's Resume. It returns planact's answer
 * (control.resumed/1: resume_id, the role's weight_version now, paused
 * when a later pause holds the role all the same) once planact took the
 * resume, and throws a PlanactError "refused" with planact's reason when
 * planact refused it, "timeout" when no answer came within waitMs (default
 * 2 minutes; the resume stays published, and is taken once planact's
 * session-store runs), and "rejected", before sending anything, for a role
 * or weightVersion planact would refuse.
 */
export async function resume(nc, role, weightVersion, options = {}) {
  checkOptions("resume", options, ["waitMs", "recheckMs"]);
  const { waitMs = RESUME_ANSWER_WAIT_MS, recheckMs } = options;
  return sendControl(nc, resumeMessage(role, weightVersion), { waitMs, recheckMs });
}

/**
 * pauseMessage builds the pause of role that pause sends (options as
 * pause's; atMs defaults to now): { role, verb, subject, id, body }, body
 * being control.pause/1's fields. Its id, the message's Nats-Msg-Id, is
 * unique to this pause (the time and random bits), so that planact's
 * answer to it is told from the answers to others; sendControl publishes
 * it under that id however often it tries.
 */
export function pauseMessage(role, options = {}) {
  checkOptions("pause", options, ["mode", "timeoutS", "reason", "atMs"]);
  const { mode = "wait", timeoutS = DEFAULT_PAUSE_TIMEOUT_S, reason = "", atMs = Date.now() } = options;
  checkRole(role);
  if (!PAUSE_MODES.includes(mode)) {
    throw new PlanactError("rejected", `pause of ${role}: mode ${show(mode)}: want wait or abort`);
  }
  if (typeof timeoutS !== "number" || !(timeoutS >= MIN_PAUSE_TIMEOUT_S && timeoutS <= MAX_PAUSE_TIMEOUT_S)) {
    throw new PlanactError(
      "rejected",
      `pause of ${role}: timeoutS ${show(timeoutS)} (${typeof timeoutS}): want a number of seconds from ${MIN_PAUSE_TIMEOUT_S} to ${MAX_PAUSE_TIMEOUT_S}`,
    );
  }
  checkReason(`pause of ${role}`, reason);
  checkAtMs("pause", role, atMs);
  const body = omitZero({ schema: PAUSE_SCHEMA, role, mode, timeout_s: timeoutS, reason, at_ms: atMs });
  return { role, verb: "pause", subject: `control.${role}.pause`, id: controlID("pause", role, atMs), body };
}

/**
 * resumeMessage builds the resume of role to weightVersion that resume
 * sends (atMs defaults to now), as pauseMessage builds a pause.
 */
export function resumeMessage(role, weightVersion, options = {}) {
  checkOptions("resume", options, ["atMs"]);
  const { atMs = Date.now() } = options;
  checkRole(role);
  if (typeof weightVersion !== "string") {
    throw new PlanactError(
      "rejected",
      `resume of ${role}: weight_version ${show(weightVersion)} (${typeof weightVersion}): want a string ("" leaves the role's version as it was)`,
    );
  }
  const bytes = Buffer.byteLength(weightVersion);
  if (bytes > MAX_WEIGHT_VERSION) {
    throw new PlanactError(
      "rejected",
      `resume of ${role}: weight_version ${JSON.stringify(weightVersion.slice(0, 32))}… (${bytes} bytes): want at most ${MAX_WEIGHT_VERSION} bytes`,
    );
  }
  checkAtMs("resume", role, atMs);
  const body = omitZero({ schema: RESUME_SCHEMA, role, weight_version: weightVersion, at_ms: atMs });
  return { role, verb: "resume", subject: `control.${role}.resume`, id: controlID("resume", role, atMs), body };
}

// controlID is a pause's or resume's Nats-Msg-Id: the verb, the role and
// the time, as the Go client's, and random bits, so that two in the same
// millisecond (two trainers of a role, a script) are two messages, and
// each is answered.
function controlID(verb, role, atMs) {
  return `${verb}.${role}.${atMs}.${randomBytes(8).toString("hex")}`;
}

function checkAtMs(verb, role, atMs) {
  if (!Number.isSafeInteger(atMs) || atMs < 0) {
    throw new PlanactError("rejected", `${verb} of ${role}: atMs ${show(atMs)}: want unix milliseconds, an integer >= 0`);
  }
}

/**
 * sendControl publishes a pause or resume msg (what pauseMessage or
 * resumeMessage built; sent again, it is the same message) on the role's
 * trainer stream, trying again with the same id while NATS or planact is
 * not up, and waits for planact's answer to it: on control.<role>.paused
 * (its pause_id) or control.<role>.resumed (its resume_id), which it
 * returns, or on control.<role>.refused (its id and verb), which it throws
 * as a PlanactError "refused" with planact's reason. It follows both
 * subjects, and reads the last answer on each (a direct get on the CONTROL
 * stream) now and every recheckMs, so an answer published while the
 * connection was down is found too; "timeout" when none came within waitMs.
 */
export async function sendControl(nc, msg, { waitMs, recheckMs = DEFAULT_RECHECK_MS } = {}) {
  checkServer(nc);
  const { role, verb, subject, id, body } = msg ?? {};
  checkRole(role);
  const idField = { pause: "pause_id", resume: "resume_id" }[verb];
  if (!idField || subject !== `control.${role}.${verb}` || body?.role !== role) {
    throw new PlanactError(
      "rejected",
      `control message ${show({ role, verb, subject, body_role: body?.role })}: want verb pause or resume on control.<role>.<verb>, the body's role the message's`,
    );
  }
  if (typeof id !== "string" || id === "" || Buffer.byteLength(id) > MAX_CONTROL_ID) {
    throw new PlanactError("rejected", `${verb} of ${role}: Nats-Msg-Id ${show(id)}: want 1 to ${MAX_CONTROL_ID} bytes`);
  }
  checkMs("waitMs", waitMs);
  checkMs("recheckMs", recheckMs, { positive: true });
  const deadline = Date.now() + waitMs;
  const answered = `control.${role}.${verb === "pause" ? "paused" : "resumed"}`;
  const refused = `control.${role}.refused`;
  const what = `${verb} ${role} (${id})`;
  // answer returns planact's answer to msg in data (on subj), or null
  // when data answers another message; it throws a refusal of msg.
  const answer = (subj, data) => {
    let a;
    try {
      a = data && data.length > 0 ? decode(data) : null;
    } catch {
      return null; // not an answer of planact's: not ours
    }
    if (subj === refused) {
      if (a?.id === id && a?.verb === verb) {
        throw new PlanactError("refused", `${what}: refused by planact: ${a.reason ?? ""}`, a);
      }
      return null;
    }
    return a?.[idField] === id ? a : null;
  };
  // The answer may come before the publish is acknowledged: listen first.
  const arrived = [];
  let wake = () => {};
  const subs = [answered, refused].map((s) =>
    nc.subscribe(s, {
      callback: (err, m) => {
        if (!err) {
          arrived.push([m.subject, m.data]);
          wake();
        }
      },
    }),
  );
  try {
    const js = jetstream(nc, { timeout: REQUEST_TIMEOUT_MS });
    const data = encode(body, { ignoreUndefined: true });
    await untilUp(deadline, () =>
      js.publish(subject, data, { msgID: id, headers: planactHeaders(body.schema, undefined, role) }),
    );
    for (;;) {
      for (const s of [refused, answered]) {
        const a = answer(s, await lastOn(nc, s, CONTROL_STREAM));
        if (a) {
          return a;
        }
      }
      const next = Math.min(Date.now() + recheckMs, deadline);
      for (;;) {
        while (arrived.length > 0) {
          const a = answer(...arrived.shift());
          if (a) {
            return a;
          }
        }
        const left = next - Date.now();
        if (left <= 0) {
          break;
        }
        await new Promise((resolve) => {
          const timer = setTimeout(resolve, left);
          wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        wake = () => {};
      }
      if (Date.now() >= deadline) {
        throw new PlanactError(
          "timeout",
          `${what}: sent, but no answer from planact within ${waitMs} ms (is its session-store running?); the ${verb} stays published, and is taken once it runs`,
        );
      }
      if (nc.isClosed()) {
        throw new PlanactError("failed", `${what}: the connection is closed`);
      }
    }
  } finally {
    for (const sub of subs) {
      sub.unsubscribe();
    }
  }
}

/**
 * waitResult waits for role's result of rollout, or for the rejection of
 * arrival (what arrive returned; with one, a result or rejection that
 * names no arrival, an older planact's, is passed over; without one every
 * result and rejection counts), and returns it with its samples (fetched from the object store
 * results_<role> when the result names samples_object). It subscribes to
 * the result and rejection subjects and reads the last message on each
 * with a direct get now and every recheckMs, so a result published before
 * the wait or while the connection was down is found too. Throws a
 * PlanactError "timeout" when timeoutMs passes or signal aborts first, and
 * "rejected" at once for a role, rollout, timeoutMs or recheckMs no wait
 * could end on.
 */
export async function waitResult(
  nc,
  rollout,
  role,
  { arrival, timeoutMs = 3_600_000, recheckMs = DEFAULT_RECHECK_MS, signal } = {},
) {
  checkServer(nc);
  checkTarget(rollout, role);
  checkMs("timeoutMs", timeoutMs);
  checkMs("recheckMs", recheckMs, { positive: true });
  const deadline = Date.now() + timeoutMs;
  const subjects = [resultSubject(rollout, role), rejectedSubject(rollout, role)];
  const arrived = [];
  let wake = () => {};
  const subs = subjects.map((s) =>
    nc.subscribe(s, {
      callback: (err, msg) => {
        if (!err) {
          arrived.push(msg.data);
          wake();
        }
      },
    }),
  );
  const onAbort = () => wake();
  signal?.addEventListener("abort", onAbort);
  try {
    for (;;) {
      for (const s of subjects) {
        const r = accept(await lastOn(nc, s), arrival);
        if (r) {
          return await withSamples(nc, r, { rollout, role }, deadline);
        }
      }
      const next = Math.min(Date.now() + recheckMs, deadline);
      for (;;) {
        while (arrived.length > 0) {
          const r = accept(arrived.shift(), arrival);
          if (r) {
            return await withSamples(nc, r, { rollout, role }, deadline);
          }
        }
        const left = next - Date.now();
        if (left <= 0 || signal?.aborted) {
          break;
        }
        await new Promise((resolve) => {
          const timer = setTimeout(resolve, left);
          wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        wake = () => {};
      }
      if (signal?.aborted) {
        throw new PlanactError(
          "timeout",
          `stopped waiting for the ${role} result of rollout ${rollout}: ${signal.reason?.message ?? signal.reason ?? "aborted"}`,
        );
      }
      if (Date.now() >= deadline) {
        throw new PlanactError("timeout", `no ${role} result for rollout ${rollout} within ${timeoutMs} ms`);
      }
      if (nc.isClosed()) {
        throw new PlanactError("failed", `wait for rollout ${rollout}: the connection is closed`);
      }
    }
  } finally {
    signal?.removeEventListener("abort", onAbort);
    for (const sub of subs) {
      sub.unsubscribe();
    }
  }
}

/**
 * rollout arrives and waits for the result. It returns the result for
 * status ok, partial and aborted (samples of the episodes that ended;
 * check status), and throws a PlanactError otherwise: "timeout" (fall back
 * to the standard rollout), "rejected" (invalid) or "failed".
 */
export async function rollout(nc, arrival, { timeoutMs = 3_600_000, inlineTasksLimit, recheckMs, signal } = {}) {
  checkMs("timeoutMs", timeoutMs);
  const deadline = Date.now() + timeoutMs;
  const made = await arrive(nc, arrival, { inlineTasksLimit, timeoutMs });
  const result = await waitResult(nc, arrival.rollout, arrival.role, {
    arrival: made,
    timeoutMs: Math.max(0, deadline - Date.now()),
    recheckMs,
    signal,
  });
  result.arrival = made;
  return outcome(result);
}

/**
 * evaluate runs an evaluation rollout: one that yields metrics, not
 * samples. The arrival that brings the config or the tasks (the planner's)
 * gets config.evaluation; the other role's arrival brings none and gets the
 * same result: stats (stats.datasets per dataset, when the tasks name
 * theirs in task.dataset) and every episode's outcome (result.episodes),
 * no samples. Throws like rollout, and a PlanactError "rejected" when the
 * rollout is not an evaluation (the config that won did not ask for one).
 * Returns the result; evaluationMetrics(result) sums it up.
 */
export async function evaluate(nc, arrival, options = {}) {
  if (arrival.config || arrival.tasks?.length) {
    arrival = { ...arrival, config: { ...(arrival.config ?? {}), evaluation: true } };
  }
  const result = await rollout(nc, arrival, options);
  return checkEvaluation(result);
}

/**
 * checkEvaluation returns result if it is an evaluation's (no samples, an
 * outcome per episode) and throws a PlanactError "rejected" otherwise.
 */
export function checkEvaluation(result) {
  if (!result.evaluation) {
    throw new PlanactError(
      "rejected",
      `rollout ${result.rollout ?? 0} (${result.role}) is not an evaluation (the config that won, the planner's, did not set evaluation): it delivered ${result.sample_count ?? 0} samples`,
      result,
    );
  }
  return result;
}

/**
 * evaluationMetrics sums up an evaluation's result: its status, the whole
 * rollout's accuracy, mean reward, turns and acts per episode and failures,
 * and the same per dataset.
 */
export function evaluationMetrics(result) {
  const st = result.stats ?? {};
  const numbers = (s) => ({
    episodes: s.episodes ?? 0,
    ended: s.ended ?? 0,
    accuracy: s.accuracy ?? 0,
    mean_reward: s.mean_reward ?? 0,
    mean_turns: s.mean_turns ?? 0,
    acts_per_episode: s.acts_per_episode ?? 0,
    failures: s.failures ?? {},
    episode_status: s.episode_status ?? {},
  });
  return {
    status: result.status,
    reason: result.reason ?? "",
    evaluation: true,
    samples: result.samples?.length ?? 0,
    ...numbers(st),
    episodes_reported: result.episodes?.length ?? 0,
    datasets: Object.fromEntries(Object.entries(st.datasets ?? {}).map(([name, s]) => [name, numbers(s)])),
  };
}

/**
 * outcome returns result when it brings samples (ok, partial, aborted) and
 * throws the PlanactError its status means otherwise.
 */
export function outcome(result) {
  const what = `rollout ${result.rollout ?? 0} (${result.role}): ${result.status}${result.reason ? `: ${result.reason}` : ""}`;
  switch (result.status) {
    case "ok":
    case "partial":
    case "aborted":
      return result;
    case "timeout":
      throw new PlanactError("timeout", what, result);
    case "invalid":
      throw new PlanactError("rejected", what, result);
    default:
      throw new PlanactError("failed", what, result);
  }
}

// accept returns the result in data, or null when there is none, or it
// names no arrival while we made one (an older planact's, of an earlier
// rollout of the number: not known to answer ours, as in the Go client),
// or it is the rejection of another arrival of ours, or the result of the
// rollout that ended before this arrival (the session-store answers such
// an arrival on the rejection subject, which the wait then reads).
function accept(data, mine) {
  if (!data || data.length === 0) {
    return null;
  }
  const r = decode(data);
  if (r?.schema !== RESULT_SCHEMA) {
    throw new PlanactError("failed", `result schema ${JSON.stringify(r?.schema)}: this trainer reads ${RESULT_SCHEMA}`);
  }
  if (!mine?.id || r.arrival_id === mine.id) {
    return r;
  }
  if (!r.arrival_id) {
    return null; // answers no arrival known: not known to be ours
  }
  if (r.rejected) {
    return null; // the rejection of an earlier arrival
  }
  const finished = r.stats?.finished_ms ?? 0;
  return finished > 0 && finished <= mine.atMs ? null : r;
}

// lastOn returns the body of the last message on subject in stream (the
// ROLLOUT stream unless named; a direct get), or null when there is none
// yet or the server is away for now.
async function lastOn(nc, subject, stream = ROLLOUT_STREAM) {
  try {
    const m = await nc.request(`$JS.API.DIRECT.GET.${stream}.${subject}`, Empty, {
      timeout: REQUEST_TIMEOUT_MS,
    });
    return m.headers?.hasError ? null : m.data; // 404: nothing on the subject yet
  } catch (err) {
    if (transient(err)) {
      return null;
    }
    throw err;
  }
}

// withSamples fetches r's samples from its role's object store when they
// are there, and those of the delivered groups it leaves out (read for
// what was asked: rollout, role), and checks them against what r counts.
// The result says the objects exist, so failures are tried again until
// the deadline.
async function withSamples(nc, r, asked, deadline) {
  if (r.samples_object) {
    r.samples = await objectSamples(nc, r.role, r.samples_object, deadline);
  }
  r.samples ??= [];
  // A status is a claim, and so is a count. planact omits a zero count
  // (msgpack omitempty): an absent sample_count or group_samples is 0.
  const count = r.sample_count ?? 0;
  if (r.samples.length !== count) {
    throw new PlanactError(
      "failed",
      `rollout ${asked.rollout}: its ${asked.role} result holds ${r.samples.length} samples and counts ${count} (sample_count)`,
      r,
    );
  }
  // result_samples undelivered: the delivered groups' samples are in
  // their own messages, not in the result. A group's samples are in its
  // message or the result, never both; sort is stable.
  const groups = r.delivered_groups ?? [];
  let inGroups = 0;
  for (const g of groups) {
    const samples = await groupSamples(nc, asked.rollout, asked.role, g, deadline);
    inGroups += samples.length;
    r.samples.push(...samples);
  }
  const counted = r.group_samples ?? 0;
  if (inGroups !== counted) {
    throw new PlanactError(
      "failed",
      `rollout ${asked.rollout}: the ${groups.length} groups its ${asked.role} result names delivered hold ${inGroups} samples, the result counts ${counted} (group_samples)`,
      r,
    );
  }
  if (groups.length > 0) {
    r.samples.sort((a, b) => (a.group_index ?? 0) - (b.group_index ?? 0));
  }
  return r;
}

// groupSamples reads the samples of group g that role's result of rollout
// names delivered, and checks that the group message is that group's and
// holds what it counts.
async function groupSamples(nc, rollout, role, g, deadline) {
  const subject = `rollout.${rollout}.result.${role}.group.${g}`;
  const group = decode(
    await untilUp(deadline, async () => {
      const data = await lastOn(nc, subject);
      if (data === null) {
        throw new PlanactError("failed", `the result names group ${g} delivered, and ${subject} holds nothing`);
      }
      return data;
    }),
  );
  // Zero values are omitted: an absent rollout, group_index or sample_count is 0.
  for (const [field, got, want] of [
    ["rollout", group.rollout ?? 0, rollout],
    ["role", group.role, role],
    ["group_index", group.group_index ?? 0, g],
  ]) {
    if (got !== want) {
      throw new PlanactError(
        "failed",
        `${subject}: the group message's ${field} is ${JSON.stringify(got)}, the result names ${field} ${JSON.stringify(want)}`,
      );
    }
  }
  const samples = group.samples_object
    ? await objectSamples(nc, role, group.samples_object, deadline)
    : (group.samples ?? []);
  const count = group.sample_count ?? 0;
  if (samples.length !== count) {
    throw new PlanactError("failed", `${subject}: group ${g} holds ${samples.length} samples and counts ${count} (sample_count)`);
  }
  return samples;
}

// objectSamples reads the samples in object name of role's object store
// results_<role>, trying again until the deadline.
async function objectSamples(nc, role, name, deadline) {
  const bucket = `results_${role}`;
  const data = await untilUp(deadline, async () => {
    const blob = await readObject(nc, bucket, name);
    if (blob === null) {
      throw new PlanactError("failed", `samples ${bucket}/${name}: no such object`);
    }
    return blob;
  });
  return decode(data);
}

// checkTarget refuses, at once, a rollout or role no message is ever
// published for, as arrive does.
function checkTarget(rollout, role) {
  checkRole(role);
  if (!Number.isSafeInteger(rollout) || rollout < 0) {
    throw new PlanactError("rejected", `rollout ${rollout}: want an integer >= 0`);
  }
}

// checkReason refuses, at once, a pause's or cancel's (what's) reason
// planact would refuse: not a string, or over MAX_REASON bytes.
function checkReason(what, reason) {
  if (typeof reason !== "string") {
    throw new PlanactError("rejected", `${what}: reason ${show(reason)} (${typeof reason}): want a string`);
  }
  const bytes = Buffer.byteLength(reason);
  if (bytes > MAX_REASON) {
    throw new PlanactError(
      "rejected",
      `${what}: reason ${JSON.stringify(reason.slice(0, 32))}… (${bytes} bytes): want at most ${MAX_REASON} bytes (planact repeats it in its answers)`,
    );
  }
}

// checkRole refuses, at once, a role planact does not have: no answer
// would ever come.
function checkRole(role) {
  if (!ROLES.includes(role)) {
    throw new PlanactError("rejected", `role ${show(role)}: want planner or actor`);
  }
}

// checkOptions refuses an option what does not take (Go's Abort or
// Timeout, a misspelling): left unread, it would be a silent default.
function checkOptions(what, options, known) {
  if (options === null || typeof options !== "object" || Array.isArray(options)) {
    throw new PlanactError("rejected", `${what}: options ${show(options)}: want an object`);
  }
  const unknown = Object.keys(options).filter((k) => !known.includes(k));
  if (unknown.length > 0) {
    throw new PlanactError(
      "rejected",
      `${what}: unknown option ${unknown.map((k) => JSON.stringify(k)).join(", ")}: want ${known.join(", ")}`,
    );
  }
}

// show writes v as an error message names it: a string quoted, anything
// else as JavaScript writes it.
function show(v) {
  if (typeof v === "string") {
    return JSON.stringify(v);
  }
  if (v !== null && typeof v === "object") {
    try {
      return JSON.stringify(v);
    } catch {
      return String(v);
    }
  }
  return String(v);
}

// checkMs refuses a duration option that is not a number of milliseconds
// >= 0 (> 0 when positive): NaN, a negative or a string would make a
// deadline that never passes.
function checkMs(name, ms, { positive = false } = {}) {
  if (typeof ms !== "number" || Number.isNaN(ms) || ms < 0 || (positive && ms === 0)) {
    const shown = typeof ms === "string" ? JSON.stringify(ms) : String(ms);
    throw new PlanactError(
      "rejected",
      `${name} ${shown} (${typeof ms}): want a number of milliseconds ${positive ? "> 0" : ">= 0"}`,
    );
  }
}

// objectDigest is what an object store records of data: SHA-256=, then
// the digest in padded URL-safe base64.
function objectDigest(data) {
  return `SHA-256=${padded64url(createHash("sha256").update(data).digest())}`;
}

function padded64url(bytes) {
  return Buffer.from(bytes).toString("base64").replace(/\+/g, "-").replace(/\//g, "_");
}

// msgGet reads one message of stream from its leader (the JetStream API's
// STREAM.MSG.GET), or null when there is none.
async function msgGet(nc, stream, query) {
  const m = await nc.request(`$JS.API.STREAM.MSG.GET.${stream}`, JSON.stringify(query), { timeout: REQUEST_TIMEOUT_MS });
  const r = JSON.parse(new TextDecoder().decode(m.data));
  if (r.error) {
    if (r.error.err_code === NOT_FOUND) {
      return null;
    }
    throw new PlanactError("failed", `${stream}: ${r.error.description} (${r.error.err_code})`);
  }
  return { seq: r.message.seq, data: Buffer.from(r.message.data ?? "", "base64") };
}

/**
 * readObject reads object name of object store bucket without a consumer
 * (planact's accounts let no trainer create one): its metadata, then its
 * chunks one by one, from the stream's leader, checked against its digest.
 * It returns null when there is no such object.
 */
export async function readObject(nc, bucket, name) {
  const stream = `OBJ_${bucket}`;
  const meta = await msgGet(nc, stream, { last_by_subj: `$O.${bucket}.M.${padded64url(Buffer.from(name))}` });
  if (meta === null) {
    return null;
  }
  const info = JSON.parse(meta.data.toString());
  if (info.deleted) {
    return null;
  }
  const chunks = [];
  let seq = 0;
  for (let i = 0; i < (info.chunks ?? 0); i++) {
    const m = await msgGet(nc, stream, { seq: seq + 1, next_by_subj: `$O.${bucket}.C.${info.nuid}` });
    if (m === null) {
      throw new errors.TimeoutError(); // not all there yet: read again
    }
    chunks.push(m.data);
    seq = m.seq;
  }
  const data = Buffer.concat(chunks);
  const size = info.size ?? 0;
  const what = `object ${bucket}/${name}`;
  if (data.length > size) {
    // No read mends this (as in the Go client): an error now.
    throw permanent(new PlanactError("failed", `${what}: ${data.length} bytes, more than the ${size} bytes its metadata says`));
  }
  if (data.length < size) {
    throw new errors.TimeoutError(); // not all there yet: read again
  }
  if (objectDigest(data) !== info.digest) {
    throw permanent(
      new PlanactError("failed", `${what}: ${data.length} bytes do not match its digest (${objectDigest(data)}, metadata ${info.digest})`),
    );
  }
  return data;
}

// untilUp runs op until it succeeds, trying again with back-off while the
// failure is one planact or NATS recovers from (planact not up yet, a
// lost reply, a bucket not yet provisioned), until the deadline.
async function untilUp(deadline, op) {
  for (let wait = 50; ; wait = Math.min(2 * wait, 1000)) {
    try {
      return await op();
    } catch (err) {
      if (!transient(err) || Date.now() + wait >= deadline) {
        throw err;
      }
    }
    await sleep(wait);
  }
}

// permanent marks err as one no read mends (an object whose data is not
// its digest): untilUp throws it at once rather than at the deadline.
function permanent(err) {
  err.permanent = true;
  return err;
}

function transient(err) {
  if (err?.permanent) {
    return false;
  }
  if (err instanceof PlanactError) {
    return err.code !== "rejected";
  }
  if (err instanceof errors.TimeoutError || err instanceof errors.NoRespondersError) {
    return true;
  }
  if (err instanceof errors.RequestError) {
    return err.isNoResponders() || err.cause instanceof errors.TimeoutError;
  }
  // The object store's "stream not found" while planact provisions.
  return err?.name === "StreamNotFoundError" || /stream not found/i.test(err?.message ?? "");
}

// planactHeaders are the headers of a message of schema; a pause or a
// resume names no rollout (rollout undefined), and planact refuses a
// Planact-Rollout on one.
function planactHeaders(schema, rollout, role) {
  const h = headers();
  h.set("Planact-Schema", schema);
  if (rollout !== undefined) {
    h.set("Planact-Rollout", String(rollout));
  }
  h.set("Planact-Role", role);
  h.set("Content-Type", CONTENT_TYPE);
  return h;
}

// omitZero drops the top-level fields that hold a zero value, as planact's
// own messages do (a reader treats a missing field as zero).
function omitZero(body) {
  const zero = (v) =>
    v === undefined || v === null || v === "" || v === 0 || v === false || (Array.isArray(v) && v.length === 0);
  return Object.fromEntries(Object.entries(body).filter(([k, v]) => k === "rollout" || !zero(v)));
}

/**
 * checkSamples verifies the invariants a trainer relies on in the results
 * of a rollout ({ planner, actor }: either may be absent) and returns
 * { ok, errors }. Per sample: tokens = prompt tokens + response_length
 * (at least one prompt token, the same ids for the same prompt text),
 * loss_mask and rollout_log_probs one per response token (log-probs absent
 * only when metadata.log_probs_missing says why: an engine that returned
 * none), mask values 0 or 1, log-probs finite and <= 0 on trained tokens, a finite reward, a known
 * status, weight_versions. Per result: sample_count (+ group_samples)
 * samples, absent counts being 0, grouped by group_index then index, token
 * totals as stats.tokens says; when it lists its tasks, samples of every
 * trained task and none of a filtered, quarantined, empty, unfinished or
 * evaluated one. Planner rollout_ids unique, at most one per ended
 * episode; at most stats.acts actor samples (stats.acts counts the acts of
 * quarantined episodes and of filtered or surplus groups too, which give
 * none), each in an episode with a planner sample.
 */
export function checkSamples({ planner, actor } = {}) {
  const errs = [];
  const fail = (msg) => errs.push(msg);
  for (const [role, r] of Object.entries({ planner, actor })) {
    if (!r) {
      continue;
    }
    const samples = r.samples ?? [];
    // group_samples: those of the delivered groups a result leaves out
    // (result_samples undelivered), read from the groups.
    const counted = (r.sample_count ?? 0) + (r.group_samples ?? 0);
    if (counted !== samples.length) {
      fail(`${role}: sample_count ${r.sample_count ?? 0} + group_samples ${r.group_samples ?? 0}, ${samples.length} samples`);
    }
    const prompts = new Map(); // prompt text -> prompt token ids
    let tokens = 0;
    samples.forEach((s, i) => {
      const where = `${role} sample ${i} (${s.rollout_id})`;
      checkSample(s, where, fail);
      tokens += s.tokens?.length ?? 0;
      if (i > 0 && before(s, samples[i - 1])) {
        fail(`${where}: ${position(s)} after ${position(samples[i - 1])}: not grouped by group_index, then index`);
      }
      const promptIds = (s.tokens ?? []).slice(0, (s.tokens?.length ?? 0) - (s.response_length ?? 0));
      const seen = prompts.get(s.prompt ?? "");
      if (seen && !sameIds(seen, promptIds)) {
        fail(`${where}: the same prompt text as an earlier sample, other prompt token ids`);
      }
      prompts.set(s.prompt ?? "", promptIds);
    });
    const statTokens = r.stats?.tokens?.[role];
    if (statTokens !== undefined && statTokens !== tokens) {
      fail(`${role}: ${tokens} tokens in the samples, stats.tokens says ${statTokens}`);
    }
  }
  if (planner) {
    const ended = planner.stats?.ended ?? planner.stats?.completed ?? 0; // completed: before planact had "ended"
    if ((planner.samples ?? []).length > ended) {
      fail(`planner: ${planner.samples.length} samples for ${ended} episodes that ended`);
    }
    const ids = new Set();
    for (const s of planner.samples ?? []) {
      if (ids.has(s.rollout_id)) {
        fail(`planner: two samples for episode ${s.rollout_id}`);
      }
      ids.add(s.rollout_id);
    }
    for (const s of actor?.samples ?? []) {
      if (!ids.has(s.rollout_id)) {
        fail(`actor sample of episode ${s.rollout_id}: no planner sample of that episode`);
      }
    }
  }
  if (actor) {
    // stats.acts counts every act the actor model ran in an episode that
    // ended, and only those give actor samples; it also counts the acts of
    // quarantined episodes and of filtered or surplus groups, which give
    // none: it bounds the samples, it does not count them (sample_count does).
    const acts = actor.stats?.acts ?? 0;
    const n = (actor.samples ?? []).length;
    if (n > acts) {
      fail(`actor: ${n} samples, stats.acts says ${acts}: more samples than acts`);
    }
  }
  for (const [role, r] of Object.entries({ planner, actor })) {
    if (r?.tasks) {
      checkTaskStates(role, r, fail);
    }
  }
  return { ok: errs.length === 0, errors: errs };
}

// The task states whose tasks may have samples in the result: trained
// ones must; failed or aborted episodes may have left some.
const STATES_WITH_SAMPLES = ["trained", "failed", "aborted"];

// checkTaskStates compares r's samples with the state it gives each task
// (r.tasks), matched by group_index and index (a sample carries its
// task's): a trained task has samples in the result; a filtered,
// quarantined, empty, unfinished or evaluated one has none, and no sample
// is of a task the result does not list.
function checkTaskStates(role, r, fail) {
  const key = (x) => `${x.group_index ?? 0}/${x.index ?? 0}`;
  const samples = new Map();
  for (const s of r.samples ?? []) {
    samples.set(key(s), (samples.get(key(s)) ?? 0) + 1);
  }
  const tasks = new Map(); // several tasks may share a group_index and index
  for (const t of r.tasks) {
    tasks.set(key(t), [...(tasks.get(key(t)) ?? []), t]);
  }
  for (const [k, ts] of tasks) {
    const n = samples.get(k) ?? 0;
    const trained = ts.find((t) => t.state === "trained");
    if (trained && n === 0) {
      fail(`${role}: task ${trained.episode ?? 0} (${position(trained)}) is trained, and the result has no sample of it`);
    }
    if (n > 0 && !ts.some((t) => STATES_WITH_SAMPLES.includes(t.state))) {
      const t = ts[0];
      fail(
        `${role}: ${n} samples of task ${t.episode ?? 0} (${position(t)}), whose state is ${t.state}${t.reason ? ` (${t.reason})` : ""}: such a task has none`,
      );
    }
  }
  for (const [k, n] of samples) {
    if (!tasks.has(k)) {
      const [g, i] = k.split("/");
      fail(`${role}: ${n} samples of group ${g} index ${i}, a task the result does not list`);
    }
  }
}

function checkSample(s, where, fail) {
  const tokens = s.tokens ?? [];
  const n = s.response_length ?? 0;
  const mask = s.loss_mask ?? [];
  const lps = s.rollout_log_probs ?? [];
  const lpsAbsent = s.rollout_log_probs == null;
  if (!s.rollout_id) {
    fail(`${where}: no rollout_id`);
  }
  if (!SAMPLE_STATUSES.includes(s.status)) {
    fail(`${where}: status ${JSON.stringify(s.status)}, want one of ${SAMPLE_STATUSES.join(", ")}`);
  }
  if (!tokens.every((t) => Number.isInteger(t) && t >= 0)) {
    fail(`${where}: tokens are not all token ids`);
  }
  if (!Number.isInteger(n) || n < 0 || tokens.length - n < 1) {
    fail(`${where}: ${tokens.length} tokens, response_length ${n}: want at least one prompt token before the response`);
  }
  if (mask.length !== n || (lps.length !== n && !lpsAbsent)) {
    fail(`${where}: response_length ${n}, loss_mask ${mask.length}, rollout_log_probs ${lps.length}`);
  }
  if (lpsAbsent && n > 0 && !s.metadata?.log_probs_missing) {
    fail(`${where}: no rollout_log_probs for ${n} response tokens, and no metadata.log_probs_missing saying why`);
  }
  const badMask = mask.findIndex((m) => m !== 0 && m !== 1);
  if (badMask >= 0) {
    fail(`${where}: loss_mask[${badMask}] is ${mask[badMask]}`);
  }
  const badLp = lps.findIndex((lp, i) => !Number.isFinite(lp) || (mask[i] === 1 && lp > 0));
  if (badLp >= 0) {
    fail(`${where}: rollout_log_probs[${badLp}] is ${lps[badLp]} (loss_mask ${mask[badLp]})`);
  }
  if (!Number.isFinite(s.reward ?? 0)) {
    fail(`${where}: reward ${s.reward}`);
  }
  if (!Array.isArray(s.weight_versions) || s.weight_versions.length === 0) {
    fail(`${where}: no weight_versions`);
  }
}

const position = (s) => `group ${s.group_index ?? 0} index ${s.index ?? 0}`;

function before(a, b) {
  const ga = a.group_index ?? 0;
  const gb = b.group_index ?? 0;
  return ga !== gb ? ga < gb : (a.index ?? 0) < (b.index ?? 0);
}

function sameIds(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/**
 * summarize returns what a training step reports of a role's result:
 * status, samples, tokens and the mean reward of the samples.
 */
export function summarize(result) {
  const samples = result.samples ?? [];
  const rewards = samples.map((s) => s.reward ?? 0);
  return {
    status: result.status,
    reason: result.reason ?? "",
    samples: samples.length,
    tokens: samples.reduce((n, s) => n + (s.tokens?.length ?? 0), 0),
    trained_tokens: samples.reduce((n, s) => n + (s.loss_mask ?? []).reduce((a, m) => a + m, 0), 0),
    mean_reward: rewards.length > 0 ? rewards.reduce((a, b) => a + b, 0) / rewards.length : 0,
    ...(result.samples_object ? { samples_object: result.samples_object } : {}),
  };
}
