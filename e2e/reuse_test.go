package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestARolloutNumberUsedAgain: rollout numbers start again when a
// training run does (a new run counting from 0 once the earlier run's
// history is gone), while planact's services run on for days. Replicas
// that kept what they read of the earlier rollout under its number (task
// lists, the calls of its turns, what its groups counted) must not give
// any of it to the new one: its samples are of its own tasks, scored
// against its own labels.
func TestARolloutNumberUsedAgain(t *testing.T) {
	t.Parallel()
	// A short history, outlasting the rollout's deadlines (barrier +
	// rollout < history), so that the first rollout's is gone soon.
	keep := bus.Provisioning{History: 16 * time.Second, ResultRetention: 2 * time.Second, DupeWindow: time.Second}
	e := start(t, envOptions{keep: keep, replicas: map[string]int{"session-store": 2, "act-dispatcher": 2, "planner-gateway": 2, "actor-gateway": 2}})
	const n = 5
	cfg := &schema.Config{StreamGroups: true, BarrierTimeoutS: 3, RolloutTimeoutS: 12}
	first := e.tasks(6, 2, 1)
	checkResults(t, n, first, e.rollout(t, e.trainer(t), e.trainer(t), n, first, cfg, false), false)

	// Its history runs out: its session, task list and messages go.
	ctx := context.Background()
	b, err := bus.Open(ctx, bustest.Conn(t, e.url), zerolog.Nop(), keep) // provisions nothing
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, _, found, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
		// Both roles' results: each ages out of the stream on its own.
		pm, perr := b.LastMsg(ctx, bus.StreamRollout, subject.Result(n, schema.RolePlanner))
		am, aerr := b.LastMsg(ctx, bus.StreamRollout, subject.Result(n, schema.RoleActor))
		if err == nil && perr == nil && aerr == nil && !found && pm == nil && am == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollout %d still there a minute after its history of %v (session %v, results %v %v: %v %v %v)", n, keep.History, found, pm != nil, am != nil, err, perr, aerr)
		}
		time.Sleep(500 * time.Millisecond)
	}

	second := e.tasks(8, 2, 2) // more tasks than the first: a list of the first is too short
	differ := len(second) - len(first)
	for i := range first {
		if second[i].Prompt != first[i].Prompt {
			differ++
		}
	}
	if differ == 0 {
		t.Fatal("the second batch asks what the first did: nothing to tell apart")
	}
	o := e.rollout(t, e.trainer(t), e.trainer(t), n, second, cfg, false)
	checkResults(t, n, second, o, false)
	for _, s := range o.planner.Samples {
		if !strings.Contains(s.Prompt, second[s.Index].Prompt) {
			t.Errorf("planner sample %s: prompt %.80q; want task %d's, %q", s.RolloutID, s.Prompt, s.Index, second[s.Index].Prompt)
		}
	}
}
