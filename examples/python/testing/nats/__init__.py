"""An in-memory stand-in for nats-py, for the Go tests of the Python
examples (nats-py cannot be installed where they run); see ../README.md.

Streams are lists of messages, filled by JetStream publishes and by
store() (what a test puts there as planact would). A direct get
($JS.API.DIRECT.GET.<stream>.<subject>, wildcards included) answers with
the last matching message, or a 404 as the server does; a stream it does
not know has no responders. A test plays a follower behind, or a server
away, with behind and away: a subject's next direct gets answer 404, or
time out, that many times; and planact's streams not up yet with
no_stream: a subject's next JetStream publishes raise nats-py's
NoStreamResponseError (no stream took them), that many times; and
planact's buckets not made yet with no_bucket: a bucket's next
js.object_store() calls raise nats-py's BucketNotFoundError, that many
times. An object
store's stream answers the leader's reads
($JS.API.STREAM.MSG.GET.OBJ_<bucket>) of an object's metadata and of its
one chunk. Subscriptions get what is stored after they were made. Every
JetStream publish is kept in `published`, and each function in
`on_publish` is called with it (a test answers a pause that way)."""

import asyncio
import base64
import hashlib
import json
import os
from types import SimpleNamespace

from . import errors
from .js import errors as js_errors

STREAMS = {"ROLLOUT": "rollout.", "CONTROL": "control."}  # name -> subject prefix

streams = {name: [] for name in STREAMS}  # name -> [(subject, data)]
objects = {}  # bucket -> {name: bytes}
published = []  # SimpleNamespace(subject, data, headers), in order
on_publish = []  # fn(msg), called after each JetStream publish
connections = []  # the options of each connect()
# The version the server gives (nats-py's connected_server_version); a test
# sets STANDIN_NATS_SERVER_VERSION to play an older server.
server_version = os.environ.get("STANDIN_NATS_SERVER_VERSION", "2.15.2")
_subscriptions = []
behind = {}  # subject -> how many more direct gets of it answer 404 (a follower behind)
away = {}  # subject -> how many more direct gets of it time out (a server away)
asked = {}  # subject -> direct gets of it so far
no_stream = {}  # subject -> how many more JetStream publishes to it find no stream (planact not up)
no_bucket = {}  # bucket -> how many more js.object_store() calls of it find no bucket (planact not up)


def matches(pattern, subject):
    """NATS subject matching: * is one token, > the rest."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


def store(subject, data):
    """Appends a message to the stream that takes subject, and hands it to
    the subscriptions that match."""
    name = next(n for n, prefix in STREAMS.items() if subject.startswith(prefix))
    streams[name].append((subject, data))
    for sub in list(_subscriptions):
        if matches(sub.subject, subject):
            asyncio.get_running_loop().create_task(sub.cb(SimpleNamespace(subject=subject, data=data, headers=None)))


async def connect(servers=None, **options):
    connections.append({"servers": servers, **options})
    return Client()


class Subscription:
    def __init__(self, subject, cb):
        self.subject, self.cb = subject, cb

    async def unsubscribe(self):
        _subscriptions.remove(self)


class ServerVersion:
    """nats-py's: major, minor and patch of the version the server gave."""

    def __init__(self, version):
        tokens = [int(t) for t in version.split("-")[0].split(".")]
        self.major, self.minor, self.patch = (tokens + [0, 0, 0])[:3]


class Client:
    @property
    def connected_server_version(self):
        return ServerVersion(server_version)

    async def subscribe(self, subject, cb=None):
        sub = Subscription(subject, cb)
        _subscriptions.append(sub)
        return sub

    async def request(self, subject, payload=b"", timeout=None):
        if subject.startswith("$JS.API.STREAM.MSG.GET.OBJ_"):
            return object_msg(subject[len("$JS.API.STREAM.MSG.GET.OBJ_"):], json.loads(payload))
        prefix = "$JS.API.DIRECT.GET."
        if not subject.startswith(prefix):
            raise errors.NoRespondersError
        stream, _, wanted = subject[len(prefix):].partition(".")
        if stream not in streams:
            raise errors.NoRespondersError
        asked[wanted] = asked.get(wanted, 0) + 1
        if away.get(wanted, 0) > 0:
            away[wanted] -= 1
            raise errors.TimeoutError
        if behind.get(wanted, 0) > 0:
            behind[wanted] -= 1
            return SimpleNamespace(subject=subject, data=b"", headers={"Status": "404", "Description": "Message Not Found"})
        for subj, data in reversed(streams[stream]):
            if matches(wanted, subj):
                return SimpleNamespace(subject=subj, data=data, headers={"Nats-Subject": subj})
        return SimpleNamespace(subject=subject, data=b"", headers={"Status": "404", "Description": "Message Not Found"})

    def jetstream(self):
        return JetStream()

    async def close(self):
        pass


class JetStream:
    async def publish(self, subject, payload=b"", headers=None):
        if no_stream.get(subject, 0) > 0:
            no_stream[subject] -= 1
            raise js_errors.NoStreamResponseError
        msg = SimpleNamespace(subject=subject, data=payload, headers=dict(headers or {}))
        published.append(msg)
        store(subject, payload)
        for fn in on_publish:
            fn(msg)
        return SimpleNamespace(stream=next(n for n, p in STREAMS.items() if subject.startswith(p)), seq=len(published))

    async def object_store(self, bucket):
        if no_bucket.get(bucket, 0) > 0:
            no_bucket[bucket] -= 1
            raise js_errors.BucketNotFoundError
        return ObjectStore(objects.setdefault(bucket, {}))


def digest(data):
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()


def object_msg(bucket, query):
    """The JetStream API's answer to a read of bucket's stream: an object's
    metadata (last_by_subj $O.<bucket>.M.<name>), or its one chunk
    (next_by_subj $O.<bucket>.C.<nuid>, seq 1), or not found."""
    objs = objects.get(bucket, {})
    found = None
    meta, chunk = f"$O.{bucket}.M.", f"$O.{bucket}.C."
    if query.get("last_by_subj", "").startswith(meta):
        name = base64.urlsafe_b64decode(query["last_by_subj"][len(meta):]).decode()
        if name in objs:
            info = {"name": name, "bucket": bucket, "nuid": query["last_by_subj"][len(meta):], "size": len(objs[name]),
                    "chunks": 1, "digest": digest(objs[name])}
            found = {"subject": query["last_by_subj"], "seq": 2, "data": base64.b64encode(json.dumps(info).encode()).decode()}
    elif query.get("next_by_subj", "").startswith(chunk) and query.get("seq", 1) <= 1:
        name = base64.urlsafe_b64decode(query["next_by_subj"][len(chunk):]).decode()
        if name in objs:
            found = {"subject": query["next_by_subj"], "seq": 1, "data": base64.b64encode(objs[name]).decode()}
    if found is None:
        reply = {"error": {"code": 404, "err_code": 10037, "description": "no message found"}}
    else:
        reply = {"message": found}
    return SimpleNamespace(subject="", data=json.dumps(reply).encode(), headers=None)


class ObjectStore:
    def __init__(self, objs):
        self.objs = objs

    async def put(self, name, data):
        self.objs[name] = bytes(data)

    async def get_info(self, name):
        if name not in self.objs:
            raise errors.ObjectNotFoundError(name)
        return SimpleNamespace(name=name, size=len(self.objs[name]), digest=digest(self.objs[name]))

    async def get(self, name):
        if name not in self.objs:
            raise errors.ObjectNotFoundError(name)
        return SimpleNamespace(data=self.objs[name])
