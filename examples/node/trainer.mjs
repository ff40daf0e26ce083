#!/usr/bin/env node
// A planact trainer from the command line: play the planner, the actor or
// both for one rollout, wait for the results, optionally check the samples,
// and print a JSON summary on stdout (progress and errors go to stderr).

import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { connect, credsAuthenticator } from "@nats-io/transport-node";

import {
  arrive,
  cancel,
  checkEvaluation,
  checkSamples,
  checkServer,
  evaluationMetrics,
  outcome,
  PlanactError,
  summarize,
  waitResult,
} from "./planact.js";

const USAGE = `usage: node trainer.mjs --rollout N [--role planner|actor|both] [flags]

  --nats URL[,URL…]            NATS servers (default $NATS_URL or nats://127.0.0.1:4222);
                               $NATS_USER/$NATS_PASSWORD, $NATS_TOKEN or --creds authenticate
  --creds FILE                 a NATS credentials file (default $NATS_CREDS)
  --inbox-prefix PREFIX        where replies and deliveries to this trainer come (default
                               $NATS_INBOX_PREFIX, else _INBOX_<$NATS_USER>, else _INBOX):
                               planact's accounts let each user read its own inboxes only
  --rollout N                  the rollout id (required)
  --role ROLE                  planner, actor or both (default both: two connections, one per job)
  --planner-engine URL         the planner's engine (for planner or both)
  --actor-engine URL           the actor's engine (for actor or both)
  --protocol P                 sglang (default) or openai
  --planner-weight-version V   copied into the planner's samples
  --actor-weight-version V     copied into the actor's samples
  --tasks FILE                 JSON Lines of {prompt, label, group_index, index, metadata} ('-': stdin)
  --prompt TEXT --label TEXT   instead of --tasks: one task
  --samples-per-prompt K       K copies of every task, sharing its group_index (default 1)
  --config FILE|JSON           the rollout configuration (sent as is: planact names a wrong field)
  --inline-tasks-limit BYTES   larger task lists go to the object store tasks_<role> (default 262144)
  --timeout SECONDS            stop waiting after this long and fall back (default 3600)
  --evaluate                   an evaluation: the planner's config gets evaluation, and each role
                               gets metrics (per dataset, when tasks name theirs in "dataset"),
                               no samples
  --check                      check the sample invariants; a violation fails the run
                               (weight_versions come from the engine or the --*-weight-version)
  --cancel REASON              instead of arriving: abort the rollout as --role (planner for both)

With --role both, once one role is refused or fails, the other is waited for 15 s more.
Exit status: 0 samples (metrics with --evaluate) for every role (and checks passed), 2 a
time-out (fall back to the standard rollout), 1 a rejection, a failure or a failed check.`;

// GRACE_MS is how long, once one role got no samples, the other is waited
// for before this trainer falls back for it too.
const GRACE_MS = 15_000;

async function main(argv, env, stdout, stderr) {
  let opts;
  try {
    opts = options(argv, env);
  } catch (err) {
    stderr.write(`trainer: ${err.message}\n\n${USAGE}\n`);
    return 1;
  }
  if (opts.help) {
    stdout.write(`${USAGE}\n`);
    return 0;
  }
  const conns = {};
  try {
    // One connection per role, as two training jobs would have; a cancel
    // speaks for one role only.
    const roles = opts.cancel !== undefined ? opts.roles.slice(0, 1) : opts.roles;
    for (const role of roles) {
      conns[role] = await connect({
        servers: opts.nats.split(","),
        name: `planact-node-${role}`,
        maxReconnectAttempts: -1,
        ...auth(opts, env),
        ...(opts.inboxPrefix ? { inboxPrefix: opts.inboxPrefix } : {}),
      });
      checkServer(conns[role]); // an old nats-server stops the trainer at once, saying why
    }
    if (opts.cancel !== undefined) {
      const [role] = roles;
      await cancel(conns[role], opts.rollout, role, opts.cancel);
      stdout.write(`${JSON.stringify({ rollout: opts.rollout, cancelled_as: role, reason: opts.cancel }, null, 2)}\n`);
      return 0;
    }
    const summary = await play(opts, conns, stderr);
    stdout.write(`${JSON.stringify(summary, null, 2)}\n`);
    if (!summary.ok) {
      return 1;
    }
    const wanted = opts.evaluate ? "metrics" : "samples";
    return opts.roles.every((r) => summary[r].outcome === wanted) ? 0 : 2;
  } catch (err) {
    stderr.write(`trainer: ${err.message}\n`);
    return 1;
  } finally {
    await Promise.all(Object.values(conns).map((nc) => nc.close()));
  }
}

// play arrives as every role of opts and waits for their results.
async function play(opts, conns, stderr) {
  const deadline = Date.now() + opts.timeoutMs;
  const arrivals = {};
  for (const role of opts.roles) {
    const arrival = {
      rollout: opts.rollout,
      role,
      engine: { url: opts.engines[role], protocol: opts.protocol },
      weight_version: opts.weightVersions[role],
      config: opts.config,
    };
    if (role === "planner") {
      arrival.tasks = opts.tasks; // the planner brings the batch
    }
    arrivals[role] = await arrive(conns[role], arrival, {
      inlineTasksLimit: opts.inlineTasksLimit,
      timeoutMs: opts.timeoutMs,
    });
    const { id, tasksObject } = arrivals[role];
    stderr.write(
      `${role}: arrived for rollout ${opts.rollout} (${id}${tasksObject ? `, tasks in ${tasksObject}` : ""})\n`,
    );
  }
  const stops = Object.fromEntries(opts.roles.map((r) => [r, new AbortController()]));
  const settled = {};
  const wait = async (role) => {
    try {
      const r = await waitResult(conns[role], opts.rollout, role, {
        arrival: arrivals[role],
        timeoutMs: Math.max(0, deadline - Date.now()),
        signal: stops[role].signal,
      });
      settled[role] = { result: opts.evaluate ? checkEvaluation(outcome(r)) : outcome(r) };
    } catch (e) {
      const err = e instanceof PlanactError ? e : new PlanactError("failed", e.message);
      settled[role] = { result: err.result, error: err };
      if (err.code !== "timeout") {
        giveUpOthers(role);
      }
    }
  };
  // A refused role does not end the rollout for the other (a corrected
  // arrival may still complete the pair), but it will not run as asked:
  // the other role is waited for a little longer, in case it is refused too.
  const giveUpOthers = (role) => {
    for (const other of opts.roles.filter((r) => r !== role && !settled[r])) {
      setTimeout(() => stops[other].abort(new Error(`the ${role} got no samples`)), GRACE_MS).unref();
    }
  };
  await Promise.all(opts.roles.map(wait));

  const summary = { rollout: opts.rollout, ok: true };
  let stats;
  for (const role of opts.roles) {
    const { result, error } = settled[role];
    stats ??= result?.stats;
    const s = !result
      ? { status: "timeout", reason: error.message, samples: 0 }
      : opts.evaluate && result.evaluation
        ? evaluationMetrics(result)
        : summarize(result);
    s.outcome = !error ? (opts.evaluate ? "metrics" : "samples") : error.code === "timeout" ? "fallback" : "error";
    s.arrival_id = arrivals[role].id;
    if (arrivals[role].tasksObject) {
      s.tasks_object = arrivals[role].tasksObject;
    }
    summary[role] = s;
    if (s.outcome === "error") {
      summary.ok = false;
    }
    stderr.write(
      error
        ? `${role}: ${s.outcome === "fallback" ? "falling back to the standard rollout" : "no samples"}: ${error.message}\n`
        : opts.evaluate
          ? `${role}: ${s.status} — evaluated ${s.episodes} episodes, accuracy ${s.accuracy.toFixed(3)}, mean reward ${s.mean_reward.toFixed(3)}\n`
          : `${role}: ${s.status} — ${s.samples} samples, ${s.tokens} tokens, mean reward ${s.mean_reward.toFixed(3)}\n`,
    );
  }
  if (stats) {
    Object.assign(summary, {
      episodes: stats.episodes ?? 0,
      acts: stats.acts ?? 0,
      accuracy: stats.accuracy ?? 0,
      mean_reward: stats.mean_reward ?? 0,
      stats,
    });
  }
  if (opts.check) {
    const got = Object.fromEntries(opts.roles.filter((r) => !settled[r].error).map((r) => [r, settled[r].result]));
    summary.check = checkSamples(got);
    if (!summary.check.ok) {
      summary.ok = false;
      stderr.write(`check: ${summary.check.errors.length} violations, first: ${summary.check.errors[0]}\n`);
    }
  }
  return summary;
}

function options(argv, env) {
  const { values: v } = parseArgs({
    args: argv,
    options: {
      nats: { type: "string", default: env.NATS_URL || "nats://127.0.0.1:4222" },
      creds: { type: "string", default: env.NATS_CREDS || "" },
      "inbox-prefix": { type: "string", default: env.NATS_INBOX_PREFIX || (env.NATS_USER ? `_INBOX_${env.NATS_USER}` : "") },
      rollout: { type: "string" },
      role: { type: "string", default: "both" },
      "planner-engine": { type: "string" },
      "actor-engine": { type: "string" },
      protocol: { type: "string", default: "sglang" },
      "planner-weight-version": { type: "string" },
      "actor-weight-version": { type: "string" },
      tasks: { type: "string" },
      prompt: { type: "string" },
      label: { type: "string", default: "" },
      "samples-per-prompt": { type: "string", default: "1" },
      config: { type: "string" },
      "inline-tasks-limit": { type: "string" },
      timeout: { type: "string", default: "3600" },
      check: { type: "boolean", default: false },
      evaluate: { type: "boolean", default: false },
      cancel: { type: "string" },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (v.help) {
    return { help: true };
  }
  const rollout = Number(v.rollout);
  if (v.rollout === undefined || !Number.isSafeInteger(rollout) || rollout < 0) {
    throw new Error(`--rollout ${v.rollout ?? "(missing)"}: want an integer >= 0`);
  }
  const roles = { both: ["planner", "actor"], planner: ["planner"], actor: ["actor"] }[v.role];
  if (!roles) {
    throw new Error(`--role ${v.role}: want planner, actor or both`);
  }
  const opts = {
    nats: v.nats,
    creds: v.creds,
    inboxPrefix: v["inbox-prefix"],
    rollout,
    roles,
    protocol: v.protocol,
    engines: { planner: v["planner-engine"], actor: v["actor-engine"] },
    weightVersions: { planner: v["planner-weight-version"], actor: v["actor-weight-version"] },
    timeoutMs: positive("--timeout", v.timeout) * 1000,
    check: v.check,
    evaluate: v.evaluate,
    cancel: v.cancel,
  };
  if (v["inline-tasks-limit"] !== undefined) {
    opts.inlineTasksLimit = positive("--inline-tasks-limit", v["inline-tasks-limit"]);
  }
  if (v.cancel !== undefined) {
    return opts;
  }
  for (const role of roles) {
    if (!opts.engines[role]) {
      throw new Error(`--${role}-engine is required for the ${role}`);
    }
  }
  if (v.config !== undefined) {
    const text = v.config.trimStart().startsWith("{") ? v.config : readFileSync(v.config, "utf8");
    opts.config = JSON.parse(text);
  }
  if (v.evaluate && v.check) {
    throw new Error("--check checks samples, and an evaluation (--evaluate) has none: give one of them");
  }
  if (v.evaluate) {
    opts.config = { ...(opts.config ?? {}), evaluation: true };
  }
  if (roles.includes("planner")) {
    const copies = positive("--samples-per-prompt", v["samples-per-prompt"]);
    const distinct =
      v.tasks !== undefined ? readTasks(v.tasks) : v.prompt ? [{ prompt: v.prompt, label: v.label }] : [];
    if (distinct.length === 0) {
      throw new Error("the planner brings the tasks: give --tasks or --prompt");
    }
    // Copies of a task share its group_index and are numbered in order.
    opts.tasks = distinct
      .flatMap((t, line) => Array.from({ length: copies }, () => ({ ...t, group_index: t.group_index ?? line })))
      .map((t, i) => ({ ...t, index: copies > 1 ? i : (t.index ?? i) }));
  }
  return opts;
}

// readTasks reads JSON Lines of tasks, as they are: planact itself refuses
// a task with a field it does not know and names it.
function readTasks(path) {
  const text = readFileSync(path === "-" ? 0 : path, "utf8");
  return text
    .split("\n")
    .map((line, i) => [line.trim(), i + 1])
    .filter(([line]) => line !== "")
    .map(([line, n]) => {
      let t;
      try {
        t = JSON.parse(line);
      } catch (err) {
        throw new Error(`${path}:${n}: ${err.message}`);
      }
      if (typeof t?.prompt !== "string" || t.prompt === "") {
        throw new Error(`${path}:${n}: task has no prompt`);
      }
      return t;
    });
}

function positive(flag, text) {
  const n = Number(text);
  if (!Number.isFinite(n) || n <= 0) {
    throw new Error(`${flag} ${text}: want a positive number`);
  }
  return n;
}

function auth(opts, env) {
  if (opts.creds) {
    return { authenticator: credsAuthenticator(readFileSync(opts.creds)) };
  }
  if (env.NATS_USER) {
    return { user: env.NATS_USER, pass: env.NATS_PASSWORD ?? "" };
  }
  return env.NATS_TOKEN ? { token: env.NATS_TOKEN } : {};
}

process.exitCode = await main(process.argv.slice(2), process.env, process.stdout, process.stderr);
