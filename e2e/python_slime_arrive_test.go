package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestPythonArrivesOncePlanactIsUp: a publish no stream takes (planact's
// streams not up yet: nats-py's NoStreamResponseError) is sent again,
// with back-off, until the wait's deadline, as the Go client does
// (untilUp) and docs/python_trainer.md tells a trainer to: the slime
// module's arrival, its pause, and trainer.py's arrival. Past the
// deadline the slime module raises PlanactError("unreachable") saying
// planact is not up, and trainer.rollout falls back (None).
func TestPythonArrivesOncePlanactIsUp(t *testing.T) {
	t.Parallel()
	const n = 9
	samples := plannerSamples(n)[1:2]
	var feed slimeFeed
	feed.answer(t, subject.Result(n, schema.RolePlanner), &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK,
		Samples: samples, SampleCount: len(samples), Tasks: trained(10)})
	engine := engineServer(t, "4")
	out, err := slimeRun(t, `
import asyncio, contextlib, io, os
import trainer

report = {}
def attempt(name, call):
    try:
        report[name] = call()
    except Exception as e:
        report[name] = f"{type(e).__name__}: {e}"

arrive = "rollout.9.arrive.planner"
# planact comes up after three publishes found no stream
nats.no_stream[arrive] = 3
attempt("module", lambda: [[s.index for s in g] for g in
                           slime_planact.generate_rollout(rollout_args(sys.argv[1], batch=1), 9, DataSource(prompt_groups(1))).samples])
report["module published"] = [m.subject for m in nats.published]
nats.no_stream[arrive] = 3
attempt("trainer", lambda: [s["index"] for s in asyncio.run(trainer.rollout("nats://planact:4222", 9, "planner",
                                                                            {"url": sys.argv[1], "protocol": "sglang"}, "4", timeout_s=30))])
# planact never comes up: the deadline ends the wait
nats.no_stream[arrive] = 10**9
os.environ["PLANACT_TIMEOUT_S"] = "0.3"
attempt("module, planact down", lambda: slime_planact.generate_rollout(rollout_args(sys.argv[1], batch=1), 9, DataSource(prompt_groups(1))))
said = io.StringIO()
with contextlib.redirect_stdout(said):
    attempt("trainer, planact down", lambda: asyncio.run(trainer.rollout("nats://planact:4222", 9, "planner",
                                                                         {"url": sys.argv[1], "protocol": "sglang"}, "4", timeout_s=0.3)))
report["trainer said"] = said.getvalue()
nats.no_stream["control.planner.pause"] = 10**9
attempt("pause, planact down", lambda: slime_planact.pause("planner", wait_s=0.3))
print(json.dumps(report))
`, map[string]string{"PLANACT_ROLE": "planner", "PLANACT_ENGINE_URL": engine}, feed, engine)
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]any
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	if got := jsonOf(t, r["module"]); got != "[[20]]" {
		t.Errorf("slime module, planact up after three publishes: %s, want its sample [[20]]", got)
	}
	if got := jsonOf(t, r["module published"]); got != `["rollout.9.arrive.planner"]` {
		t.Errorf("slime module published %s: want the one arrival a stream took", got)
	}
	if got := jsonOf(t, r["trainer"]); got != "[20]" {
		t.Errorf("trainer.rollout, planact up after three publishes: %s, want its sample [20]", got)
	}
	for name, want := range map[string]string{
		"module, planact down": "PlanactError: planact: unreachable: rollout 9 (planner): planact is not up: no stream took rollout.9.arrive.planner",
		"pause, planact down":  "PlanactError: planact: unreachable: pause pause.planner.",
	} {
		if got, _ := r[name].(string); !strings.HasPrefix(got, want) {
			t.Errorf("%s: %q, want %q…", name, got, want)
		}
	}
	if said, _ := r["trainer said"].(string); r["trainer, planact down"] != nil ||
		!strings.HasPrefix(said, "rollout 9: planact is not up: no stream took rollout.9.arrive.planner") {
		t.Errorf("trainer.rollout, planact down: %v, printing %q: want None (fall back), saying planact is not up", r["trainer, planact down"], said)
	}
}

// TestPythonSlimeSamplingNotAnObject: a role's sampling in PLANACT_CONFIG
// or PLANACT_EVAL_CONFIG that is not an object is an error naming the
// variable and the field. An evaluation sends neither variable's sampling
// in its config (each job sends its own model's in its arrival), so
// planact never sees such a value to refuse it: it was left out without a
// word, and the evaluation ran with other sampling than the user asked for.
func TestPythonSlimeSamplingNotAnObject(t *testing.T) {
	t.Parallel()
	out, err := slimeRun(t, `
report = {}
for name, value in [("PLANACT_EVAL_CONFIG", '{"planner_sampling": "greedy"}'), ("PLANACT_EVAL_CONFIG", '{"actor_sampling": 0.5}'),
                    ("PLANACT_CONFIG", '{"actor_sampling": [1]}'), ("PLANACT_CONFIG", '{"planner_sampling": null}')]:
    try:
        slime_planact.settings_from_env({"PLANACT_ROLE": "planner", name: value})
        report[f"{name}={value}"] = "taken"
    except ValueError as e:
        report[f"{name}={value}"] = str(e)
print(json.dumps(report))
`, nil, slimeFeed{})
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]string
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	if got := r[`PLANACT_CONFIG={"planner_sampling": null}`]; got != "taken" {
		t.Errorf("planner_sampling null (not set): %q, want taken", got)
	}
	for env, want := range map[string]string{
		`PLANACT_EVAL_CONFIG={"planner_sampling": "greedy"}`: "PLANACT_EVAL_CONFIG planner_sampling='greedy' is not valid",
		`PLANACT_EVAL_CONFIG={"actor_sampling": 0.5}`:        "PLANACT_EVAL_CONFIG actor_sampling=0.5 is not valid",
		`PLANACT_CONFIG={"actor_sampling": [1]}`:             "PLANACT_CONFIG actor_sampling=[1] is not valid",
	} {
		if got := r[env]; !strings.HasPrefix(got, want) {
			t.Errorf("%s: %q, want %q…", env, got, want)
		}
	}
}

// TestPythonNATSServerList: several servers (a cluster), comma-separated
// as planact's own NATS_URL takes them, are each a server of the
// connection (nats-py takes a list, and would read the whole text as one
// URL: no fail-over, or no connection at all), in the slime module
// (PLANACT_NATS_URL) and in trainer.py; an empty one is an error naming
// the variable.
func TestPythonNATSServerList(t *testing.T) {
	t.Parallel()
	out, err := slimeRun(t, `
import asyncio, contextlib, io
import trainer

report = {"module": slime_planact.connect_options({"PLANACT_NATS_URL": "nats://nats-1:4222, nats://nats-2:4222"})["servers"]}
try:
    slime_planact.connect_options({"PLANACT_NATS_URL": "nats://nats-1:4222,,nats://nats-2:4222"})
    report["empty"] = "taken"
except ValueError as e:
    report["empty"] = str(e)
with contextlib.redirect_stdout(io.StringIO()):
    asyncio.run(trainer.rollout("nats://nats-1:4222,nats://nats-2:4222", 5, "actor", {"url": "http://router:30001"}, "0", timeout_s=0.01))
report["trainer"] = nats.connections[-1]["servers"]
print(json.dumps(report))
`, nil, slimeFeed{})
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]any
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	for _, who := range []string{"module", "trainer"} {
		if got := jsonOf(t, r[who]); got != `["nats://nats-1:4222","nats://nats-2:4222"]` {
			t.Errorf("%s connects to servers %s, want each of the two", who, got)
		}
	}
	if got, _ := r["empty"].(string); !strings.HasPrefix(got, "PLANACT_NATS_URL 'nats://nats-1:4222,,nats://nats-2:4222': want one or more URLs") {
		t.Errorf("an empty server in PLANACT_NATS_URL: %q, want an error naming the variable", got)
	}
}
