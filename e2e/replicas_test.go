package e2e

import (
	"fmt"
	"reflect"
	"sort"
	"testing"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// TestReplicasSideBySide: two replicas of every stateless service (two
// act-dispatchers and two actor-gateways among them) give the same samples
// as one of each, with no duplicates.
func TestReplicasSideBySide(t *testing.T) {
	t.Parallel()
	simCfg := func(seed int64) (sim.Config, sim.Config) {
		return sim.Config{Seed: seed, PlannerStepwise: 0.5}, sim.Config{Seed: seed + 1, ActorErrorRate: 0.2}
	}
	run := func(replicas map[string]int) outcome {
		p, a := simCfg(11)
		e := start(t, envOptions{planner: p, actor: a, replicas: replicas})
		tasks := e.tasks(6, 2, 42)
		// Seeded sampling: each act's answer depends on its own seed, not on
		// the order requests reach the engine, so runs are comparable.
		seed := int64(5)
		cfg := &schema.Config{PlanFormat: "graph", ActorSampling: schema.Sampling{Seed: &seed}}
		o := e.rollout(t, e.trainer(t), e.trainer(t), 7, tasks, cfg, false)
		checkResults(t, 7, tasks, o, false)
		return o
	}
	one := run(nil)
	two := run(map[string]int{"act-dispatcher": 2, "actor-gateway": 2, "planner-gateway": 2, "plan-parser": 2})

	if got, want := fingerprint(two.planner.Samples), fingerprint(one.planner.Samples); !reflect.DeepEqual(got, want) {
		t.Errorf("planner samples differ between one and two replicas:\n two: %v\n one: %v", got, want)
	}
	if got, want := fingerprint(two.actor.Samples), fingerprint(one.actor.Samples); !reflect.DeepEqual(got, want) {
		t.Errorf("actor samples differ between one and two replicas:\n two: %v\n one: %v", got, want)
	}
	if one.planner.Stats.Accuracy == 1 {
		t.Errorf("with a 20%% actor error rate some answers should be wrong; accuracy %v", one.planner.Stats.Accuracy)
	}
}

// fingerprint is what must not depend on how many replicas ran: which
// samples exist, their tokens and their rewards, in a stable order.
func fingerprint(samples []schema.Sample) []string {
	out := make([]string, len(samples))
	for i, s := range samples {
		out[i] = fmt.Sprintf("%s/%v tokens=%x reward=%.4f status=%s", s.RolloutID, s.Metadata["key"], s.Tokens, s.Reward, s.Status)
	}
	sort.Strings(out)
	return out
}
