package schema_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
)

var update = flag.Bool("update", false, "rewrite schemas/examples from the values of this test")

const (
	schemaDir  = "../../schemas"
	exampleDir = "../../schemas/examples"
	idBase     = "https://planact.dev/schemas/"
)

// wireCase is one message kind or KV value as Go builds it, and the schema
// file that describes its body.
type wireCase struct {
	file  string // schema file name, e.g. act.run.v1.schema.json
	value any    // a pointer to a realistic value
}

// example is the example file that goes with a schema file.
func (c wireCase) example() string { return strings.TrimSuffix(c.file, ".schema.json") + ".json" }

// schemaFile names the schema of a message kind: "act.run/1" -> act.run.v1.schema.json.
func schemaFile(kind string) string { return strings.Replace(kind, "/", ".v", 1) + ".schema.json" }

func msgCase(m schema.Message) wireCase { return wireCase{file: schemaFile(m.Kind()), value: m} }

func cases() []wireCase {
	engineP := schema.Engine{URL: "http://planner-router.internal:30000", Protocol: "sglang", Model: "Qwen2.5-72B-Instruct"}
	engineA := schema.Engine{URL: "http://actor-router.internal:30001", Protocol: "sglang", Model: "Qwen2.5-7B-Instruct"}
	tasks := []schema.Task{
		{GroupIndex: 0, Index: 0, Prompt: "Which river flows through the capital of the country where the Eiffel Tower is?", Label: "Seine", Metadata: map[string]any{"hops": 2, "source": "sim"}},
		{GroupIndex: 0, Index: 1, Prompt: "Which river flows through the capital of the country where the Eiffel Tower is?", Label: "Seine", Metadata: map[string]any{"hops": 2, "source": "sim"}},
	}
	cfg := schema.DefaultConfig()
	cfg.Tools = append(cfg.Tools, schema.Tool{Name: "wiki_search", Description: "retrieve passages", Kind: schema.ToolHTTP, URL: "http://retriever.internal:8000/retrieve"})
	node := plan.Node{ID: "s2", Tool: "search", Args: map[string]any{"query": "capital of France"}, Deps: []string{"s1"}, Description: "find the capital"}
	gen := &schema.Generation{
		Prompt: "Tool: search\nInput: capital of France\nResult:", PromptIDs: []int{151644, 882, 198, 7799, 25},
		Text: " Paris", OutputIDs: []int{12095, 151645}, LogProbs: []float64{-0.0312, -0.0004},
		FinishReason: "stop", WeightVersion: "actor-v3", LatencyMs: 41,
	}
	sample := schema.Sample{
		GroupIndex: 0, Index: 1, RolloutID: "42-0", Prompt: "Which river flows through the capital…?",
		Tokens: []int{151644, 882, 198, 27, 4439, 29, 1, 2, 151645}, Response: "<graph>…</graph><answer>Seine</answer>",
		ResponseLength: 3, LossMask: []int{1, 0, 1}, RolloutLogProbs: []float64{-0.21, 0, -0.05},
		Reward: 1, Status: schema.EpisodeCompleted, WeightVersions: []string{"planner-v7"}, Label: "Seine",
		Metadata: map[string]any{"episode": 0, "turns": 2},
	}
	expiry := schema.PauseExpiry{Epoch: 5, PauseID: "pause.actor.1767225100000", Mode: schema.PauseWait, SinceMs: 1767225100000,
		DeadlineMs: 1767225400000, AtMs: 1767225400800, Reason: "pause time-out (5m0s): no resume came (paused for: weight sync step 7)"}
	return []wireCase{
		msgCase(&schema.Arrive{Rollout: 42, Role: schema.RolePlanner, Engine: engineP, WeightVersion: "planner-v7", Tasks: tasks, Config: &cfg, AtMs: 1767225600000}),
		msgCase(&schema.Start{Rollout: 42, Episodes: 2, DeadlineMs: 1767229200000, AtMs: 1767225600123}),
		msgCase(&schema.Status{Rollout: 42, Event: "started", Episode: -1, Detail: "2 episodes", AtMs: 1767225600124}),
		msgCase(&schema.PlanRequest{Rollout: 42, Episode: 1, Turn: 2, Observation: "s1 (search capital of France): Paris", WeightVersion: "planner-v7"}),
		msgCase(&schema.PlanOutput{
			Rollout: 42, Episode: 1, Turn: 1, Text: "<graph><node id=\"s1\">search(\"capital of France\")</node></graph>",
			Prompt: "Answer the question…", FinishReason: "stop", WeightVersion: "planner-v7", LatencyMs: 812,
			Segments: []schema.Segment{
				{Kind: schema.SegPrompt, Turn: 1, Text: "Answer the question…", IDs: []int{151644, 882, 198}},
				{Kind: schema.SegGenerated, Turn: 1, Text: "<graph>…</graph>", Version: "planner-v7", IDs: []int{27, 4439, 29}, LogProbs: []float64{-0.21, -0.02, -0.05}},
			},
		}),
		msgCase(&schema.PlanDAG{Rollout: 42, Episode: 1, Turn: 1, FinishReason: "stop", Plan: plan.Plan{Format: plan.FormatGraph, Nodes: []plan.Node{
			{ID: "s1", Tool: "search", Args: map[string]any{"query": "country of the Eiffel Tower"}},
			node,
		}}}),
		msgCase(&schema.PlanPartial{Rollout: 42, Episode: 1, Turn: 1, Seq: 1, Text: "<graph><node id=\"s1\">search(\"capital of France\")</node>"}),
		msgCase(&schema.PlanAnswer{Rollout: 42, Episode: 1, Turn: 2, Answers: []string{"Seine"}, FinishReason: "stop"}),
		msgCase(&schema.PlanError{Rollout: 42, Episode: 1, Turn: 1, ErrorKind: string(plan.ErrCycle), Message: "the dependencies form a cycle: s1 -> s2 -> s1", FinishReason: "stop"}),
		msgCase(&schema.ActDone{
			Rollout: 42, Episode: 1, Turn: 1, Key: "t1-s2", NodeID: "s2", Tool: "search", Input: "capital of France",
			Status: schema.ActDoneOK, Output: "Paris", Attempts: 1, Generation: gen, StartedMs: 1767225601000, EndedMs: 1767225601041,
		}),
		msgCase(&schema.ActRetries{Rollout: 42, Episode: 1, Turn: 1, Key: "t1-s2", Gateway: "gw-1", Try: 2, After: 17,
			Retries: []schema.Retry{{By: "vm:1/0", From: "gw-2", Why: "no actor-gateway acknowledged the request for 3s", AtMs: 1767225601000}}}),
		msgCase(&schema.EpisodeEnd{Rollout: 42, Episode: 1, Turns: 2, Status: schema.EpisodeCompleted, Answers: []string{"Seine"}, Reason: "answer", Acts: []string{"t1-s1", "t1-s2"}, AtMs: 1767225603000}),
		msgCase(&schema.Result{
			Rollout: 42, Role: schema.RolePlanner, Status: schema.ResultOK, Samples: []schema.Sample{sample}, SampleCount: 1,
			Stats: schema.Stats{
				Episodes: 2, Ended: 2, Completed: 2, Correct: 1, Accuracy: 0.5, MeanReward: 0.75, MeanTurns: 2, Acts: 5, ActsPerEpisode: 2.5,
				EpisodeStatus: map[string]int{schema.EpisodeCompleted: 2}, WallMs: 3100, Tokens: map[string]int{"planner": 1840, "actor": 310},
				TaskStates: map[string]int{schema.TaskTrained: 2},
			},
			Tasks: []schema.TaskOutcome{{Episode: 0, GroupIndex: 0, Index: 0, State: schema.TaskTrained}, {Episode: 1, GroupIndex: 0, Index: 1, State: schema.TaskTrained}},
		}),
		msgCase(&schema.Group{
			Rollout: 42, Role: schema.RolePlanner, GroupIndex: 0, Samples: []schema.Sample{sample}, SampleCount: 1,
			Tasks:     []schema.TaskOutcome{{Episode: 0, GroupIndex: 0, Index: 0, State: schema.TaskTrained}, {Episode: 1, GroupIndex: 0, Index: 1, State: schema.TaskTrained}},
			Delivered: []int{0}, Groups: 1, AtMs: 1767225603100,
		}),
		msgCase(&schema.Timeout{Rollout: 42, TimeoutKind: schema.TimeoutBarrier, DeadlineMs: 1767227400000}),
		msgCase(&schema.Cancel{Rollout: 42, Role: schema.RolePlanner, Reason: "trainer preempted", AtMs: 1767225602000}),
		msgCase(&schema.ActorRequest{Rollout: 42, Episode: 1, Key: "t1-s2", Engine: engineA, Prompt: gen.Prompt, Sampling: schema.Sampling{Temperature: schema.Float(1), TopP: schema.Float(1), MaxNewTokens: 128}, Try: 1}),
		msgCase(&schema.ActorReply{Generation: *gen}),
		msgCase(&schema.Pause{Role: schema.RoleActor, Mode: schema.PauseAbort, TimeoutS: 300, Reason: "weight sync step 8", AtMs: 1767225700000}),
		msgCase(&schema.Resume{Role: schema.RoleActor, WeightVersion: "actor-v4", AtMs: 1767225730000}),
		msgCase(&schema.Paused{Role: schema.RoleActor, Epoch: 7, PauseID: "pause.actor.1767225700000", Mode: schema.PauseAbort,
			Drained: []string{"x9Lq2vOa1b"}, Aborted: 3, AtMs: 1767225700410}),
		msgCase(&schema.Resumed{Role: schema.RoleActor, ResumeID: "resume.actor.1767225730000", WeightVersion: "actor-v4", AtMs: 1767225730015}),
		msgCase(&schema.Refused{Role: schema.RoleActor, Verb: "pause", ID: "pause.actor.1767225710000",
			Reason: "pause of actor: timeout_s -5: want a number of seconds from 1 to 604800", AtMs: 1767225710012}),
		msgCase(&schema.Drained{Role: schema.RoleActor, Epoch: 7, Gateway: "x9Lq2vOa1b", Aborted: 3, AtMs: 1767225700400}),
		msgCase(&schema.Presence{Role: schema.RoleActor, Gateway: "x9Lq2vOa1b", AtMs: 1767225700100}),
		msgCase(&schema.PauseExpired{Role: schema.RoleActor, PauseExpiry: expiry}),
		msgCase(&schema.Rollback{Role: schema.RoleActor, From: "actor-v9", To: "actor-v3", ResumeID: "resume.actor.1767225690000", AtMs: 1767225690012}),
		{file: "kv.role.v1.schema.json", value: &schema.RoleState{Role: schema.RoleActor, Paused: true, Mode: schema.PauseAbort, Epoch: 7,
			PauseID: "pause.actor.1767225700000", SinceMs: 1767225700000, DeadlineMs: 1767226000000, Reason: "weight sync step 8",
			Expiry: &expiry, ExpiryAnnounced: true, Answered: 6, AnsweredPauses: []string{"pause.actor.1767225600000"}, WeightVersion: "actor-v3",
			Rollback: &schema.RoleRollback{From: "actor-v9", To: "actor-v3", ResumeID: "resume.actor.1767225690000", AtMs: 1767225690012}}},
		{file: "kv.session.v1.schema.json", value: &schema.Session{
			Rollout: 42, State: schema.SessionRunning,
			Roles: map[string]schema.RoleInfo{
				schema.RolePlanner: {Engine: engineP, WeightVersion: "planner-v7", ArrivedMs: 1767225600010, ArrivalID: "arrive.42.planner..1767225600000",
					Digest: "sha256:9f2c4e61b7a05d3e8c1f2a4b6d8e0f1a3c5e7a9b1d3f5a7c9e1b3d5f7a9c1e3b", ConfigDigest: "sha256:41d8cd98f00b204e9800998ecf8427e0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6",
					Tasks: schema.TasksDigest(tasks)},
				schema.RoleActor: {Engine: engineA, WeightVersion: "actor-v3", ArrivedMs: 1767225600100, Sampling: &schema.Sampling{Temperature: schema.Float(0.6), MaxNewTokens: 256}},
			},
			Config: cfg.WithDefaults(), ConfigFrom: schema.RolePlanner, Episodes: 2, Ended: []int{0},
			Trace: "4bf92f3577b34da6a3ce929d0e0e4736", CreatedMs: 1767225600010, StartedMs: 1767225600110,
			Outbox: []string{schema.EffectVersion(schema.RoleActor), schema.EffectGroup(3)}, Groups: []schema.GroupState{{Index: 1, State: schema.GroupDelivered, Scores: []schema.EpisodeScore{{Episode: 1, Reward: 0.5}}},
				{Index: 0, State: schema.GroupFiltered, Reason: "spread: all 2 rewards are 1"}},
			EndScores: []schema.EpisodeScore{{Episode: 0, Reward: 1, Correct: true}},
		}},
		{file: "kv.tasklist.v1.schema.json", value: &schema.TaskList{Tasks: tasks, From: schema.RolePlanner, Digest: schema.TasksDigest(tasks)}},
		{file: "kv.run.v1.schema.json", value: &schema.Run{Rollout: 42, Episode: 1, Turn: 1, Schedule: schema.ScheduleEager, Nodes: []*schema.NodeState{
			{Node: plan.Node{ID: "s1", Tool: "search", Args: map[string]any{"query": "country of the Eiffel Tower"}}, Key: "t1-s1", Status: schema.NodeDone, Input: "country of the Eiffel Tower", Output: "France"},
			{Node: node, Key: "t1-s2", Status: schema.NodeReleased, Input: "capital of France"},
		}, Complete: true}},
		{file: "kv.claim.v1.schema.json", value: &schema.Claim{Rollout: 42, Episode: 1, Turn: 2, Holder: "Yx3kQ2gB1vC9s8LmN0pR4t", Replica: "gpu-7:4242/0",
			SinceMs: 1767225602000, Retries: []schema.Retry{{By: "Yx3kQ2gB1vC9s8LmN0pR4t", From: "Hb7fW1cD5eF3gH9jK2lM6n", Why: "holder Hb7fW1cD5eF3gH9jK2lM6n did not answer for 3s: nats: no responders available for request", AtMs: 1767225602000}}}},
	}
}

// compile loads every schema file under its $id and compiles them all.
func compile(t *testing.T) map[string]*jsonschema.Schema {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(schemaDir, "*.schema.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no schema files in %s: %v", schemaDir, err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	for _, f := range files {
		doc := readJSON(t, f)
		base := filepath.Base(f)
		if id, _ := doc.(map[string]any)["$id"].(string); id != idBase+base {
			t.Fatalf("%s: $id is %q, want %q", base, id, idBase+base)
		}
		if err := c.AddResource(idBase+base, doc); err != nil {
			t.Fatalf("%s: %v", base, err)
		}
	}
	out := map[string]*jsonschema.Schema{}
	for _, f := range files {
		base := filepath.Base(f)
		s, err := c.Compile(idBase + base)
		if err != nil {
			t.Fatalf("compile %s: %v", base, err)
		}
		out[base] = s
	}
	return out
}

func readJSON(t *testing.T, path string) any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// wireJSON is what `planact decode` prints for v: msgpack through ToJSONable.
func wireJSON(t *testing.T, v any) []byte {
	t.Helper()
	body, err := schema.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	j, err := schema.ToJSONable(body)
	if err != nil {
		t.Fatalf("ToJSONable %T: %v", v, err)
	}
	out, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		t.Fatalf("json %T: %v", v, err)
	}
	return append(out, '\n')
}

func jsonValue(t *testing.T, data []byte) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestEncodedValuesValidate(t *testing.T) {
	schemas := compile(t)
	for _, c := range cases() {
		t.Run(c.file, func(t *testing.T) {
			s := schemas[c.file]
			if s == nil {
				t.Fatalf("no schema file %s", c.file)
			}
			if err := s.Validate(jsonValue(t, wireJSON(t, c.value))); err != nil {
				t.Fatalf("%T does not validate against %s:\n%v", c.value, c.file, err)
			}
		})
	}
}

// TestEveryFileHasACase keeps schemas/ and the Go types in step: every
// schema but the shared definitions describes a value built here, and
// every message schema pins its kind.
func TestEveryFileHasACase(t *testing.T) {
	schemas := compile(t)
	covered := map[string]bool{"defs.v1.schema.json": true}
	for _, c := range cases() {
		if covered[c.file] {
			t.Errorf("two cases for %s", c.file)
		}
		covered[c.file] = true
		doc := readJSON(t, filepath.Join(schemaDir, c.file)).(map[string]any)
		m, isMsg := c.value.(schema.Message)
		if !isMsg {
			continue
		}
		if got := doc["x-planact-kind"]; got != m.Kind() {
			t.Errorf("%s: x-planact-kind %v, want %s", c.file, got, m.Kind())
		}
		props := doc["properties"].(map[string]any)
		if got := props["schema"].(map[string]any)["const"]; got != m.Kind() {
			t.Errorf("%s: schema const %v, want %s", c.file, got, m.Kind())
		}
	}
	for f := range schemas {
		if !covered[f] {
			t.Errorf("schema %s has no Go value in this test", f)
		}
	}
}

func TestExamples(t *testing.T) {
	schemas := compile(t)
	seen := map[string]bool{}
	for _, c := range cases() {
		t.Run(c.example(), func(t *testing.T) {
			path := filepath.Join(exampleDir, c.example())
			seen[c.example()] = true
			want := wireJSON(t, c.value)
			if *update {
				if err := os.WriteFile(path, want, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./pkg/schema -run TestExamples -update)", err)
			}
			if err := schemas[c.file].Validate(jsonValue(t, got)); err != nil {
				t.Fatalf("%s does not validate:\n%v", c.example(), err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from what Go encodes (run go test ./pkg/schema -run TestExamples -update):\n%s", c.example(), want)
			}
		})
	}
	files, _ := filepath.Glob(filepath.Join(exampleDir, "*.json"))
	for _, f := range files {
		if !seen[filepath.Base(f)] {
			t.Errorf("example %s belongs to no schema", f)
		}
	}
}

// TestSchemasAreStrict drops each required field, and adds an unknown one,
// and expects every such body to be rejected: the schemas say something.
func TestSchemasAreStrict(t *testing.T) {
	schemas := compile(t)
	for _, c := range cases() {
		t.Run(c.file, func(t *testing.T) {
			s := schemas[c.file]
			doc := readJSON(t, filepath.Join(schemaDir, c.file)).(map[string]any)
			required, _ := doc["required"].([]any)
			if alts, ok := doc["oneOf"].([]any); ok && len(required) == 0 {
				// One of several alternatives: the case's own must hold.
				have := jsonValue(t, wireJSON(t, c.value)).(map[string]any)
				for _, alt := range alts {
					r, _ := alt.(map[string]any)["required"].([]any)
					if len(r) > 0 && have[r[0].(string)] != nil {
						required = append(required, r...)
					}
				}
			}
			if len(required) == 0 {
				t.Fatalf("%s requires nothing", c.file)
			}
			if doc["additionalProperties"] != false {
				t.Errorf("%s allows additional properties", c.file)
			}
			for _, r := range required {
				v := jsonValue(t, wireJSON(t, c.value)).(map[string]any)
				if _, ok := v[r.(string)]; !ok {
					t.Errorf("the case for %s has no required field %q: make it realistic", c.file, r)
					continue
				}
				delete(v, r.(string))
				if err := s.Validate(v); err == nil {
					t.Errorf("%s: a body without %q validates", c.file, r)
				}
			}
			v := jsonValue(t, wireJSON(t, c.value)).(map[string]any)
			v["unexpected_field"] = 1
			if err := s.Validate(v); err == nil {
				t.Errorf("%s: a body with an unknown field validates", c.file)
			}
		})
	}
}

// A nested type is strict too: a plan node without its tool is rejected.
func TestNestedRequired(t *testing.T) {
	s := compile(t)["plan.dag.v1.schema.json"]
	d := &schema.PlanDAG{Rollout: 1, Turn: 1, Plan: plan.Plan{Format: plan.FormatGraph, Nodes: []plan.Node{{ID: "T1", Tool: "search", Args: map[string]any{"query": "x"}}}}}
	v := jsonValue(t, wireJSON(t, d)).(map[string]any)
	if err := s.Validate(v); err != nil {
		t.Fatal(err)
	}
	delete(v["plan"].(map[string]any)["nodes"].([]any)[0].(map[string]any), "tool")
	if err := s.Validate(v); err == nil {
		t.Fatal("a plan.dag whose node has no tool validates")
	}
}

func TestRoundTrip(t *testing.T) {
	for _, c := range cases() {
		t.Run(c.file, func(t *testing.T) {
			body, err := schema.Marshal(c.value)
			if err != nil {
				t.Fatal(err)
			}
			got := reflect.New(reflect.TypeOf(c.value).Elem()).Interface()
			if err := schema.Unmarshal(body, got); err != nil {
				t.Fatalf("unmarshal %T: %v", got, err)
			}
			// Untyped maps (metadata, args) come back with msgpack's integer
			// widths; their JSON says whether the values are equal.
			if a, b := mustJSON(t, c.value), mustJSON(t, got); !bytes.Equal(a, b) {
				t.Errorf("round trip of %T:\n got %s\nwant %s", c.value, b, a)
			}
			if m, ok := got.(schema.Message); ok {
				if k, err := schema.KindOf(body); err != nil || k != m.Kind() {
					t.Errorf("KindOf = %q, %v; want %q", k, err, m.Kind())
				}
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestUnmarshalRejectsUnknownVersion(t *testing.T) {
	body, err := msgpack.Marshal(map[string]any{"schema": "act.done/2", "rollout": 1, "turn": 1, "key": "t1-T1"})
	if err != nil {
		t.Fatal(err)
	}
	var m schema.ActDone
	err = schema.Unmarshal(body, &m)
	if err == nil {
		t.Fatal("an act.done/2 body decodes into an act.done/1 reader")
	}
	if fail.KindOf(err) != fail.Invalid {
		t.Errorf("kind %v, want invalid (no retry): %v", fail.KindOf(err), err)
	}
	for _, want := range []string{"act.done/2", "act.done/1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

func TestUnmarshalRejectsMissingSchema(t *testing.T) {
	body, err := msgpack.Marshal(map[string]any{"rollout": 1, "turn": 1, "key": "t1-T1"})
	if err != nil {
		t.Fatal(err)
	}
	var m schema.ActDone
	err = schema.Unmarshal(body, &m)
	if err == nil {
		t.Fatal("a body without schema decodes")
	}
	if fail.KindOf(err) != fail.Invalid || !strings.Contains(err.Error(), "no schema") {
		t.Errorf("error %q (%v): want an invalid-input error saying the schema is missing", err, fail.KindOf(err))
	}
	if _, err := schema.KindOf(body); err == nil {
		t.Error("KindOf accepts a body without schema")
	}
}

func TestUnmarshalRejectsOtherKind(t *testing.T) {
	body, err := schema.Marshal(&schema.ActDone{Rollout: 1, Turn: 1, Key: "t1-T1", NodeID: "T1", Tool: "search", Status: schema.ActDoneOK})
	if err != nil {
		t.Fatal(err)
	}
	var m schema.PlanDAG
	if err := schema.Unmarshal(body, &m); err == nil || !strings.Contains(err.Error(), "act.done/1") {
		t.Errorf("act.done body into plan.dag reader: %v", err)
	}
}

// TestREADMEListsEverySchema keeps the subject table of schemas/README.md
// complete.
func TestREADMEListsEverySchema(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(schemaDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(schemaDir, "*.schema.json"))
	for _, f := range files {
		if !bytes.Contains(readme, []byte(filepath.Base(f))) {
			t.Errorf("schemas/README.md does not mention %s", filepath.Base(f))
		}
	}
	for _, h := range []string{schema.HdrSchema, schema.HdrRollout, schema.HdrEpisode, schema.HdrTurn, schema.HdrNode, schema.HdrRole, schema.HdrContentType, schema.HdrTraceparent, "Nats-Msg-Id"} {
		if !bytes.Contains(readme, []byte(h)) {
			t.Errorf("schemas/README.md does not mention header %s", h)
		}
	}
}

// TestSchemasKnowEveryField fills every field of every type with a
// non-zero value and checks that the schema names it: a field added to a
// Go type without its schema fails here (only additionalProperties errors
// count; the filler's values need not be meaningful).
func TestSchemasKnowEveryField(t *testing.T) {
	schemas := compile(t)
	for _, c := range cases() {
		t.Run(c.file, func(t *testing.T) {
			v := reflect.New(reflect.TypeOf(c.value).Elem())
			fill(v.Elem(), 0)
			err := schemas[c.file].Validate(jsonValue(t, wireJSON(t, v.Interface())))
			for _, e := range unknownFields(err) {
				t.Errorf("%s does not know %s", c.file, e)
			}
		})
	}
}

func unknownFields(err error) []string {
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return nil
	}
	var out []string
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if ap, ok := e.ErrorKind.(*kind.AdditionalProperties); ok {
			for _, p := range ap.Properties {
				out = append(out, "/"+strings.Join(e.InstanceLocation, "/")+"/"+p)
			}
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	return out
}

// fill sets every field reachable from v to a non-zero value.
func fill(v reflect.Value, depth int) {
	if depth > 6 {
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), depth+1)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0), depth+1)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k := reflect.New(v.Type().Key()).Elem()
		fill(k, depth+1)
		e := reflect.New(v.Type().Elem()).Elem()
		if e.Kind() == reflect.Interface {
			e.Set(reflect.ValueOf("x"))
		} else {
			fill(e, depth+1)
		}
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), depth+1)
			}
		}
	}
}

// TestSchemasBoundWhatGoBounds: the JSON Schemas a trainer in another
// language validates against agree with the Go bounds at their edges, on
// both sides (a time-out of 1e-300 s was valid by both), and with the
// integers Go reads (a float with no fraction is one; one with a fraction
// is not).
func TestSchemasBoundWhatGoBounds(t *testing.T) {
	schemas := compile(t)
	arrive := func(edit func(b, cfg map[string]any)) (schemaErr, goErr error) {
		b := map[string]any{"schema": "rollout.arrive/1", "rollout": 7, "role": "planner", "at_ms": 1767225600000,
			"engine": map[string]any{"url": "http://e"}, "config": map[string]any{}}
		edit(b, b["config"].(map[string]any))
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		schemaErr = schemas["rollout.arrive.v1.schema.json"].Validate(jsonValue(t, data))
		var a schema.Arrive
		if goErr = schema.UnmarshalTrainer(data, map[string][]string{"Content-Type": {"application/json"}}, &a); goErr == nil {
			goErr = a.Config.WithDefaults().Validate()
		}
		return schemaErr, goErr
	}
	for _, f := range []string{"act_timeout_s", "planner_timeout_s", "barrier_timeout_s", "rollout_timeout_s"} {
		for _, c := range []struct {
			v  any
			ok bool
		}{{schema.MinTimeoutS, true}, {1.5, true}, {0.999, false}, {1e-300, false}, {-1, false}} {
			se, ge := arrive(func(_, cfg map[string]any) { cfg[f] = c.v })
			if (se == nil) != c.ok || (ge == nil) != c.ok {
				t.Errorf("%s %v: schema says %v, Go says %v; want valid %v", f, c.v, se, ge, c.ok)
			}
		}
	}
	for _, c := range []struct {
		v  any
		ok bool
	}{{1.7e12, true}, {1767225600000.0, true}, {1712345678901.25, false}, {"1767225600000", false}} {
		se, ge := arrive(func(b, _ map[string]any) { b["at_ms"] = c.v })
		if (se == nil) != c.ok || (ge == nil) != c.ok {
			t.Errorf("at_ms %v: schema says %v, Go says %v; want valid %v", c.v, se, ge, c.ok)
		}
	}
	// A weight version is repeated in the role's answers and rollbacks on
	// CONTROL, which takes small messages: an arrival's and a resume's
	// are bounded alike.
	resume := schemas["control.resume.v1.schema.json"]
	for _, c := range []struct {
		n  int
		ok bool
	}{{1, true}, {schema.MaxWeightVersion, true}, {schema.MaxWeightVersion + 1, false}, {70 << 10, false}} {
		v := strings.Repeat("v", c.n)
		se, ge := arrive(func(b, _ map[string]any) { b["weight_version"] = v })
		if (se == nil) != c.ok || (ge == nil) != c.ok || !c.ok && !strings.Contains(ge.Error(), "weight_version") {
			t.Errorf("arrival's weight_version of %d bytes: schema says %v, Go says %v; want valid %v", c.n, se, ge, c.ok)
		}
		body := map[string]any{"schema": "control.resume/1", "role": "actor", "weight_version": v, "at_ms": 1}
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		se = resume.Validate(jsonValue(t, data))
		var r schema.Resume
		ge = schema.UnmarshalTrainer(data, map[string][]string{"Content-Type": {"application/json"}}, &r)
		if (se == nil) != c.ok || (ge == nil) != c.ok {
			t.Errorf("resume's weight_version of %d bytes: schema says %v, Go says %v; want valid %v", c.n, se, ge, c.ok)
		}
	}
	pause := schemas["control.pause.v1.schema.json"]
	for _, c := range []struct {
		v  float64
		ok bool
	}{{1, true}, {schema.MaxRolloutTimeoutS, true}, {0.5, false}, {1e-300, false}} {
		p := schema.Pause{Role: "actor", Mode: schema.PauseWait, TimeoutS: c.v, AtMs: 1}
		se := pause.Validate(jsonValue(t, wireJSON(t, &p)))
		ge := p.Validate()
		if (se == nil) != c.ok || (ge == nil) != c.ok {
			t.Errorf("pause timeout_s %v: schema says %v, Go says %v; want valid %v", c.v, se, ge, c.ok)
		}
	}
}

// TestNoFieldsIsNoValue: a msgpack nil or array decoded into a struct
// (a session, a role's state, a run) was taken for the zero value, or
// for its fields in order: what holds no map of fields is an error.
func TestNoFieldsIsNoValue(t *testing.T) {
	for _, data := range [][]byte{{0xc0}, {0x90}, {0x92, 0x01, 0x02}} {
		var st schema.RoleState
		if err := schema.Unmarshal(data, &st); err == nil || !strings.Contains(err.Error(), "want a map of fields") {
			t.Errorf("% x into a RoleState: %v (%+v); want an error", data, err, st)
		}
	}
	var ids []int
	if err := schema.Unmarshal([]byte{0x92, 0x01, 0x02}, &ids); err != nil || len(ids) != 2 {
		t.Errorf("an array into a slice: %v, %v", ids, err)
	}
}
