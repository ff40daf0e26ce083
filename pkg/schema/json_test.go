package schema_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

// TestTrainerMessagesInJSON: a trainer may write its messages in JSON when
// their Content-Type says so (`nats pub … -H 'Content-Type:
// application/json'` from the command line); they used to be refused as
// "msgpack: unexpected code=7b decoding map length". A JSON body meets the
// rules a msgpack body meets, and is blamed as it was written.
func TestTrainerMessagesInJSON(t *testing.T) {
	jsonCT := map[string][]string{"Content-Type": {"application/json"}}
	arrival := `{"schema": "rollout.arrive/1", "rollout": 7, "role": "planner", "at_ms": 1.7e12,
		"engine": {"url": "http://e", "protocol": "sglang"},
		"tasks": [{"prompt": "q", "label": "a", "metadata": {"n": 3, "f": 2.5, "xs": [1, "x", null], "big": 18446744073709551615}}],
		"config": {"max_turns": 4.0, "barrier_timeout_s": 60, "planner_sampling": {"temperature": 0, "seed": 42}}}`
	var got schema.Arrive
	if err := schema.UnmarshalTrainer([]byte(arrival), jsonCT, &got); err != nil {
		t.Fatal(err)
	}
	want := schema.Arrive{Envelope: schema.Envelope{Schema: "rollout.arrive/1"}, Rollout: 7, Role: "planner", AtMs: 1_700_000_000_000,
		Engine: schema.Engine{URL: "http://e", Protocol: "sglang"},
		Tasks:  []schema.Task{{Prompt: "q", Label: "a", Metadata: map[string]any{"n": int8(3), "f": 2.5, "xs": []any{int8(1), "x", nil}, "big": uint64(18446744073709551615)}}},
		Config: &schema.Config{MaxTurns: 4, BarrierTimeoutS: 60, PlannerSampling: schema.Sampling{Temperature: schema.Float(0), Seed: ptr(int64(42))}}}
	// It reads as the msgpack of the same arrival reads.
	packed, err := schema.Marshal(&want)
	if err != nil {
		t.Fatal(err)
	}
	var again schema.Arrive
	if err := schema.UnmarshalTrainer(packed, map[string][]string{"Content-Type": {"application/msgpack"}}, &again); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, again) {
		t.Errorf("JSON arrival read as\n%#v %#v\nits msgpack as\n%#v %#v", got, *got.Config, again, *again.Config)
	}
	if got.AtMs != 1_700_000_000_000 || got.Config.MaxTurns != 4 || *got.Config.PlannerSampling.Temperature != 0 || *got.Config.PlannerSampling.Seed != 42 {
		t.Errorf("JSON arrival read as %+v %+v", got, *got.Config)
	}

	cases := []struct {
		name, ct, body string
		into           schema.Message
		want           string // "" = accepted
	}{
		{"cancel", "application/json", `{"schema": "rollout.cancel/1", "rollout": 7, "role": "actor", "reason": "enough"}`, &schema.Cancel{}, ""},
		{"pause", "application/json; charset=utf-8", `{"schema": "control.pause/1", "role": "actor", "mode": "abort", "timeout_s": 30}`, &schema.Pause{}, ""},
		{"resume", "Application/JSON", `{"schema": "control.resume/1", "role": "actor", "weight_version": "step-8"}`, &schema.Resume{}, ""},
		{"unknown field", "application/json", `{"schema": "rollout.arrive/1", "rollout": 7, "config": {"max_turn": 2}}`, &schema.Arrive{}, `unknown field "config.max_turn"`},
		{"max_turns 2.5", "application/json", `{"schema": "rollout.arrive/1", "config": {"max_turns": 2.5}}`, &schema.Arrive{}, `config.max_turns is the number 2.5: want an integer`},
		{"max_turns \"4\"", "application/json", `{"schema": "rollout.arrive/1", "config": {"max_turns": "4"}}`, &schema.Arrive{}, `config.max_turns is the string "4": want an integer`},
		{"max_turns true", "application/json", `{"schema": "rollout.arrive/1", "config": {"max_turns": true}}`, &schema.Arrive{}, `config.max_turns is the boolean true: want an integer`},
		{"max_turns 2^64-1", "application/json", `{"schema": "rollout.arrive/1", "config": {"max_turns": 18446744073709551615}}`, &schema.Arrive{}, `config.max_turns is the integer 18446744073709551615: want an integer from`},
		{"rollout 2^64", "application/json", `{"schema": "rollout.cancel/1", "rollout": 18446744073709551616, "role": "actor"}`, &schema.Cancel{}, `rollout is the integer 18446744073709551616: want an integer from`},
		{"at_ms with a fraction", "application/json", `{"schema": "rollout.cancel/1", "rollout": 7, "role": "actor", "at_ms": 1712345678901.25}`, &schema.Cancel{}, `at_ms is the number 1712345678901.25: want an integer`},
		{"timeout_s 1e400", "application/json", `{"schema": "control.pause/1", "role": "actor", "timeout_s": 1e400}`, &schema.Pause{}, `timeout_s is the number 1e400: want a number within`},
		{"metadata 1e400", "application/json", `{"schema": "rollout.arrive/1", "tasks": [{"prompt": "q", "metadata": {"x": [1e400]}}]}`, &schema.Arrive{}, `tasks[0].metadata.x[0] is the number 1e400`},
		{"tasks an object", "application/json", `{"schema": "rollout.arrive/1", "tasks": {"prompt": "q"}}`, &schema.Arrive{}, `tasks is a map: want an array`},
		{"other version", "application/json", `{"schema": "rollout.arrive/2", "confg": 1}`, &schema.Arrive{}, `body is "rollout.arrive/2", this reader understands "rollout.arrive/1"`},
		{"no schema", "application/json", `{"rollout": 7, "role": "actor"}`, &schema.Cancel{}, `no schema field`},
		{"not JSON", "application/json", `{"schema": "rollout.cancel/1",}`, &schema.Cancel{}, `not a JSON body: at byte`},
		{"msgpack said to be JSON", "application/json", "\x81\xa6schema\xafrollout.cancel/1", &schema.Cancel{}, `not a JSON body`},
		{"two values", "application/json", `{"schema": "rollout.cancel/1"} {}`, &schema.Cancel{}, `more follows its first value`},
		{"an array", "application/json", `[1, 2]`, &schema.Cancel{}, `the body is an array of 2: want a map of fields`},
		{"other content type", "text/plain", `{"schema": "rollout.cancel/1"}`, &schema.Cancel{}, `Content-Type "text/plain": planact reads application/msgpack (the default) or, from a trainer, application/json`},
		{"JSON without its content type", "", `{"schema": "rollout.cancel/1", "rollout": 7}`, &schema.Cancel{},
			`the body is JSON, and planact reads msgpack: encode it as msgpack (Content-Type: application/msgpack), or, for what a trainer writes (arrivals, cancels, pauses, resumes), publish it with the header Content-Type: application/json`},
		{"JSON said to be msgpack", "application/msgpack", "\n{}", &schema.Cancel{}, `the body is JSON`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := map[string][]string{}
			if c.ct != "" {
				h["Content-Type"] = []string{c.ct}
			}
			err := schema.UnmarshalTrainer([]byte(c.body), h, c.into)
			switch {
			case c.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("error %v\nwant one saying %s", err, c.want)
			case c.want != "" && fail.KindOf(err) != fail.Invalid:
				t.Errorf("kind %v, want invalid: %v", fail.KindOf(err), err)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
