"""A planact trainer in Python: arrive for rollout N, wait for this role's
samples, fall back on time-out. Needs `pip install nats-py msgpack`.

    python trainer.py --role planner --rollout 7 --engine http://router:30000
    python trainer.py --role actor   --rollout 7 --engine http://router:30001

See docs/python_trainer.md and schemas/ for the wire format.
"""

import argparse
import asyncio
import hashlib
import time

import msgpack
import nats
from nats.js.api import DeliverPolicy

ROLLOUT_STREAM = "ROLLOUT"
RESULTS_BUCKET = "results"


def traceparent(rollout: int) -> str:
    # Both trainers derive the same W3C trace id from the rollout id, so the
    # whole rollout (arrivals included) is one trace.
    trace_id = hashlib.sha256(f"planact-rollout-{rollout}".encode()).hexdigest()[:32]
    span_id = hashlib.sha256(f"{trace_id}-{time.time_ns()}".encode()).hexdigest()[:16]
    return f"00-{trace_id}-{span_id}-01"


async def arrive(js, rollout, role, engine, weight_version, tasks=None, config=None):
    """Publish rollout.<N>.arrive (schema rollout.arrive/1)."""
    at_ms = int(time.time() * 1000)
    body = {
        "schema": "rollout.arrive/1",
        "rollout": rollout,
        "role": role,
        "engine": engine,  # {"url": ..., "protocol": "sglang" | "openai", "model": ...}
        "weight_version": weight_version,
        "at_ms": at_ms,
    }
    if tasks:  # usually the planner's arrival brings the batch
        body["tasks"] = tasks
    if config:
        body["config"] = config
    headers = {
        "Planact-Schema": "rollout.arrive/1",
        "Planact-Rollout": str(rollout),
        "Planact-Role": role,
        "Content-Type": "application/msgpack",
        # One id per arrival: a retried publish of it is dropped as a
        # duplicate, a corrected arrival after a rejection is not.
        "Nats-Msg-Id": f"arrive.{rollout}.{role}..{at_ms}",
        "traceparent": traceparent(rollout),
    }
    await js.publish(f"rollout.{rollout}.arrive", msgpack.packb(body, use_bin_type=True), headers=headers)


async def wait_result(js, rollout, role, timeout_s):
    """Wait for rollout.<N>.result.<role>; also finds one published earlier."""
    sub = await js.subscribe(
        f"rollout.{rollout}.result.{role}",
        stream=ROLLOUT_STREAM,  # no stream lookup: the trainer user may not list streams
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
    )
    try:
        msg = await sub.next_msg(timeout=timeout_s)
    finally:
        await sub.unsubscribe()
    result = msgpack.unpackb(msg.data, raw=False)
    if result.get("schema") != "rollout.result/1":
        raise ValueError(f"unexpected result schema {result.get('schema')!r}")
    if result.get("samples_object"):  # too large to be inline
        store = await js.object_store(RESULTS_BUCKET)
        obj = await store.get(result["samples_object"])
        result["samples"] = msgpack.unpackb(obj.data, raw=False)
    result.setdefault("samples", [])  # absent means empty
    return result


async def rollout(nats_url, rollout_id, role, engine, weight_version, tasks=None, config=None, timeout_s=3600):
    """Returns this role's samples, or None when the trainer should run its
    standard rollout instead (planact timed out or rejected the rollout)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await arrive(js, rollout_id, role, engine, weight_version, tasks, config)
        try:
            result = await wait_result(js, rollout_id, role, timeout_s)
        except nats.errors.TimeoutError:
            return None  # planact never answered: fall back
        status = result.get("status")
        if status in ("timeout", "invalid"):
            print(f"rollout {rollout_id}: {status}: {result.get('reason', '')}; falling back")
            return None
        # "ok", or "partial"/"aborted" with the samples finished so far
        return result["samples"]
    finally:
        await nc.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nats", default="nats://trainer:change-me-6@127.0.0.1:4222")
    p.add_argument("--rollout", type=int, required=True)
    p.add_argument("--role", choices=["planner", "actor"], required=True)
    p.add_argument("--engine", required=True, help="SGLang router URL of this job's engine")
    p.add_argument("--weight-version", default="v0")
    p.add_argument("--timeout", type=float, default=3600)
    a = p.parse_args()
    tasks = None
    if a.role == "planner":
        q = "What is the population of the capital of the largest neighbor of Sweden?"
        tasks = [{"group_index": 0, "index": i, "prompt": q, "label": "710 thousand"} for i in range(2)]
    samples = asyncio.run(rollout(
        a.nats, a.rollout, a.role, {"url": a.engine, "protocol": "sglang"}, a.weight_version,
        tasks=tasks, config={"max_turns": 4} if tasks else None, timeout_s=a.timeout,
    ))
    if samples is None:
        print("no planact samples: run the standard rollout")
        return
    for s in samples:
        # slime's Sample fields; keys absent on the wire are zero values
        print(s["rollout_id"], s["status"], s.get("reward", 0.0), len(s["tokens"]), "tokens,",
              s.get("response_length", 0), "response,", sum(s.get("loss_mask", [])), "trained")


if __name__ == "__main__":
    main()
