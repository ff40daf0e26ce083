#!/usr/bin/env python3
"""For each fault of a chaos run, the JetStream elections that the surviving
nats-server nodes logged between the kill and the next rollout completed.

usage: elections.py WORKDIR REPORT.json   (WORKDIR: the run's --keep directory)
"""
import datetime as dt
import glob
import json
import re
import sys

work, rep = sys.argv[1], sys.argv[2]
r = json.load(open(rep))
r = r[0] if isinstance(r, list) else r
pat = re.compile(r"(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+) \[INF\] JetStream cluster new (stream|consumer) leader for .\$G > ([^']+)")
lines = []
for f in glob.glob(work + "/nats-*.log"):
    for l in open(f, errors="replace"):
        m = pat.search(l)
        if m:
            lines.append((dt.datetime.strptime(m.group(1), "%Y/%m/%d %H:%M:%S.%f"), m.group(2), m.group(3)))
lines.sort()
for f in r["faults"]:
    at = dt.datetime.fromisoformat(f["at"].replace("Z", "+00:00")).replace(tzinfo=None)
    nxt = f["recovery"].get("next_completion_ns", 0) / 1e9
    done = at + dt.timedelta(seconds=nxt)
    el = [x for x in lines if at < x[0] <= done]
    last = el[-1] if el else None
    after = (done - last[0]).total_seconds() if last else nxt
    print(f"{f['kind']} of {f['target']} ({f.get('note', '')}) at {at.time()}: next rollout completed after {nxt:.2f}s; "
          f"{len(el)} elections before it, the last at +{(last[0] - at).total_seconds() if last else 0:.2f}s; planact after it: {after:.2f}s")
    for t, kind, name in el:
        print(f"    +{(t - at).total_seconds():5.2f}s  new {kind} leader  {name}")
