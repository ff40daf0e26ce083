package schema_test

import (
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

// TestUnmarshalStrictNamesUnknownFields: what a trainer writes with a
// misspelt field is refused, the field named with its path; it used to run
// with the default in its place (temperature 1 for "temprature", no label
// and reward 0 for "lable").
func TestUnmarshalStrictNamesUnknownFields(t *testing.T) {
	arrival := func(edit func(m map[string]any)) []byte {
		m := map[string]any{
			"schema": "rollout.arrive/1", "rollout": 7, "role": "planner", "at_ms": 1,
			"engine": map[string]any{"url": "http://e", "protocol": "sglang"},
			"tasks":  []any{map[string]any{"prompt": "q", "label": "a", "metadata": map[string]any{"anything": map[string]any{"goes": 1}}}},
			"config": map[string]any{"max_turns": 3, "planner_sampling": map[string]any{"temperature": 0.5},
				"tools": []any{map[string]any{"name": "search"}}},
		}
		edit(m)
		data, err := msgpack.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	cases := []struct {
		name string
		edit func(m map[string]any)
		want string // "" = accepted
	}{
		{"as written", func(map[string]any) {}, ""},
		{"top level", func(m map[string]any) { m["weight_verison"] = "v1" }, `"weight_verison"`},
		{"config", func(m map[string]any) { m["config"].(map[string]any)["max_turn"] = 2 }, `"config.max_turn"`},
		{"config schedule", func(m map[string]any) { m["config"].(map[string]any)["shedule"] = "levels" }, `"config.shedule"`},
		{"sampling", func(m map[string]any) {
			m["config"].(map[string]any)["planner_sampling"].(map[string]any)["temprature"] = 0.0
		}, `"config.planner_sampling.temprature"`},
		{"task", func(m map[string]any) { m["tasks"].([]any)[0].(map[string]any)["lable"] = "x" }, `"tasks[0].lable"`},
		{"tool", func(m map[string]any) {
			m["config"].(map[string]any)["tools"].([]any)[0].(map[string]any)["kidn"] = "http"
		}, `"config.tools[0].kidn"`},
		{"engine", func(m map[string]any) { m["engine"].(map[string]any)["proto"] = "openai" }, `"engine.proto"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var a schema.Arrive
			err := schema.UnmarshalStrict(arrival(c.edit), &a)
			switch {
			case c.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("error %v, want one naming %s", err, c.want)
			}
		})
	}
	// Cancels and task lists are strict too.
	data, _ := msgpack.Marshal(map[string]any{"schema": "rollout.cancel/1", "rollout": 7, "role": "actor", "reson": "x", "at_ms": 1})
	if err := schema.UnmarshalStrict(data, &schema.Cancel{}); err == nil || !strings.Contains(err.Error(), `"reson"`) {
		t.Errorf("cancel with reson: %v", err)
	}
	data, _ = msgpack.Marshal(map[string]any{"tasks": []any{map[string]any{"prompt": "q", "lable": "a"}}})
	if err := schema.UnmarshalValueStrict(data, &schema.TaskList{}, "task list"); err == nil || !strings.Contains(err.Error(), `"tasks[0].lable"`) {
		t.Errorf("task list with lable: %v", err)
	}
}

// TestTrainerMessagesNameTheCulprit: a value of the wrong type in what a
// trainer writes used to be refused as "msgpack: invalid code=cb decoding
// int64", naming nothing, and a uint64 beyond int64 ran as -1. Every such
// value is named by its path, with what it is and what is wanted; a float
// with no fraction is the integer it is (as JSON Schema's "integer" says).
func TestTrainerMessagesNameTheCulprit(t *testing.T) {
	base := func() map[string]any {
		return map[string]any{
			"schema": "rollout.arrive/1", "rollout": 7, "role": "planner", "at_ms": 1767225600000,
			"engine": map[string]any{"url": "http://e"},
			"tasks": []any{map[string]any{"prompt": "q", "label": "a"},
				map[string]any{"prompt": "r", "index": 1, "metadata": map[string]any{"id": 3.5, "tags": []any{"x", 1, nil}}}},
			"config": map[string]any{"max_turns": 3, "tools": []any{map[string]any{"name": "search"}}},
		}
	}
	cfg := func(k string, v any) func(map[string]any) {
		return func(m map[string]any) { m["config"].(map[string]any)[k] = v }
	}
	cases := []struct {
		name  string
		edit  func(m map[string]any)
		want  string               // "" = accepted
		check func(*schema.Arrive) // of an accepted arrival
	}{
		{"as written", func(map[string]any) {}, "", nil},
		{"max_turns 2.5", cfg("max_turns", 2.5), `config.max_turns is the float 2.5: want an integer`, nil},
		{"max_turns \"4\"", cfg("max_turns", "4"), `config.max_turns is the string "4": want an integer`, nil},
		{"max_turns true", cfg("max_turns", true), `config.max_turns is the boolean true: want an integer`, nil},
		{"max_turns NaN", cfg("max_turns", math.NaN()), `config.max_turns is the float NaN: want an integer`, nil},
		{"max_turns 2^64-1", cfg("max_turns", uint64(math.MaxUint64)),
			`config.max_turns is the integer 18446744073709551615: want an integer from -9223372036854775808 to 9223372036854775807`, nil},
		{"max_turns 4.0", cfg("max_turns", 4.0), "", func(a *schema.Arrive) {
			if a.Config.MaxTurns != 4 {
				t.Errorf("max_turns 4.0 read as %d", a.Config.MaxTurns)
			}
		}},
		{"at_ms 1.7e12 from Python", func(m map[string]any) { m["at_ms"] = 1.7e12 }, "", func(a *schema.Arrive) {
			if a.AtMs != 1_700_000_000_000 {
				t.Errorf("at_ms 1.7e12 read as %d", a.AtMs)
			}
		}},
		{"at_ms time.time()*1000", func(m map[string]any) { m["at_ms"] = 1712345678901.25 },
			`at_ms is the float 1.71234567890125e+12: want an integer (a float is taken only when it has no fraction`, nil},
		{"at_ms 1e19", func(m map[string]any) { m["at_ms"] = 1e19 }, `at_ms is the float 1e+19: want an integer from`, nil},
		{"at_ms as a float32", func(m map[string]any) { m["at_ms"] = float32(0.5) }, `at_ms is the float 0.5`, nil},
		{"rollout \"7\"", func(m map[string]any) { m["rollout"] = "7" }, `rollout is the string "7": want an integer`, nil},
		{"role 1", func(m map[string]any) { m["role"] = 1 }, `role is the integer 1: want a string`, nil},
		{"prompt 5", func(m map[string]any) { m["tasks"].([]any)[1].(map[string]any)["prompt"] = 5 }, `tasks[1].prompt is the integer 5: want a string`, nil},
		{"group_index 2.5", func(m map[string]any) { m["tasks"].([]any)[0].(map[string]any)["group_index"] = 2.5 }, `tasks[0].group_index is the float 2.5`, nil},
		{"tasks a string", func(m map[string]any) { m["tasks"] = "q" }, `tasks is the string "q": want an array`, nil},
		{"a task a string", func(m map[string]any) { m["tasks"] = []any{"q"} }, `tasks[0] is the string "q": want a map of fields`, nil},
		{"config an array", func(m map[string]any) { m["config"] = []any{4} }, `config is an array of 1: want a map of fields`, nil},
		{"config keyed by numbers", func(m map[string]any) { m["config"] = map[int]any{1: 2} }, `config is a map: want a map whose keys are field names`, nil},
		{"engine url 3", func(m map[string]any) { m["engine"] = map[string]any{"url": 3} }, `engine.url is the integer 3: want a string`, nil},
		{"temperature \"hot\"", cfg("planner_sampling", map[string]any{"temperature": "hot"}), `config.planner_sampling.temperature is the string "hot": want a number`, nil},
		{"seed 0.5", cfg("actor_sampling", map[string]any{"seed": 0.5}), `config.actor_sampling.seed is the float 0.5`, nil},
		{"stop a string", cfg("actor_sampling", map[string]any{"stop": "\n"}), `config.actor_sampling.stop is the string "\n": want an array`, nil},
		{"stop[1] 7", cfg("actor_sampling", map[string]any{"stop": []any{"a", 7}}), `config.actor_sampling.stop[1] is the integer 7: want a string`, nil},
		{"stream_plans \"yes\"", cfg("stream_plans", "yes"), `config.stream_plans is the string "yes": want true or false`, nil},
		{"tool name 3", cfg("tools", []any{map[string]any{"name": 3}}), `config.tools[0].name is the integer 3: want a string`, nil},
		{"barrier_timeout_s as an integer", cfg("barrier_timeout_s", 60), "", func(a *schema.Arrive) {
			if a.Config.BarrierTimeoutS != 60 {
				t.Errorf("barrier_timeout_s 60 read as %g", a.Config.BarrierTimeoutS)
			}
		}},
		{"barrier_timeout_s beyond int64", cfg("barrier_timeout_s", uint64(math.MaxUint64)), "", nil}, // a number; Validate bounds it
		{"metadata holds anything", func(m map[string]any) {
			m["tasks"].([]any)[0].(map[string]any)["metadata"] = map[string]any{"a": []any{1.5, "x", map[string]any{"b": nil}}}
		}, "", func(a *schema.Arrive) {
			if len(a.Tasks[0].Metadata["a"].([]any)) != 3 {
				t.Errorf("metadata %v", a.Tasks[0].Metadata)
			}
		}},
		{"a long string is cut", func(m map[string]any) { m["rollout"] = strings.Repeat("seven ", 100) }, `rollout is the string "seven seven seven seven seven seven seve"… (600 bytes): want an integer`, nil},
		{"unknown field beside a wrong type", func(m map[string]any) { cfg("max_turn", 2)(m); cfg("max_turns", "2")(m) }, `"config.max_turn"`, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := base()
			c.edit(m)
			data, err := msgpack.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			var a schema.Arrive
			err = schema.UnmarshalStrict(data, &a)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want == "" && c.check != nil:
				c.check(&a)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("error %v\nwant one saying %s", err, c.want)
			case c.want != "" && fail.KindOf(err) != fail.Invalid:
				t.Errorf("kind %v, want invalid: %v", fail.KindOf(err), err)
			}
		})
	}
}

// TestEveryTrainerMessageNamesTheCulprit: cancels, pauses, resumes and task
// lists are read by the same rules as arrivals.
func TestEveryTrainerMessageNamesTheCulprit(t *testing.T) {
	cases := []struct {
		body map[string]any
		into any
		want string
	}{
		{map[string]any{"schema": "rollout.cancel/1", "rollout": 7, "role": "actor", "at_ms": 1.5}, &schema.Cancel{}, `at_ms is the float 1.5`},
		{map[string]any{"schema": "rollout.cancel/1", "rollout": uint64(1 << 63), "role": "actor"}, &schema.Cancel{}, `rollout is the integer 9223372036854775808: want an integer from`},
		{map[string]any{"schema": "rollout.cancel/1", "rollout": 7, "role": "actor", "reason": []any{"x"}}, &schema.Cancel{}, `reason is an array of 1: want a string`},
		{map[string]any{"schema": "control.pause/1", "role": "actor", "timeout_s": "60"}, &schema.Pause{}, `timeout_s is the string "60": want a number`},
		{map[string]any{"schema": "control.pause/1", "role": "actor", "mode": false}, &schema.Pause{}, `mode is the boolean false: want a string`},
		{map[string]any{"schema": "control.resume/1", "role": "actor", "weight_version": 7}, &schema.Resume{}, `weight_version is the integer 7: want a string`},
		{map[string]any{"schema": "control.resume/1", "role": "actor", "at_ms": "now"}, &schema.Resume{}, `at_ms is the string "now": want an integer`},
		{map[string]any{"tasks": []any{map[string]any{"prompt": "q", "index": "1"}}}, &schema.TaskList{}, `tasks[0].index is the string "1": want an integer`},
	}
	for _, c := range cases {
		data, err := msgpack.Marshal(c.body)
		if err != nil {
			t.Fatal(err)
		}
		if m, ok := c.into.(schema.Message); ok {
			err = schema.UnmarshalStrict(data, m)
		} else {
			err = schema.UnmarshalValueStrict(data, c.into, "task list")
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v into %T: %v\nwant an error saying %s", c.body, c.into, err, c.want)
		}
	}
}

// TestDecodingErrorsNameTheField: planact's own readers name the field too
// when a body cannot be read (a token id that is not one), and a JSON body
// sent as msgpack is told what planact reads.
func TestDecodingErrorsNameTheField(t *testing.T) {
	data, _ := msgpack.Marshal(map[string]any{"schema": "plan.out/1", "rollout": 7, "segments": []any{
		map[string]any{"kind": "prompt", "ids": []any{1, 2}}, map[string]any{"kind": "generated", "ids": []any{3, "x"}}}})
	err := schema.Unmarshal(data, &schema.PlanOutput{})
	if want := `decode plan.out/1: segments[1].ids[1] is the string "x": want an integer`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("plan.out with a string token id: %v\nwant %s", err, want)
	}
	data, _ = msgpack.Marshal(map[string]any{"schema": "plan.out/1", "segments": []any{map[string]any{"ids": []any{1.0}}}})
	if err := schema.Unmarshal(data, &schema.PlanOutput{}); err == nil || !strings.Contains(err.Error(), `segments[0].ids[0] is the float 1: want an integer`) {
		t.Errorf("plan.out with a float token id: %v", err)
	}
	if err := schema.UnmarshalStrict(nil, &schema.Cancel{}); err == nil || !strings.Contains(err.Error(), "decode rollout.cancel/1: the body is empty") {
		t.Errorf("an empty body: %v", err)
	}
	json := []byte(` {"schema": "rollout.cancel/1", "rollout": 7, "role": "actor"}`)
	for _, err := range []error{schema.Unmarshal(json, &schema.Cancel{}), schema.UnmarshalStrict(json, &schema.Cancel{})} {
		if err == nil || !strings.Contains(err.Error(), "the body is JSON, and planact reads msgpack") ||
			!strings.Contains(err.Error(), "Content-Type: application/json") {
			t.Errorf("a JSON body read as msgpack: %v", err)
		}
	}
}

// TestLengthsAreBackedBeforeTheyAreAllocated: the library allocated what a
// header claimed before reading one element, so an arrival of a few bytes
// claiming 2^32 tasks (or metadata values) took the session-store down
// with it. Such a body is refused, allocating nothing of the sort.
func TestLengthsAreBackedBeforeTheyAreAllocated(t *testing.T) {
	head := func(fields int) []byte {
		b := []byte{0x80 | byte(fields)}
		b = append(b, 0xa6)
		b = append(b, "schema"...)
		b = append(b, 0xb0)
		b = append(b, "rollout.arrive/1"...)
		return b
	}
	tasks := append(head(2), 0xa5)
	tasks = append(tasks, "tasks"...)
	tasks = append(tasks, 0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0)
	metadata := append(head(2), 0xa5)
	metadata = append(metadata, "tasks"...)
	metadata = append(metadata, 0x91, 0x81, 0xa8)
	metadata = append(metadata, "metadata"...)
	metadata = append(metadata, 0x81, 0xa1, 'x', 0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0)
	unknown := append(head(2), 0xa1, 'z', 0xdf, 0xff, 0xff, 0xff, 0xff, 0xc0)
	deep := append(head(2), 0xa5)
	deep = append(deep, "tasks"...)
	for range 10000 {
		deep = append(deep, 0x91)
	}
	deep = append(deep, 0xc0)
	for name, body := range map[string][]byte{"tasks": tasks, "metadata": metadata, "unknown field": unknown, "nested": deep} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := schema.UnmarshalStrict(body, &schema.Arrive{})
		loose := schema.Unmarshal(body, &schema.Arrive{}) // a watcher's reading
		runtime.ReadMemStats(&after)
		if err == nil || (loose == nil && name != "unknown field") {
			t.Errorf("%s: accepted (%v, %v)", name, err, loose)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
			t.Errorf("%s: %d bytes allocated to refuse %d bytes (%v)", name, grew, len(body), err)
		}
		if _, err := schema.ToJSONable(body); err == nil && name != "unknown field" {
			t.Errorf("%s: planact decode reads it", name)
		}
	}
}
