package replay_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/replay"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/internal/stacktest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
)

var update = flag.Bool("update", false, "record the rollouts of testdata/replay again, from the simulated world")

// testdata holds the recorded rollouts every `make test` replays.
const testdata = "../../testdata/replay"

// recorded are the rollouts of testdata/replay: what the simulated world
// plays for them (engines, tasks, config).
var recorded = []struct {
	file           string
	planner, actor sim.Config
	tasks          []schema.Task
	cfg            *schema.Config
}{
	// Graph plans, several turns, a wrong lookup now and then.
	{"graph.jsonl", sim.Config{Seed: 3, PlannerStepwise: 0.5}, sim.Config{Seed: 4, ActorErrorRate: 0.3},
		stacktest.Tasks(2, 2, 5), &schema.Config{MaxTurns: 4}},
	// Task-list plans streamed while the planner writes, a failure policy
	// of skip.
	{"tasklist-streamed.jsonl", sim.Config{Seed: 5}, sim.Config{Seed: 6},
		stacktest.Tasks(2, 2, 9), &schema.Config{PlanFormat: "tasklist", StreamPlans: true, FailurePolicy: schema.PolicySkip}},
	// JSON plans and an actor that drifts from an episode's third act:
	// quarantined episodes.
	{"json-drift.jsonl", sim.Config{Seed: 7}, sim.Config{Seed: 8, DriftFrom: 3},
		stacktest.Tasks(3, 2, 13), &schema.Config{PlanFormat: "json"}},
}

// record plays rollout n on a fresh planact with the simulated world and
// returns its recording.
func record(t *testing.T, n int64, planner, actor sim.Config, tasks []schema.Task, cfg *schema.Config) *replay.Recording {
	t.Helper()
	env := stacktest.Start(t, planner, actor)
	env.Begin(t, n, tasks, cfg)
	env.Wait(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := bustest.Conn(t, env.URL)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Result(ctx, n, schema.RoleActor); err != nil {
		t.Fatal(err)
	}
	rec, err := replay.Record(ctx, nc, n)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func run(t *testing.T, rec *replay.Recording, episodes []int) *replay.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := replay.Run(ctx, rec, replay.Options{Episodes: episodes, Log: bustest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func clean(t *testing.T, what string, r *replay.Report) {
	t.Helper()
	for _, d := range r.Differences {
		t.Errorf("%s: %s", what, d)
	}
	for _, n := range r.Notes {
		t.Errorf("%s: note: %s", what, n)
	}
}

// TestReplayRecordedRollouts replays the recorded rollouts of
// testdata/replay through today's planact: a change to the parser, the
// dispatcher, the gateways or how samples are assembled that changes what
// any of them did (a DAG, an observation, a trajectory, an act, a sample
// bit for bit, a reward, a status) fails here, naming it. With -update the
// rollouts are recorded again from the simulated world first.
func TestReplayRecordedRollouts(t *testing.T) {
	for i, c := range recorded {
		path := filepath.Join(testdata, c.file)
		if *update {
			rec := record(t, int64(100+i), c.planner, c.actor, c.tasks, c.cfg)
			if err := os.MkdirAll(testdata, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := rec.SaveFile(path); err != nil {
				t.Fatal(err)
			}
		}
		t.Run(c.file, func(t *testing.T) {
			rec, err := replay.LoadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			r := run(t, rec, nil)
			clean(t, c.file, r)
			if len(r.Episodes) != len(rec.Tasks) {
				t.Errorf("replayed episodes %v of %d", r.Episodes, len(rec.Tasks))
			}
		})
	}
}

// TestRecordSaveLoad: a recording read from the streams is the same once
// saved and loaded.
func TestRecordSaveLoad(t *testing.T) {
	rec := record(t, 7, sim.Config{Seed: 1}, sim.Config{Seed: 2}, stacktest.Tasks(2, 1, 3), nil)
	var b bytes.Buffer
	if err := rec.Save(&b); err != nil {
		t.Fatal(err)
	}
	back, err := replay.Load(&b)
	if err != nil {
		t.Fatal(err)
	}
	if ds := replay.Compare(rec, back, true); len(ds) > 0 {
		t.Errorf("saved and loaded, the recording differs: %v", ds)
	}
	if len(back.Episodes) != 2 || len(back.Results) != 2 || len(back.Tasks) != 2 || back.TasksFrom != schema.RolePlanner {
		t.Errorf("loaded %d episodes, %d results, %d tasks from %q", len(back.Episodes), len(back.Results), len(back.Tasks), back.TasksFrom)
	}
	for _, bad := range []struct{ text, want string }{
		{"", "empty"},
		{`{"format":"planact.replay/9"}`, `format "planact.replay/9"`},
		{`{"format":"planact.replay/1","rollout":1,"arrivals":{},"tasks_from":"","tasks":[]}` + "\n" + `{"kind":"turn"}`, `line 2: kind "turn"`},
		{`{"format":"planact.replay/1","rollout":1,"arrival":{}}`, `line 1 (the header): json: unknown field "arrival"`},
	} {
		if _, err := replay.Load(strings.NewReader(bad.text)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Load(%.60q): %v, want %q", bad.text, err, bad.want)
		}
	}
}

// TestReplayOneEpisode: one episode replays alone, as itself.
func TestReplayOneEpisode(t *testing.T) {
	rec, err := replay.LoadFile(filepath.Join(testdata, "graph.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, rec, []int{3})
	clean(t, "episode 3", r)
	if len(r.Episodes) != 1 || r.Episodes[0] != 3 {
		t.Errorf("replayed %v, want [3]", r.Episodes)
	}
	if _, err := replay.Run(context.Background(), rec, replay.Options{Episodes: []int{9}}); err == nil || !strings.Contains(err.Error(), "has no episode 9") {
		t.Errorf("episode 9 of 4: %v", err)
	}
}

// TestReplayFindsDifferences: a recording that says something today's
// planact does not do is caught, naming where: a DAG the parser would not
// make of the recorded output (as after a change to the parser), an
// observation the dispatcher would not write, a sample not bit for bit
// the same, a reward, an act's outcome, an episode's status.
func TestReplayFindsDifferences(t *testing.T) {
	rec, err := replay.LoadFile(filepath.Join(testdata, "graph.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	ep := rec.Episode(1)
	var dagTurn, obsTurn int
	for i := range ep.Turns {
		turn := &ep.Turns[i]
		if turn.DAG != nil && dagTurn == 0 {
			dagTurn = turn.Turn
			turn.DAG.Nodes[0].Args = map[string]any{"query": "something else"}
		}
		if turn.Observation != "" && obsTurn == 0 {
			obsTurn = turn.Turn
			turn.Observation += " (recorded otherwise)"
		}
	}
	if dagTurn == 0 || obsTurn == 0 {
		t.Fatalf("episode 1 has no DAG or no observation to change: %+v", ep.Turns)
	}
	planner := rec.Results[schema.RolePlanner]
	planner.Samples[0].Tokens = strings.Replace(planner.Samples[0].Tokens, "sha256:", "sha256:0", 1)
	planner.Samples[1].Reward += 1e-15
	// What the replay's engine answers is the recorded act's generation,
	// not its outcome: an outcome recorded otherwise is the act's alone.
	ep.Acts[0].Output += " (recorded otherwise)"
	ep.End.Reason = "recorded otherwise"
	r := run(t, rec, nil)
	want := []string{
		"episode 1 turn " + strconv.Itoa(dagTurn) + " dag",
		"episode 1 turn " + strconv.Itoa(obsTurn) + " observation",
		"planner sample " + planner.Samples[0].RolloutID + " tokens",
		"planner sample " + planner.Samples[1].RolloutID + " reward",
		"episode 1 act " + ep.Acts[0].Key + " output",
		"episode 1 reason",
	}
	found := map[string]bool{}
	for _, d := range r.Differences {
		found[d.Where] = true
		t.Logf("%s", d)
	}
	for _, w := range want {
		if !found[w] {
			t.Errorf("no difference at %q", w)
		}
	}
	if len(r.Differences) != len(want) {
		t.Errorf("%d differences, want the %d made", len(r.Differences), len(want))
	}
}

// TestRecordReadsObjects: a rollout whose results' samples are in the
// object stores (results_<role>) is recorded whole, read without a
// consumer as the least-privilege layout allows, and replays with no
// difference. One whose task list came as an object (tasks_planner, named
// by the arrival's tasks_sha256) cannot be recorded once it ended (planact
// removes the list then), and Record says so instead of recording it
// without its tasks.
func TestRecordReadsObjects(t *testing.T) {
	env := stacktest.StartWith(t, sim.Config{Seed: 3, PlannerStepwise: 0.5}, sim.Config{Seed: 4, ActorErrorRate: 0.3}, stack.Options{InlineLimit: 512})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nc := bustest.Conn(t, env.URL)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	tasks := stacktest.Tasks(2, 2, 5)
	rollout := func(n int64) map[string]*schema.Result {
		t.Helper()
		pa := &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: env.Planner, WeightVersion: stacktest.PlannerVersion, Tasks: tasks, Config: &schema.Config{MaxTurns: 3}}
		aa := &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: env.Actor, WeightVersion: stacktest.ActorVersion}
		for _, a := range []*schema.Arrive{pa, aa} {
			if err := c.Arrive(ctx, a); err != nil {
				t.Fatalf("arrive %s: %v", a.Role, err)
			}
		}
		results := map[string]*schema.Result{}
		for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
			res, err := c.Result(ctx, n, role)
			if err != nil {
				t.Fatal(err)
			}
			if res.SamplesObject == "" || len(res.Samples) == 0 {
				t.Fatalf("the %s's result: samples object %q, %d samples: the case shows nothing", role, res.SamplesObject, len(res.Samples))
			}
			results[role] = res
		}
		return results
	}

	const n = 9
	results := rollout(n)
	rec, err := replay.Record(ctx, nc, n)
	if err != nil {
		t.Fatal(err)
	}
	if rec.TasksFrom != schema.RolePlanner || len(rec.Tasks) != len(tasks) {
		t.Fatalf("recorded %d tasks from %q, want %d from the planner", len(rec.Tasks), rec.TasksFrom, len(tasks))
	}
	for role, res := range results {
		if got := len(rec.Results[role].Samples); got != len(res.Samples) {
			t.Errorf("the %s's result recorded with %d samples, it holds %d", role, got, len(res.Samples))
		}
	}
	clean(t, "replay", run(t, rec, nil))

	// The same tasks as an object.
	const m = 10
	c.InlineTasksLimit = 1
	rollout(m)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	str, err := js.Stream(ctx, bus.StreamTrainer(schema.RolePlanner))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := str.GetLastMsgForSubject(ctx, subject.Arrive(m, schema.RolePlanner))
	if err != nil {
		t.Fatal(err)
	}
	var sent schema.Arrive
	if err := schema.UnmarshalTrainer(msg.Data, msg.Header, &sent); err != nil || sent.TasksObject == "" || sent.TasksSHA256 == "" || len(sent.Tasks) > 0 {
		t.Fatalf("the planner's arrival (%v): tasks object %q, sha256 %q, %d inline: the case shows nothing", err, sent.TasksObject, sent.TasksSHA256, len(sent.Tasks))
	}
	// planact removes the list once it published the results: a Record
	// that comes first still finds it.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, err = replay.Record(ctx, nc, m); err != nil || time.Now().After(deadline) {
			break
		}
	}
	if want := "rollout 10: task object tasks_planner/" + sent.TasksObject + " is gone"; err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "removes when the rollout ends") {
		t.Errorf("recording a rollout whose task list was an object: %v, want %q and why", err, want)
	}
}

// TestReplayEvaluation: an evaluation (metrics, every episode's outcome,
// stats per dataset, no samples) is recorded from the streams and replays
// the same.
func TestReplayEvaluation(t *testing.T) {
	const n = 11
	tasks := stacktest.Tasks(4, 1, 7)
	for i := range tasks {
		tasks[i].Dataset = []string{"gsm", "hotpot"}[i%2]
	}
	rec := record(t, n, sim.Config{Seed: 3, PlannerStepwise: 0.5}, sim.Config{Seed: 4, ActorErrorRate: 0.3}, tasks, &schema.Config{MaxTurns: 3, Evaluation: true})
	res := rec.Results[schema.RolePlanner]
	if !res.Evaluation || len(res.Episodes) != len(tasks) || len(res.Samples) > 0 || len(res.Stats.Datasets) != 2 {
		t.Fatalf("recorded planner result: evaluation %v, %d episode outcomes, %d samples, datasets %v: want an evaluation of %d episodes in 2 datasets",
			res.Evaluation, len(res.Episodes), len(res.Samples), res.Stats.Datasets, len(tasks))
	}
	clean(t, "evaluation", run(t, rec, nil))
}
