package sessionstore

import (
	"context"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
)

// TestRefusedList: a task list stored by an arrival that was then refused
// (it raced with another arrival of its role, on another replica, and lost
// the session's compare-and-set) is found at the barrier, whatever the
// arrival that counted brought: other tasks, or none.
func TestRefusedList(t *testing.T) {
	list := schema.TaskList{From: schema.RolePlanner, Digest: "sha256:bbbb"}
	for _, c := range []struct {
		name    string
		counted schema.RoleInfo
		refused bool
	}{
		{"same list", schema.RoleInfo{Digest: "sha256:1", Tasks: "sha256:bbbb"}, false},
		{"other list", schema.RoleInfo{Digest: "sha256:1", Tasks: "sha256:aaaa"}, true},
		{"no list", schema.RoleInfo{Digest: "sha256:1"}, true},
		{"recorded before digests", schema.RoleInfo{}, false},
	} {
		sess := &schema.Session{Roles: map[string]schema.RoleInfo{schema.RolePlanner: c.counted, schema.RoleActor: {Digest: "sha256:2"}}}
		if got := refusedList(sess, list); got != c.refused {
			t.Errorf("%s: refused %v, want %v", c.name, got, c.refused)
		}
	}
}

// TestDifferencesNameWhatDiffers: the refusal of a second arrival names each
// thing it asks for that the first did not.
func TestDifferencesNameWhatDiffers(t *testing.T) {
	cfg := &schema.Config{MaxTurns: 3, Tools: []schema.Tool{{Name: "search"}}}
	first := &schema.Arrive{Rollout: 1, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://a", Protocol: "sglang"}, WeightVersion: "v1",
		Tasks: []schema.Task{{Prompt: "q"}}, Config: cfg}
	sum := func(a *schema.Arrive) arrivalSum {
		x, err := (&Service{}).sumArrival(context.Background(), a) // inline tasks: no object store to ask
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	fx := sum(first)
	info := schema.RoleInfo{Engine: first.Engine, WeightVersion: first.WeightVersion, Digest: fx.digest, ConfigDigest: fx.config, Tasks: fx.tasks}
	sess := &schema.Session{Config: *cfg, ConfigFrom: schema.RolePlanner}

	second := *first
	second.Engine.Protocol = "openai"
	second.WeightVersion = "v2"
	second.Tasks = []schema.Task{{Prompt: "q"}, {Prompt: "r"}}
	second.Config = &schema.Config{MaxTurns: 2, Tools: []schema.Tool{{Name: "search"}}, StreamPlans: true}
	got := strings.Join(differences(sess, info, &second, sum(&second)), "; ")
	for _, want := range []string{`engine.protocol "openai", was "sglang"`, `weight_version "v2", was "v1"`,
		"config max_turns 2, was 3, stream_plans true, was unset", "tasks 2 (sha256:"} {
		if !strings.Contains(got, want) {
			t.Errorf("differences %q: want %q", got, want)
		}
	}
	if strings.Contains(got, "engine.url") || strings.Contains(got, "tools") {
		t.Errorf("differences %q name what did not differ", got)
	}
	same := *first
	same.Config = &schema.Config{MaxTurns: 3, Tools: []schema.Tool{{Name: "search"}}, PlanFormat: schema.DefaultConfig().PlanFormat}
	if sum(&same).digest != fx.digest {
		t.Error("a config that spells out a default sums differently")
	}
}

// TestEngineCapacityChecked: an arrival whose engine states a capacity out
// of bounds is refused, naming the field, the value and what is wanted; a
// second arrival of the role that states another capacity is refused
// naming it, as another url is.
func TestEngineCapacityChecked(t *testing.T) {
	s := &Service{}
	for _, c := range []struct {
		capacity int
		want     string
	}{
		{0, ""}, {1, ""}, {256, ""}, {schema.MaxEngineInFlight, ""},
		{-1, "engine.max_in_flight -1: want the generations the engine serves at once, 1 to 65536"},
		{schema.MaxEngineInFlight + 1, "engine.max_in_flight 65537: want"},
	} {
		a := &schema.Arrive{Rollout: 1, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://a", MaxInFlight: c.capacity}}
		err := s.validateArrival(a)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("max_in_flight %d refused: %v", c.capacity, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("max_in_flight %d: error %v, want %q", c.capacity, err, c.want)
		}
	}
	first := schema.RoleInfo{Engine: schema.Engine{URL: "http://a", MaxInFlight: 128}}
	second := &schema.Arrive{Rollout: 1, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://a", MaxInFlight: 256}}
	got := strings.Join(differences(&schema.Session{}, first, second, arrivalSum{}), "; ")
	if !strings.Contains(got, "engine.max_in_flight 256, was 128") {
		t.Errorf("differences %q: want the capacity named", got)
	}
}
