package schema_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

var (
	msgpackCT = map[string][]string{"Content-Type": {"application/msgpack"}}
	jsonCT    = map[string][]string{"Content-Type": {"application/json"}}
)

// kv is one key and value of a map written in order (ordered), which may
// give a key twice, as a Go map cannot.
type kv struct {
	k any
	v any
}

type ordered []kv

func (o ordered) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(len(o)); err != nil {
		return err
	}
	for _, f := range o {
		if err := e.Encode(f.k); err != nil {
			return err
		}
		if err := e.Encode(f.v); err != nil {
			return err
		}
	}
	return nil
}

func pack(t *testing.T, v any) []byte {
	t.Helper()
	data, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// refused checks that err is an invalid-input error saying want.
func refused(t *testing.T, what string, err error, want string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: accepted; want an error saying %s", what, want)
	case !strings.Contains(err.Error(), want):
		t.Errorf("%s: %v\nwant an error saying %s", what, err, want)
	case fail.KindOf(err) != fail.Invalid:
		t.Errorf("%s: kind %v, want invalid: %v", what, fail.KindOf(err), err)
	}
}

// TestAnArrayIsNoStruct: the msgpack library fills a struct from an array,
// by position: "config": [] was a config of defaults, "engine":
// ["http://x", "sglang", "m", 5] an engine, a tool or a task given as an
// array was read field by field in the order of the Go struct, and the
// unknown-field check never ran on any of them. What a trainer writes is
// refused there, as its JSON is, naming the path.
func TestAnArrayIsNoStruct(t *testing.T) {
	arrival := func(edit func(m map[string]any)) map[string]any {
		m := map[string]any{"schema": "rollout.arrive/1", "rollout": 7, "role": "planner", "at_ms": 1,
			"engine": map[string]any{"url": "http://e"},
			"tasks":  []any{map[string]any{"prompt": "q", "label": "a"}},
			"config": map[string]any{"max_turns": 3, "tools": []any{map[string]any{"name": "search"}}}}
		edit(m)
		return m
	}
	cfg := func(k string, v any) func(map[string]any) {
		return func(m map[string]any) { m["config"].(map[string]any)[k] = v }
	}
	cases := []struct {
		name string
		edit func(map[string]any)
		want string
	}{
		{"config []", func(m map[string]any) { m["config"] = []any{} }, `config is an array of 0: want a map of fields`},
		{"engine by position", func(m map[string]any) { m["engine"] = []any{"http://x", "sglang", "m", 5} }, `engine is an array of 4: want a map of fields`},
		{"a task by position", func(m map[string]any) { m["tasks"] = []any{[]any{0, 1, "q", "a"}} }, `tasks[0] is an array of 4: want a map of fields`},
		{"a tool by position", cfg("tools", []any{[]any{"search", "http"}}), `config.tools[0] is an array of 2: want a map of fields`},
		{"sampling []", cfg("planner_sampling", []any{}), `config.planner_sampling is an array of 0: want a map of fields`},
	}
	for _, c := range cases {
		m := arrival(c.edit)
		var a schema.Arrive
		refused(t, c.name+" (msgpack)", schema.UnmarshalTrainer(pack(t, m), msgpackCT, &a), c.want)
		refused(t, c.name+" (strict)", schema.UnmarshalStrict(pack(t, m), &a), c.want)
		body, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		refused(t, c.name+" (JSON)", schema.UnmarshalTrainer(body, jsonCT, &schema.Arrive{}), c.want)
	}
	// A task list in the object store, and a cancel, likewise.
	refused(t, "task list", schema.UnmarshalValueStrict(pack(t, map[string]any{"tasks": []any{[]any{0, 0, "q"}}}), &schema.TaskList{}, "task list"),
		`tasks[0] is an array of 3: want a map of fields`)
	refused(t, "cancel as an array", schema.UnmarshalStrict(pack(t, []any{"rollout.cancel/1", 7, "actor"}), &schema.Cancel{}),
		`the body is an array of 3: want a map of fields`)
	// Arrays where arrays are wanted, and anything in metadata, still go.
	ok := arrival(func(m map[string]any) {
		m["tasks"] = []any{map[string]any{"prompt": "q", "metadata": map[string]any{"xs": []any{[]any{1}, map[string]any{"a": []any{}}}}}}
		cfg("actor_sampling", map[string]any{"stop": []any{"\n"}})(m)
	})
	var a schema.Arrive
	if err := schema.UnmarshalStrict(pack(t, ok), &a); err != nil {
		t.Errorf("arrays where arrays belong: %v", err)
	}
}

// TestAKeyGivenTwiceIsRefused: of a key given twice in a msgpack map the
// library kept the last, or merged both where the value is a struct
// ({"config": {"max_turns": 8}, "config": {"reward": "em"}} ran with
// both), and JSON kept the last: the two readings of one body disagreed,
// and neither told the trainer. Either is refused, naming the key's path.
func TestAKeyGivenTwiceIsRefused(t *testing.T) {
	head := ordered{{"schema", "rollout.arrive/1"}, {"rollout", 7}, {"role", "planner"}, {"engine", map[string]any{"url": "http://e"}}}
	with := func(more ...kv) ordered { return append(append(ordered{}, head...), more...) }
	many := ordered{}
	for i := range 20 {
		many = append(many, kv{string(rune('a' + i)), i})
	}
	many = append(many, kv{"c", "again"})
	cases := []struct {
		name string
		body ordered
		json string
		want string
	}{
		{"config twice (merged)", with(kv{"config", map[string]any{"max_turns": 8}}, kv{"config", map[string]any{"reward": "em"}}),
			`{"schema": "rollout.arrive/1", "rollout": 7, "role": "planner", "engine": {"url": "http://e"}, "config": {"max_turns": 8}, "config": {"reward": "em"}}`,
			`duplicate key "config"`},
		{"rollout twice", with(kv{"rollout", 8}),
			`{"schema": "rollout.arrive/1", "rollout": 7, "role": "planner", "engine": {"url": "http://e"}, "rollout": 8}`,
			`duplicate key "rollout"`},
		{"in config", with(kv{"config", ordered{{"max_turns", 2}, {"max_turns", 9}}}),
			`{"schema": "rollout.arrive/1", "role": "planner", "engine": {"url": "http://e"}, "config": {"max_turns": 2, "max_turns": 9}}`,
			`duplicate key "config.max_turns"`},
		{"in a task", with(kv{"tasks", []any{map[string]any{"prompt": "q"}, ordered{{"prompt", "q"}, {"label", "a"}, {"label", "b"}}}}),
			`{"schema": "rollout.arrive/1", "role": "planner", "engine": {"url": "http://e"}, "tasks": [{"prompt": "q"}, {"prompt": "q", "label": "a", "label": "b"}]}`,
			`duplicate key "tasks[1].label"`},
		{"deep in metadata", with(kv{"tasks", []any{ordered{{"prompt", "q"}, {"metadata", map[string]any{"x": []any{ordered{{"k", 1}, {"k", 2}}}}}}}}),
			`{"schema": "rollout.arrive/1", "role": "planner", "engine": {"url": "http://e"}, "tasks": [{"prompt": "q", "metadata": {"x": [{"k": 1, "k": 2}]}}]}`,
			`duplicate key "tasks[0].metadata.x[0].k"`},
		{"in a large map", with(kv{"tasks", []any{ordered{{"prompt", "q"}, {"metadata", many}}}}),
			`{"schema": "rollout.arrive/1", "role": "planner", "engine": {"url": "http://e"}, "tasks": [{"prompt": "q", "metadata": {"a": 0, "b": 1, "d": 2, "e": 3, "f": 4, "g": 5, "h": 6, "i": 7, "j": 8, "k": 9, "l": 10, "m": 11, "n": 12, "o": 13, "p": 14, "q": 15, "r": 16, "s": 17, "t": 18, "c": 19, "c": 20}}]}`,
			`duplicate key "tasks[0].metadata.c"`},
	}
	for _, c := range cases {
		data := pack(t, c.body)
		refused(t, c.name+" (msgpack)", schema.UnmarshalTrainer(data, msgpackCT, &schema.Arrive{}), c.want)
		refused(t, c.name+" (JSON)", schema.UnmarshalTrainer([]byte(c.json), jsonCT, &schema.Arrive{}), c.want)
	}
	refused(t, "task list", schema.UnmarshalValueStrict(pack(t, ordered{{"tasks", []any{}}, {"tasks", []any{map[string]any{"prompt": "q"}}}}), &schema.TaskList{}, "task list"),
		`duplicate key "tasks"`)
	refused(t, "pause", schema.UnmarshalStrict(pack(t, ordered{{"schema", "control.pause/1"}, {"role", "actor"}, {"mode", "wait"}, {"mode", "abort"}}), &schema.Pause{}),
		`duplicate key "mode"`)
	// The same keys in different maps are different keys.
	var a schema.Arrive
	if err := schema.UnmarshalStrict(pack(t, with(kv{"tasks", []any{map[string]any{"prompt": "q", "label": "a"}, map[string]any{"prompt": "r", "label": "a"}}})), &a); err != nil || len(a.Tasks) != 2 {
		t.Errorf("keys repeated across maps: %v", err)
	}
}

// TestMetadataKeyedByIntegersIsNamed: a task's metadata holding, however
// deep, a map keyed by integers cannot be read into map[string]any; it was
// refused as "msgpack: invalid code=1 decoding string/bytes length",
// naming nothing. The map is named by its path, by the strict readers and
// by a watcher's.
func TestMetadataKeyedByIntegersIsNamed(t *testing.T) {
	body := pack(t, map[string]any{"schema": "rollout.arrive/1", "rollout": 7, "role": "planner", "engine": map[string]any{"url": "http://e"},
		"tasks": []any{map[string]any{"prompt": "q"}, map[string]any{"prompt": "r", "metadata": map[string]any{"a": []any{map[int]any{1: "x"}}}}}})
	const want = `tasks[1].metadata.a[0] is a map: want a map whose keys are strings`
	refused(t, "strict", schema.UnmarshalStrict(body, &schema.Arrive{}), want)
	refused(t, "watcher", schema.Unmarshal(body, &schema.Arrive{}), want)
	list := pack(t, map[string]any{"tasks": []any{map[string]any{"prompt": "q", "metadata": map[string]any{"m": map[string]any{"n": map[int]any{2: 3}}}}}})
	refused(t, "task list", schema.UnmarshalValueStrict(list, &schema.TaskList{}, "task list"), `tasks[0].metadata.m.n is a map: want a map whose keys are strings`)
}

// TestBoundsTheSchemaStates: the schemas say group_index, index, at_ms
// and rollout are 0 or more and a prompt is not empty; Go read -1 as it
// came, and a task list from the object store ran with empty prompts.
// What a trainer writes is refused out of those bounds, naming the field.
func TestBoundsTheSchemaStates(t *testing.T) {
	arrival := func(edit func(m map[string]any)) map[string]any {
		m := map[string]any{"schema": "rollout.arrive/1", "rollout": 7, "role": "planner", "at_ms": 1,
			"engine": map[string]any{"url": "http://e"},
			"tasks":  []any{map[string]any{"prompt": "q"}, map[string]any{"prompt": "r", "group_index": 1, "index": 1}}}
		edit(m)
		return m
	}
	task := func(k string, v any) func(map[string]any) {
		return func(m map[string]any) { m["tasks"].([]any)[1].(map[string]any)[k] = v }
	}
	cases := []struct {
		name string
		edit func(map[string]any)
		want string // "" = accepted
	}{
		{"as written", func(map[string]any) {}, ""},
		{"group_index -1", task("group_index", -1), `tasks[1].group_index is the integer -1: want an integer from 0`},
		{"index -3", task("index", -3), `tasks[1].index is the integer -3: want an integer from 0`},
		{"index -1.0", task("index", -1.0), `tasks[1].index is the integer -1: want an integer from 0`},
		{"empty prompt", task("prompt", ""), `tasks[1].prompt is empty or missing`},
		{"no prompt", func(m map[string]any) { delete(m["tasks"].([]any)[1].(map[string]any), "prompt") }, `tasks[1].prompt is empty or missing`},
		{"at_ms -5", func(m map[string]any) { m["at_ms"] = -5 }, `at_ms is the integer -5: want unix milliseconds from 0`},
		{"rollout -1", func(m map[string]any) { m["rollout"] = -1 }, `rollout is the integer -1: want a rollout id from 0`},
	}
	for _, c := range cases {
		m := arrival(c.edit)
		body, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		for how, err := range map[string]error{
			"msgpack": schema.UnmarshalTrainer(pack(t, m), msgpackCT, &schema.Arrive{}),
			"JSON":    schema.UnmarshalTrainer(body, jsonCT, &schema.Arrive{}),
		} {
			if c.want == "" {
				if err != nil {
					t.Errorf("%s (%s): refused: %v", c.name, how, err)
				}
				continue
			}
			refused(t, c.name+" ("+how+")", err, c.want)
		}
	}
	for _, c := range []struct {
		body map[string]any
		into any
		want string
	}{
		{map[string]any{"schema": "rollout.cancel/1", "rollout": 7, "role": "actor", "at_ms": -1}, &schema.Cancel{}, `at_ms is the integer -1: want unix milliseconds from 0`},
		{map[string]any{"schema": "rollout.cancel/1", "rollout": -7, "role": "actor"}, &schema.Cancel{}, `rollout is the integer -7: want a rollout id from 0`},
		{map[string]any{"schema": "control.pause/1", "role": "actor", "at_ms": -1}, &schema.Pause{}, `at_ms is the integer -1`},
		{map[string]any{"schema": "control.resume/1", "role": "actor", "at_ms": -1}, &schema.Resume{}, `at_ms is the integer -1`},
		{map[string]any{"tasks": []any{map[string]any{"prompt": "q", "group_index": -2}}}, &schema.TaskList{}, `tasks[0].group_index is the integer -2: want an integer from 0`},
		{map[string]any{"tasks": []any{map[string]any{"prompt": "q"}, map[string]any{"label": "a"}}}, &schema.TaskList{}, `tasks[1].prompt is empty or missing`},
	} {
		var err error
		if m, ok := c.into.(schema.Message); ok {
			err = schema.UnmarshalStrict(pack(t, c.body), m)
		} else {
			err = schema.UnmarshalValueStrict(pack(t, c.body), c.into, "task list")
		}
		refused(t, "body "+c.want, err, c.want)
	}
}

// TestValidateTasks: one check of a task list's bounds, for every path a
// list comes by (inline in an arrival, or from the object store).
func TestValidateTasks(t *testing.T) {
	cases := []struct {
		tasks []schema.Task
		want  string
	}{
		{nil, ""},
		{[]schema.Task{{Prompt: "q"}, {GroupIndex: 3, Index: 9, Prompt: "r"}}, ""},
		{[]schema.Task{{Prompt: "q"}, {GroupIndex: -1, Prompt: "r"}}, `tasks[1].group_index is the integer -1: want an integer from 0`},
		{[]schema.Task{{Index: -1, Prompt: "q"}}, `tasks[0].index is the integer -1: want an integer from 0`},
		{[]schema.Task{{Prompt: "q"}, {Prompt: "q"}, {Label: "a"}}, `tasks[2].prompt is empty or missing`},
	}
	for _, c := range cases {
		err := schema.ValidateTasks(c.tasks)
		if c.want == "" {
			if err != nil {
				t.Errorf("%+v refused: %v", c.tasks, err)
			}
			continue
		}
		refused(t, "tasks", err, c.want)
	}
}

// TestPauseModeEmptyIsNotLeftOut: a pause that leaves its mode out waits
// (the schema's default); one whose mode is "" is neither mode (the
// schema's enum), and was taken for wait. Go and the schema agree.
func TestPauseModeEmptyIsNotLeftOut(t *testing.T) {
	schemas := compile(t)
	pause := schemas["control.pause.v1.schema.json"]
	for _, c := range []struct {
		json string
		want string // "" = valid
	}{
		{`{"schema": "control.pause/1", "role": "actor", "at_ms": 1}`, ""},
		{`{"schema": "control.pause/1", "role": "actor", "mode": "abort", "at_ms": 1}`, ""},
		{`{"schema": "control.pause/1", "role": "actor", "mode": "", "at_ms": 1}`, `mode is the string "": want wait or abort (left out: wait)`},
	} {
		se := pause.Validate(jsonValue(t, []byte(c.json)))
		var p schema.Pause
		ge := schema.UnmarshalTrainer([]byte(c.json), jsonCT, &p)
		var fromMsgpack schema.Pause
		body, err := jsonToMsgpack([]byte(c.json))
		if err != nil {
			t.Fatal(err)
		}
		me := schema.UnmarshalTrainer(body, msgpackCT, &fromMsgpack)
		if c.want == "" {
			if se != nil || ge != nil || me != nil {
				t.Errorf("%s: schema says %v, Go %v (JSON), %v (msgpack); want valid", c.json, se, ge, me)
			}
			if p = p.WithDefaults(); p.Validate() != nil {
				t.Errorf("%s: %v", c.json, p.Validate())
			}
			continue
		}
		if se == nil {
			t.Errorf("%s: the schema takes it", c.json)
		}
		refused(t, c.json+" (JSON)", ge, c.want)
		refused(t, c.json+" (msgpack)", me, c.want)
	}
}

// TestStopCountsCharacters: a stop string is bounded in characters, as the
// schema's maxLength counts them; Go counted bytes, so 200 accented
// letters (400 bytes) were refused though the schema takes them.
func TestStopCountsCharacters(t *testing.T) {
	schemas := compile(t)
	for _, c := range []struct {
		stop string
		ok   bool
	}{
		{strings.Repeat("x", 256), true},
		{strings.Repeat("é", 200), true},
		{strings.Repeat("日", 256), true},
		{strings.Repeat("x", 257), false},
		{strings.Repeat("é", 257), false},
		{"", false},
	} {
		cfg := map[string]any{"actor_sampling": map[string]any{"stop": []any{c.stop}}}
		body, err := json.Marshal(map[string]any{"schema": "rollout.arrive/1", "rollout": 7, "role": "planner", "at_ms": 1,
			"engine": map[string]any{"url": "http://e"}, "config": cfg})
		if err != nil {
			t.Fatal(err)
		}
		se := schemas["rollout.arrive.v1.schema.json"].Validate(jsonValue(t, body))
		var a schema.Arrive
		ge := schema.UnmarshalTrainer(body, jsonCT, &a)
		if ge == nil {
			ge = a.Config.WithDefaults().Validate()
		}
		if (se == nil) != c.ok || (ge == nil) != c.ok {
			t.Errorf("stop of %d characters (%d bytes): schema says %v, Go says %v; want valid %v", len([]rune(c.stop)), len(c.stop), se, ge, c.ok)
		}
	}
}

func jsonToMsgpack(data []byte) ([]byte, error) {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	err := enc.Encode(v)
	return buf.Bytes(), err
}
