package e2e

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestPythonArrivalIDsDiffer: trainer.py's arrival ids end in a random
// nonce, as the Go and Node clients' do: two arrivals stamped in the same
// millisecond are two messages (with one id, JetStream kept the first and
// dropped the second as a duplicate), while a publish sent again because
// no stream took it keeps its id. arrival_ms reads the at_ms of both forms.
func TestPythonArrivalIDsDiffer(t *testing.T) {
	t.Parallel()
	out, err := slimeRun(t, `
import asyncio
import trainer

engine = {"url": "http://router:30000", "protocol": "sglang"}
ids = [trainer.arrival_message(7, "planner", engine, "v1", at_ms=1767225600000)[1]["Nats-Msg-Id"] for _ in range(2)]
tried = []
publish = nats.JetStream.publish
async def recording(self, subject, payload=b"", headers=None):
    tried.append(headers["Nats-Msg-Id"])
    return await publish(self, subject, payload, headers)
nats.JetStream.publish = recording
nats.no_stream["rollout.7.arrive.planner"] = 2
sent = asyncio.run(trainer.arrive(nats.JetStream(), 7, "planner", engine, "v1", deadline=None))
print(json.dumps({"ids": ids, "ms": [trainer.arrival_ms(i) for i in ids], "tried": tried, "sent": sent,
                  "old form": trainer.arrival_ms("arrive.7.planner..1767225600000"), "other": trainer.arrival_ms("seq:12")}))
`, nil, slimeFeed{})
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		IDs   []string `json:"ids"`
		Ms    []int64  `json:"ms"`
		Tried []string `json:"tried"`
		Sent  string   `json:"sent"`
		Old   int64    `json:"old form"`
		Other int64    `json:"other"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	form := regexp.MustCompile(`^arrive\.7\.planner\.\.1767225600000\.[0-9a-f]{16}$`)
	for _, id := range r.IDs {
		if !form.MatchString(id) {
			t.Errorf("arrival id %q: want arrive.7.planner..1767225600000.<16 hex digits>", id)
		}
	}
	if len(r.IDs) != 2 || r.IDs[0] == r.IDs[1] {
		t.Errorf("two arrivals in one millisecond have ids %q: want two ids", r.IDs)
	}
	for i, ms := range r.Ms {
		if ms != 1767225600000 {
			t.Errorf("arrival_ms(%q) = %d, want its at_ms 1767225600000", r.IDs[i], ms)
		}
	}
	if r.Old != 1767225600000 || r.Other != 0 {
		t.Errorf("arrival_ms of the form without a nonce %d, of seq:12 %d: want 1767225600000 and 0", r.Old, r.Other)
	}
	sent := regexp.MustCompile(`^arrive\.7\.planner\.\.[0-9]+\.[0-9a-f]{16}$`)
	if len(r.Tried) != 3 || r.Tried[0] != r.Sent || r.Tried[1] != r.Sent || r.Tried[2] != r.Sent || !sent.MatchString(r.Sent) {
		t.Errorf("an arrival sent 3 times (twice no stream took it) went with ids %q and returned %q: want one id throughout", r.Tried, r.Sent)
	}
}

// TestPythonTasksObjectOncePlanactIsUp: an arrival whose tasks go to the
// object store tasks_<role> finds no bucket while planact is not up
// (nats-py's BucketNotFoundError): it tries again until the deadline, as
// the publish of the arrival does, and then says planact is not up:
// trainer.NotUp, and in the slime module PlanactError("unreachable").
func TestPythonTasksObjectOncePlanactIsUp(t *testing.T) {
	t.Parallel()
	prompt := strings.Repeat("a long question ", 4000) // 64 KB: three groups of two are more than a message takes
	out, err := slimeRun(t, `
import asyncio, os, time
import trainer

report = {}
def attempt(name, call):
    try:
        report[name] = call()
    except Exception as e:
        report[name] = f"{type(e).__name__}: {e}"

engine = {"url": sys.argv[1], "protocol": "sglang"}
tasks = [{"group_index": 0, "index": i, "prompt": sys.argv[2]} for i in range(6)]
nats.no_bucket["tasks_planner"] = 3  # planact makes its buckets after three tries
attempt("up", lambda: asyncio.run(trainer.arrive(nats.JetStream(), 7, "planner", engine, "v1", tasks=tasks,
                                                 deadline=time.monotonic() + 30)).startswith("arrive.7.planner."))
report["stored"] = sorted(nats.objects.get("tasks_planner", {}))
nats.no_bucket["tasks_planner"] = 10**9  # planact never comes up
attempt("down", lambda: asyncio.run(trainer.arrive(nats.JetStream(), 8, "planner", engine, "v1", tasks=tasks,
                                                   deadline=time.monotonic() + 0.3)))
os.environ["PLANACT_TIMEOUT_S"] = "0.3"
attempt("module, down", lambda: slime_planact.generate_rollout(rollout_args(sys.argv[1], batch=3), 9,
                                                               DataSource(prompt_groups(3, prompt=sys.argv[2]))))
report["published"] = [m.subject for m in nats.published]
print(json.dumps(report))
`, map[string]string{"PLANACT_ROLE": "planner"}, slimeFeed{}, engineServer(t, "4"), prompt)
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]any
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	if r["up"] != true {
		t.Errorf("arrival once the bucket is there: %v, want it sent", r["up"])
	}
	if stored, _ := r["stored"].([]any); len(stored) != 1 || !strings.HasPrefix(stored[0].(string), "rollout-7-planner-") {
		t.Errorf("tasks_planner holds %v: want the rollout's task list", r["stored"])
	}
	for name, want := range map[string]string{
		"down":         "NotUp: planact is not up: the object store tasks_planner: BucketNotFoundError, tried again until the deadline",
		"module, down": "PlanactError: planact: unreachable: rollout 9 (planner): planact is not up: the object store tasks_planner: BucketNotFoundError",
	} {
		if got, _ := r[name].(string); !strings.HasPrefix(got, want) {
			t.Errorf("%s: %q, want %q…", name, got, want)
		}
	}
	if got := jsonOf(t, r["published"]); got != `["rollout.7.arrive.planner"]` {
		t.Errorf("published %s: want only the arrival whose tasks were stored", got)
	}
}

// TestPythonPassesOverAnswersNamingNoArrival: a result or rejection on the
// role's subjects that names no arrival (no arrival_id) is not known to
// answer this one, and both Python readers pass over it as the Go client
// does: the slime module waits on (here until PLANACT_TIMEOUT_S), and
// trainer.rollout falls back. The answer that names the arrival is taken.
func TestPythonPassesOverAnswersNamingNoArrival(t *testing.T) {
	t.Parallel()
	const n = 9
	samples := plannerSamples(n)[1:2]
	result := &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK, Samples: samples, SampleCount: len(samples),
		Tasks: trained(10)}
	rejection := &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultInvalid, Reason: "no arrival of this", Rejected: true}
	var unnamed, named slimeFeed
	unnamed.store(t, subject.Result(n, schema.RolePlanner), result)
	unnamed.store(t, subject.Rejected(n, schema.RolePlanner), rejection)
	named.answer(t, subject.Result(n, schema.RolePlanner), result)
	script := `
import asyncio, contextlib, io
import trainer

report = {}
try:
    out = slime_planact.generate_rollout(rollout_args(sys.argv[1], batch=1), 9, DataSource(prompt_groups(1)))
    report["module"] = [[s.index for s in g] for g in out.samples]
except slime_planact.PlanactError as e:
    report["module"] = f"PlanactError: {e}"
with contextlib.redirect_stdout(io.StringIO()):
    got = asyncio.run(trainer.rollout("nats://planact:4222", 9, "planner", {"url": sys.argv[1], "protocol": "sglang"}, "4", timeout_s=0.3))
report["trainer"] = None if got is None else [s["index"] for s in got]
print(json.dumps(report))
`
	engine := engineServer(t, "4")
	env := map[string]string{"PLANACT_ROLE": "planner", "PLANACT_ENGINE_URL": engine, "PLANACT_TIMEOUT_S": "0.3"}
	for _, c := range []struct {
		name            string
		feed            slimeFeed
		module, trainer string
	}{
		{"naming no arrival", unnamed, `"PlanactError: planact: timeout: no planner result for rollout 9 within PLANACT_TIMEOUT_S=0.3s: ` +
			`is planact up, and did the other job arrive?"`, "null"},
		{"naming the arrival", named, "[[20]]", "[20]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := slimeRun(t, script, env, c.feed, engine)
			if err != nil {
				t.Fatal(err)
			}
			var r map[string]any
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("python printed %q: %v", out, err)
			}
			if got := jsonOf(t, r["module"]); got != c.module {
				t.Errorf("slime module: %s, want %s", got, c.module)
			}
			if got := jsonOf(t, r["trainer"]); got != c.trainer {
				t.Errorf("trainer.rollout: %s, want %s", got, c.trainer)
			}
		})
	}
}
