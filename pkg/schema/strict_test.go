package schema_test

import (
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

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
