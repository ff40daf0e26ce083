package schema

import (
	"fmt"
	"testing"
)

// FuzzUnmarshalTrainer: whatever a trainer sends, in msgpack or JSON, is
// read or refused without a panic and without allocating what it merely
// claims; what is read is what planact would write back, and reads again
// the same.
func FuzzUnmarshalTrainer(f *testing.F) {
	arrival, _ := Marshal(&Arrive{Rollout: 7, Role: RolePlanner, Engine: Engine{URL: "http://e"},
		Tasks:  []Task{{Prompt: "q", Label: "a", Metadata: map[string]any{"n": 1, "xs": []any{"x", 2.5}}}},
		Config: &Config{MaxTurns: 4, ActTimeoutS: 30, PlannerSampling: Sampling{Temperature: Float(0)}}, AtMs: 1767225600000})
	cancel, _ := Marshal(&Cancel{Rollout: 7, Role: RoleActor, Reason: "enough", AtMs: 1})
	f.Add(arrival, false)
	f.Add(cancel, false)
	f.Add([]byte(`{"schema": "rollout.arrive/1", "rollout": 7, "role": "planner", "at_ms": 1.7e12, "config": {"max_turns": 4.0},
		"tasks": [{"prompt": "q", "metadata": {"n": 18446744073709551615, "f": [1e300]}}]}`), true)
	f.Add([]byte(`{"schema": "rollout.cancel/1", "rollout": 7, "role": "actor"}`), true)
	f.Add([]byte{0x82, 0xa6, 's', 'c', 'h', 'e', 'm', 'a', 0xb0, 'r', 'o', 'l', 'l', 'o', 'u', 't', '.', 'a', 'r', 'r', 'i', 'v', 'e', '/', '1',
		0xa5, 't', 'a', 's', 'k', 's', 0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0}, false)
	f.Fuzz(func(t *testing.T, data []byte, asJSON bool) {
		h := map[string][]string{}
		if asJSON {
			h[HdrContentType] = []string{ContentTypeJSON}
		}
		_, treeErr := msgpackTree(data)
		if treeErr == nil {
			if err := scanBody(data); err != nil {
				t.Fatalf("the tree reader reads a body the scan refuses: %v", err)
			}
		}
		_, _ = ToJSONable(data)
		for _, v := range []Message{&Arrive{}, &Cancel{}, &Pause{}, &Resume{}} {
			if err := UnmarshalTrainer(data, h, v); err != nil {
				continue
			}
			once, err := Marshal(v)
			if err != nil {
				t.Fatalf("%T read from %q cannot be written: %v", v, data, err)
			}
			again := newLike(v)
			if err := UnmarshalStrict(once, again); err != nil {
				t.Fatalf("%T read from %q, written as %q, does not read again: %v", v, data, once, err)
			}
			twice, _ := Marshal(again)
			if a, b := plain(t, once), plain(t, twice); a != b {
				t.Fatalf("%T read from %q reads back otherwise:\n%s\n%s", v, data, a, b)
			}
		}
	})
}

func newLike(m Message) Message {
	switch m.(type) {
	case *Arrive:
		return &Arrive{}
	case *Cancel:
		return &Cancel{}
	case *Pause:
		return &Pause{}
	}
	return &Resume{}
}

// plain prints a body with its maps in key order.
func plain(t *testing.T, body []byte) string {
	v, err := ToJSONable(body)
	if err != nil {
		t.Fatalf("%q: %v", body, err)
	}
	return fmt.Sprintf("%#v", v)
}
