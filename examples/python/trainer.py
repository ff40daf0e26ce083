"""A planact trainer in Python: arrive for rollout N, wait for this role's
samples, fall back on time-out. Needs `pip install nats-py msgpack`.

    python trainer.py --role planner --rollout 7 --engine http://router:30000
    python trainer.py --role actor   --rollout 7 --engine http://router:30001

See docs/python_trainer.md and schemas/ for the wire format.
"""

import argparse
import asyncio
import base64
import hashlib
import json
import os
import re
import secrets
import time

import msgpack
import nats

ROLLOUT_STREAM = "ROLLOUT"
RECHECK_S = 2.0  # how often the wait reads the result subjects again
# Above this encoded size the tasks go to the role's object store
# tasks_<role> and the arrival names them (tasks_object, tasks_sha256), as
# the Go client does: planact's trainer streams take 1 MiB messages at most.
INLINE_TASKS_LIMIT = 256 << 10
NOT_FOUND = 10037  # the JetStream API's "message not found"


def server_list(urls, name="the NATS URL"):
    """The servers of a comma-separated list of URLs (a cluster's, as
    planact's NATS_URL takes them), for nats.connect(servers=...), which
    takes a list and would read the whole text as one URL."""
    servers = [u.strip() for u in urls.split(",")]
    if not all(servers):
        raise ValueError(f"{name} {urls!r}: want one or more URLs, comma-separated, such as nats://nats-1:4222,nats://nats-2:4222")
    return servers


def inbox_prefix(user):
    """The inbox prefix of a NATS user: planact's accounts let each user
    read its own inboxes only (_INBOX_<user>.>), so a trainer connects with
    nats.connect(..., inbox_prefix=inbox_prefix(user))."""
    return f"_INBOX_{user}"


# The oldest nats-server planact runs on: the rollouts' time-outs are
# scheduled messages (2.12), and its buckets' keys expire with limit markers
# (2.11). An older server refuses some of these settings and silently drops
# others.
MIN_SERVER_VERSION = (2, 12, 0)


class Unreadable(RuntimeError):
    """What a message planact published says is there could not be read
    before the wait's deadline: a group or a samples object. planact did
    answer; falling back on the standard rollout would hide the loss."""


class Miscounted(ValueError):
    """A message of planact's holds other than the samples it counts: a
    count that differs means samples lost or doubled on the way."""


class NotUp(RuntimeError):
    """No stream took a publish before the deadline: planact is not up (its
    streams are not there yet), or no acknowledgement came back."""


class ServerTooOld(RuntimeError):
    """The nats-server is older than planact needs: nothing planact does
    could work there, and waiting would only hide why."""


def check_server(nc, where):
    """Raises ServerTooOld, in one line naming the server's version and the
    one planact needs, when nc (connected to where) is a nats-server older
    than MIN_SERVER_VERSION."""
    v = nc.connected_server_version  # nats-py's ServerVersion; 0.0.0 when unknown
    have = (v.major, v.minor, v.patch)
    if have < MIN_SERVER_VERSION:
        raise ServerTooOld(f"nats-server too old for planact: {where} runs {'.'.join(map(str, have))}, "
                           f"planact needs {'.'.join(map(str, MIN_SERVER_VERSION))} or later")


def traceparent(rollout: int) -> str:
    # Both trainers derive the same W3C trace id from the rollout id, so the
    # whole rollout (arrivals included) is one trace.
    trace_id = hashlib.sha256(f"planact-rollout-{rollout}".encode()).hexdigest()[:32]
    span_id = hashlib.sha256(f"{trace_id}-{time.time_ns()}".encode()).hexdigest()[:16]
    return f"00-{trace_id}-{span_id}-01"


def arrival_message(rollout, role, engine, weight_version, tasks=None, config=None, at_ms=None, tasks_object=None,
                    tasks_sha256=None, sampling=None, attempt=None):
    """The subject, headers and msgpack body of an arrival (schema
    rollout.arrive/1) on rollout.<N>.arrive.<role>. tasks_object names tasks
    put in the object store instead, tasks_sha256 their digest (see
    offload_tasks); sampling is the role's own model's sampling, which
    becomes the rollout's <role>_sampling; attempt tells a deliberate
    re-arrival from the first. Each call makes a new arrival: its
    Nats-Msg-Id ends in a random nonce of its own."""
    at_ms = at_ms or int(time.time() * 1000)
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
    if tasks_object:
        body["tasks_object"] = tasks_object
        body["tasks_sha256"] = tasks_sha256
    if config:
        body["config"] = config
    if sampling:
        body["sampling"] = sampling
    if attempt:
        body["attempt"] = attempt
    headers = {
        "Planact-Schema": "rollout.arrive/1",
        "Planact-Rollout": str(rollout),
        "Planact-Role": role,
        "Content-Type": "application/msgpack",
        # One id per arrival: a retried publish of it is dropped as a
        # duplicate, a corrected arrival after a rejection is not, even in
        # the same millisecond (the nonce, as the Go and Node clients'); an
        # answer names the arrival it answers by this id (arrival_id).
        "Nats-Msg-Id": f"arrive.{rollout}.{role}.{attempt or ''}.{at_ms}.{secrets.token_hex(8)}",
        "traceparent": traceparent(rollout),
    }
    return f"rollout.{rollout}.arrive.{role}", headers, msgpack.packb(body, use_bin_type=True)


async def offload_tasks(js, rollout, role, tasks, deadline=None):
    """Puts tasks too large for a message in the role's object store
    tasks_<role> (a msgpack TaskList, schema kv.tasklist) and returns the
    object's name and the SHA-256 of its bytes, or (None, None) when they
    fit in the arrival. planact runs the rollout on that list only: an
    object changed after the arrival is refused. A store not there yet
    (planact not up: its buckets are made as it starts) or a server that
    does not answer is tried again until deadline, as publish_until_up
    does; then NotUp says why."""
    data = msgpack.packb({"tasks": tasks}, use_bin_type=True)
    if len(data) <= INLINE_TASKS_LIMIT:
        return None, None
    sha = hashlib.sha256(data).hexdigest()
    # A list is written once, under a name of its own: a trainer may not
    # purge its store, which replacing an object would need.
    name = f"rollout-{rollout}-{role}-{sha[:16]}.tasks"

    async def put():
        store = await js.object_store(f"tasks_{role}")
        try:
            info = await store.get_info(name)
        except Exception:  # not there (nats-py raises its ObjectNotFoundError)
            info = None
        if info is None or getattr(info, "digest", None) != object_digest(data):
            await store.put(name, data)

    await until_up(f"the object store tasks_{role}", put, deadline)
    return name, sha


async def until_up(what, call, deadline=None):
    """call()'s answer, tried again with back-off while what it reaches is
    not there yet (planact's streams or buckets: planact not up) or does not
    answer, until deadline (time.monotonic(); None: READ_S from now). Then
    NotUp says what and why."""
    from nats.js import errors as js_errors  # nats-py's JetStream API errors

    not_up = (js_errors.NotFoundError, js_errors.ServiceUnavailableError, js_errors.NoStreamResponseError,
              nats.errors.NoRespondersError, nats.errors.TimeoutError)
    deadline = deadline if deadline is not None else time.monotonic() + READ_S
    wait = 0.05
    while True:
        try:
            return await call()
        except not_up as e:
            why = f"{what}: {type(e).__name__}" + (f" ({e})" if str(e) else "")
        left = deadline - time.monotonic()
        if left <= 0:
            raise NotUp(f"planact is not up: {why}, tried again until the deadline")
        await asyncio.sleep(min(wait, left))
        wait = min(2 * wait, 1.0)


def object_digest(data):
    """What an object store records of data: SHA-256= and the digest in
    padded URL-safe base64."""
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()


async def arrive(js, rollout, role, engine, weight_version, tasks=None, config=None, sampling=None, deadline=None):
    """Publish the arrival with JetStream, until a stream takes it
    (publish_until_up; deadline as there). Returns its Nats-Msg-Id, which a
    rejection of it carries as arrival_id."""
    deadline = deadline if deadline is not None else time.monotonic() + READ_S  # one bound for the tasks and the arrival
    tasks_object, tasks_sha256 = await offload_tasks(js, rollout, role, tasks, deadline) if tasks else (None, None)
    if tasks_object:
        tasks = None
    subject, headers, body = arrival_message(rollout, role, engine, weight_version, tasks, config,
                                             tasks_object=tasks_object, tasks_sha256=tasks_sha256, sampling=sampling)
    await publish_until_up(js, subject, body, headers, deadline)
    return headers["Nats-Msg-Id"]


async def publish_until_up(js, subject, body, headers, deadline=None):
    """Publishes with JetStream until a stream takes the message: one that
    no stream takes (planact not up yet) or whose acknowledgement is lost is
    sent again, with back-off, until deadline (time.monotonic(); None:
    READ_S from now), as the Go client does; its Nats-Msg-Id makes a copy
    that was taken a duplicate. Then NotUp says why."""
    from nats.js.errors import NoStreamResponseError  # what nats-py's js.publish raises for a 503

    deadline = deadline if deadline is not None else time.monotonic() + READ_S
    wait = 0.05
    while True:
        try:
            return await js.publish(subject, body, headers=headers)
        except (NoStreamResponseError, nats.errors.NoRespondersError) as e:
            why = f"no stream took {subject} ({type(e).__name__})"
        except nats.errors.TimeoutError as e:
            why = f"no acknowledgement of {subject} ({type(e).__name__})"
        left = deadline - time.monotonic()
        if left <= 0:
            raise NotUp(f"planact is not up: {why}, sent again until the deadline")
        await asyncio.sleep(min(wait, left))
        wait = min(2 * wait, 1.0)


NONCE = re.compile(r"[0-9a-f]{16}")


def arrival_ms(arrival_id):
    """The at_ms of an arrival id arrive.<N>.<role>.<attempt>.<at_ms>.<nonce>
    (or of the older form without a nonce); 0 for another id."""
    tokens = arrival_id.split(".")
    if len(tokens) >= 6 and NONCE.fullmatch(tokens[-1]):
        tokens = tokens[:-1]
    try:
        return int(tokens[-1]) if len(tokens) >= 5 else 0
    except ValueError:
        return 0


async def last_on(nc, subject, stream=ROLLOUT_STREAM):
    """The last message on subject in stream (a direct get, no consumer), or
    None."""
    try:
        msg = await nc.request(f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", timeout=5)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return None  # the server is away: read again later
    # The server's answer with a message names its stream (Nats-Stream); a
    # Status beside it is one of the message's own headers, which its
    # writer may set: a message all the same.
    if msg.headers and msg.headers.get("Status") and not msg.headers.get("Nats-Stream"):
        return None  # 404: nothing there yet
    return msg.data


async def wait_result(nc, js, rollout, role, arrival_id, timeout_s):
    """Wait for rollout.<N>.result.<role>, or the rejection of this arrival on
    rollout.<N>.result.<role>.rejected. Subscribes to both and reads the last
    message of each from the stream now and every few seconds, so a result
    published earlier, or while the connection was down, is found too."""
    subjects = [f"rollout.{rollout}.result.{role}", f"rollout.{rollout}.result.{role}.rejected"]
    arrived = asyncio.Queue()

    async def on_msg(msg):
        await arrived.put(msg.data)

    subs = [await nc.subscribe(s, cb=on_msg) for s in subjects]
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            for data in [await last_on(nc, s) for s in subjects]:
                result = await accept(nc, role, data, arrival_id, deadline=deadline)
                if result is not None:
                    return result
            while True:  # what the subscriptions bring, until the next read
                left = min(RECHECK_S, deadline - time.monotonic())
                if left <= 0:
                    break
                try:
                    data = await asyncio.wait_for(arrived.get(), timeout=left)
                except asyncio.TimeoutError:
                    break
                result = await accept(nc, role, data, arrival_id, deadline=deadline)
                if result is not None:
                    return result
            if time.monotonic() >= deadline:
                raise nats.errors.TimeoutError
    finally:
        for sub in subs:
            await sub.unsubscribe()


async def accept(nc, role, data, arrival_id, fetch=True, deadline=None):
    """The result in data, with its samples, or None when data is nothing,
    names no arrival, or is the rejection of another arrival (planact's
    answers name the arrival they answer by its Nats-Msg-Id, in
    arrival_id). With fetch=False, samples
    kept in the object store (samples_object) are left there: a trainer
    that took the groups as they came reads them only if it needs them.
    What the result says is there is read until deadline (time.monotonic();
    None: READ_S from now), as until_read says."""
    if data is None:
        return None
    result = msgpack.unpackb(data, raw=False)
    if result.get("schema") != "rollout.result/1":
        raise ValueError(f"unexpected result schema {result.get('schema')!r}")
    answers = result.get("arrival_id")
    if arrival_id and not answers:
        return None  # it names no arrival: not known to answer this one (as the Go client reads it)
    if result.get("rejected") and answers != arrival_id:
        return None
    finished = result.get("stats", {}).get("finished_ms", 0)
    if not result.get("rejected") and answers not in (None, "", arrival_id) and 0 < finished <= arrival_ms(arrival_id):
        # The result of a rollout that ended before this arrival (the id was
        # used before): the rejection that names this arrival follows.
        return None
    if fetch and result.get("samples_object"):  # too large to be inline: this role's object store
        result["samples"] = await fetch_samples(nc, role, result["samples_object"], deadline)
    result.setdefault("samples", [])  # absent means empty
    if fetch or not result.get("samples_object"):
        check_sample_count(result)
    if fetch and result.get("delivered_groups"):
        # result_samples undelivered: the delivered groups' samples are in
        # their own messages, not in the result.
        result["samples"] = await with_groups(nc, role, result, deadline)
    return result


async def with_groups(nc, role, result, deadline=None):
    """The result's samples with those of the groups it names delivered
    (delivered_groups), read from their messages, grouped as the result
    groups them: a group's samples are in its message or the result."""
    samples = list(result["samples"])
    read = 0
    for g in result["delivered_groups"]:
        group = await read_group(nc, role, result["rollout"], g, deadline)
        read += len(group["samples"])
        samples += group["samples"]
    check_group_samples(result, read)
    samples.sort(key=lambda s: s.get("group_index", 0))  # stable: each group in its order
    return samples


def check_sample_count(result):
    """Raises unless the result holds the samples it counts (sample_count):
    a status is a claim, and so is a count."""
    if len(result["samples"]) != result.get("sample_count", 0):
        raise ValueError(f"rollout {result.get('rollout', 0)}: its {result.get('role')} result holds {len(result['samples'])} samples "
                         f"and counts {result.get('sample_count', 0)} (sample_count)")


def check_group_count(group):
    """Raises Miscounted unless the group message holds the samples it
    counts (sample_count), its samples object read."""
    if len(group["samples"]) != group.get("sample_count", 0):
        raise Miscounted(f"group {group.get('group_index', 0)} of rollout {group.get('rollout', 0)} ({group.get('role')}) "
                         f"holds {len(group['samples'])} samples and counts {group.get('sample_count', 0)} (sample_count)")


def check_group_samples(result, read):
    """Raises unless the delivered groups read hold the samples the result
    counts in them (group_samples): a status is a claim, and a count that
    differs means samples lost or doubled on the way."""
    if read != result.get("group_samples", 0):
        raise ValueError(f"rollout {result['rollout']}: the {len(result['delivered_groups'])} groups its result names delivered "
                         f"hold {read} samples, the result counts {result.get('group_samples', 0)} (group_samples)")


async def read_group(nc, role, rollout, g, deadline=None):
    """Group g of the rollout, named delivered by its result, with its
    samples (read from the object store when it keeps them there)."""
    subject = f"rollout.{rollout}.result.{role}.group.{g}"
    data = await until_read(f"group {g} of rollout {rollout}, named delivered by its result ({subject})",
                            lambda: last_on(nc, subject), deadline)
    group = msgpack.unpackb(data, raw=False)
    if group.get("samples_object"):
        group["samples"] = await fetch_samples(nc, role, group["samples_object"], deadline)
    group.setdefault("samples", [])
    check_group_count(group)
    return group


READ_S = 60.0  # how long a read of what planact says is there (or a publish no stream takes) is tried, when the caller sets no deadline


async def until_read(what, read, deadline=None):
    """read()'s answer, for something a message planact published says is
    there: a read that finds nothing (a follower behind, an object's chunks
    not all there yet) or gets no answer (a server restarting, a leader
    moving) is tried again, with back-off, until deadline (time.monotonic();
    None: READ_S from now). Then Unreadable says what and why."""
    deadline = deadline if deadline is not None else time.monotonic() + READ_S
    wait = 0.1
    while True:
        try:
            data = await read()
            why = "nothing there"
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
            data, why = None, f"no answer ({type(e).__name__})"
        if data is not None:
            return data
        left = deadline - time.monotonic()
        if left <= 0:
            raise Unreadable(f"{what}: {why}, read again until the deadline")
        await asyncio.sleep(min(wait, left))
        wait = min(2 * wait, 2.0)


async def fetch_samples(nc, role, name, deadline=None):
    """The samples a result or group keeps in the role's object store
    results_<role> (a msgpack list of samples). The message that names the
    object says it is there: it is read until deadline (until_read)."""
    data = await until_read(f"samples results_{role}/{name}", lambda: read_object(nc, f"results_{role}", name), deadline)
    return msgpack.unpackb(data, raw=False)


async def msg_get(nc, stream, query):
    """One message of stream, read from its leader (the JetStream API's
    STREAM.MSG.GET): (sequence, data), or None when there is none."""
    msg = await nc.request(f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps(query).encode(), timeout=5)
    reply = json.loads(msg.data)
    if "error" in reply:
        if reply["error"].get("err_code") == NOT_FOUND:
            return None
        raise RuntimeError(f"{stream}: {reply['error'].get('description')} ({reply['error'].get('err_code')})")
    m = reply["message"]
    return m["seq"], base64.b64decode(m.get("data") or "")


async def read_object(nc, bucket, name):
    """Object name of object store bucket, read without a consumer (planact's
    accounts let no trainer create one): its metadata, then its chunks one
    by one, from the stream's leader, checked against its digest. None when
    there is no such object."""
    stream = f"OBJ_{bucket}"
    meta = await msg_get(nc, stream, {"last_by_subj": f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"})
    if meta is None:
        return None
    info = json.loads(meta[1])
    if info.get("deleted"):
        return None
    data, seq = b"", 0
    for _ in range(info.get("chunks", 0)):
        chunk = await msg_get(nc, stream, {"seq": seq + 1, "next_by_subj": f"$O.{bucket}.C.{info['nuid']}"})
        if chunk is None:
            raise nats.errors.TimeoutError  # not all there yet: read again
        seq, data = chunk[0], data + chunk[1]
    if len(data) != info.get("size", 0) or object_digest(data) != info.get("digest"):
        raise ValueError(f"object {bucket}/{name}: {len(data)} bytes do not match its metadata ({info.get('size')}, {info.get('digest')})")
    return data


async def rollout(nats_url, rollout_id, role, engine, weight_version, tasks=None, config=None, timeout_s=3600,
                  inbox=None):
    """Returns this role's samples, or None when the trainer should run its
    standard rollout instead (planact is not up, timed out or rejected the
    rollout).
    nats_url may name several servers, comma-separated. inbox is the
    connection's inbox prefix (inbox_prefix(user) for a user of planact's
    accounts)."""
    nc = await nats.connect(servers=server_list(nats_url), **({"inbox_prefix": inbox} if inbox else {}))
    try:
        check_server(nc, nats_url)
        js = nc.jetstream()
        deadline = time.monotonic() + timeout_s
        try:
            arrival_id = await arrive(js, rollout_id, role, engine, weight_version, tasks, config, deadline=deadline)
        except NotUp as e:
            print(f"rollout {rollout_id}: {e}; falling back")
            return None
        try:
            result = await wait_result(nc, js, rollout_id, role, arrival_id, max(0.0, deadline - time.monotonic()))
        except nats.errors.TimeoutError:
            return None  # planact never answered: fall back
        status = result.get("status")
        if status in ("timeout", "invalid", "failed"):
            print(f"rollout {rollout_id}: {status}: {result.get('reason', '')}; falling back")
            return None
        # "ok", or "partial"/"aborted" with the samples finished so far
        return result["samples"]
    finally:
        await nc.close()


def main():
    p = argparse.ArgumentParser()
    # In compose/, each role has its own user (trainer-planner, trainer-actor).
    p.add_argument("--nats", default="nats://127.0.0.1:4222",
                   help="servers, comma-separated; user:password@ in the URL authenticates")
    p.add_argument("--inbox-prefix", default=os.environ.get("NATS_INBOX_PREFIX", ""),
                   help="this user's inbox prefix, _INBOX_<user> with planact's accounts (default $NATS_INBOX_PREFIX)")
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
        tasks=tasks, config={"max_turns": 4} if tasks else None, timeout_s=a.timeout, inbox=a.inbox_prefix,
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
