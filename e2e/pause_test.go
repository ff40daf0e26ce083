package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// TestPauseAndResume: a trainer pauses its role before it swaps weights.
// With wait, Pause returns once the running generation finished; while
// paused nothing reaches the engine; after Resume the rollout goes on and
// ends with every episode completed. With abort, the running generation is
// aborted and sent again after Resume; no act fails and each has one
// sample.
func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	for _, abort := range []bool{false, true} {
		name := "wait"
		if abort {
			name = "abort"
		}
		t.Run(name, func(t *testing.T) {
			// Slow acts: a pause lands while one runs.
			e := startSem(t, semOptions{planner: sim.Config{Seed: 93}, actor: sim.Config{Seed: 94, TTFT: 400 * time.Millisecond}})
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			n := int64(940)
			if abort {
				n = 941
			}
			tasks := e.tasks(2, 1, n)
			if abort {
				// Each act hangs the first time: a generation is surely
				// running when the pause comes, however slow the machine.
				hang := sim.FaultTimes(sim.FaultActorHang, 1)
				tasks = []schema.Task{e.question(0, population("France"), hang), e.question(1, population("Germany"), hang)}
			}
			results := e.start(t, n, tasks, nil)
			eventually(t, "an act running on the engine", func() bool { return e.actorEngine.Running() > 0 })
			trainer := e.trainer(t)
			paused, err := trainer.Pause(ctx, schema.RoleActor, client.PauseOptions{Abort: abort, Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if len(paused.Drained) == 0 || len(paused.Missing) != 0 {
				t.Errorf("paused: drained %v, missing %v; want the actor-gateway drained", paused.Drained, paused.Missing)
			}
			if abort && paused.Aborted == 0 {
				t.Errorf("an abort pause aborted nothing, with a generation running")
			}
			if running := e.actorEngine.Running(); running != 0 {
				t.Errorf("paused, yet %d generations run on the engine", running)
			}
			before, _ := e.actorEngine.Stats()
			time.Sleep(time.Second) // the paused role's acts are ready to run: none may reach the engine
			if after, _ := e.actorEngine.Stats(); after != before {
				t.Errorf("%d generations reached the engine while the actor was paused", after-before)
			}
			if err := trainer.Resume(ctx, schema.RoleActor, "actor-v9"); err != nil {
				t.Fatal(err)
			}
			o := <-results
			if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK {
				t.Fatalf("after the resume: %v %v %+v", o.perr, o.aerr, o.planner)
			}
			if got := o.planner.Stats.EpisodeStatus[schema.EpisodeCompleted]; got != 2 || len(o.planner.Stats.Failures) != 0 {
				t.Errorf("episodes %v, failures %v: a pause must fail nothing", o.planner.Stats.EpisodeStatus, o.planner.Stats.Failures)
			}
			seen := map[string]bool{}
			for _, s := range o.actor.Samples {
				k := s.RolloutID + "/" + s.Metadata["key"].(string)
				if seen[k] {
					t.Errorf("act %s has two samples", k)
				}
				seen[k] = true
			}
		})
	}
}

// TestPauseTimesOut: a pause never resumed ends at its time-out. The act
// that waited for the paused actor fails saying so (the rollout fails), the
// role's state and control.actor.expired say the pause expired, once, and
// the role works again without a resume: the next rollout completes.
func TestPauseTimesOut(t *testing.T) {
	e := startSem(t, semOptions{planner: sim.Config{Seed: 95}, actor: sim.Config{Seed: 96}})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	trainer := e.trainer(t)
	paused, err := trainer.Pause(ctx, schema.RoleActor, client.PauseOptions{Timeout: 10 * time.Minute, Reason: "weight sync"})
	if err != nil {
		t.Fatal(err)
	}
	held := telemetry.PauseWaits.WithLabelValues(schema.RoleActor)
	before := testutil.ToFloat64(held)
	const n = 942
	results := e.start(t, n, e.tasks(1, 1, n), &schema.Config{FailurePolicy: schema.PolicyFail})
	eventually(t, "an act held by the pause", func() bool { return testutil.ToFloat64(held) > before })
	// The pause's time-out passes: the test moves its deadline to now
	// rather than wait ten minutes.
	_, _, err = bus.Mutate(ctx, e.bus.Sessions, schema.RoleKey(schema.RoleActor), func(v *schema.RoleState, _ bool) (bool, error) {
		v.DeadlineMs = time.Now().UnixMilli()
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	o := <-results
	if !errors.Is(o.perr, client.ErrFailed) || !strings.Contains(o.planner.Reason, "pause time-out") {
		t.Fatalf("a rollout whose actor stayed paused: %v %+v", o.perr, o.planner)
	}
	if o.planner.Stats.Failures[schema.ActErrPaused] == 0 {
		t.Errorf("failures %v, want the paused acts counted", o.planner.Stats.Failures)
	}

	// The role's state says the pause ended at its time-out, and so does
	// control.actor.expired, once.
	var st schema.RoleState
	eventually(t, "the expiry to be announced", func() bool {
		st, _, _, err = bus.GetFresh[schema.RoleState](ctx, e.bus.Sessions, schema.RoleKey(schema.RoleActor))
		return err == nil && st.ExpiryAnnounced
	})
	x := st.Expiry
	if st.Paused || x == nil || x.Epoch != paused.Epoch || x.PauseID != paused.PauseID || st.Epoch != paused.Epoch+1 ||
		!strings.Contains(x.Reason, "pause time-out") || !strings.Contains(x.Reason, "weight sync") {
		t.Fatalf("role state after the expiry: %+v (expiry %+v); want not paused, epoch %d, the expiry of pause %s", st, x, paused.Epoch+1, paused.PauseID)
	}
	if k := e.count(t, bus.StreamControl, subject.Control(schema.RoleActor, "expired")); k != 1 {
		t.Errorf("%d messages on control.actor.expired, want 1", k)
	}
	m, err := e.bus.LastMsg(ctx, bus.StreamControl, subject.Control(schema.RoleActor, "expired"))
	if err != nil || m == nil {
		t.Fatalf("control.actor.expired: %v", err)
	}
	var said schema.PauseExpired
	if err := schema.Unmarshal(m.Data, &said); err != nil || said.PauseExpiry != *x || said.Role != schema.RoleActor {
		t.Errorf("control.actor.expired says %+v (%v), the state %+v", said, err, *x)
	}

	// No resume: the role works again.
	o = <-e.start(t, n+1, e.tasks(1, 1, n+1), nil)
	if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK || len(o.actor.Samples) == 0 {
		t.Fatalf("after the expiry, without a resume: %v %v %+v", o.perr, o.aerr, o.planner)
	}
	if o.planner.Stats.Failures[schema.ActErrPaused] != 0 {
		t.Errorf("after the expiry: failures %v", o.planner.Stats.Failures)
	}
}

// TestBoundedStaleness: the actor trainer announces newer weights (a
// resume with actor-v9) while its engine still serves actor-v3. With
// max_staleness 1 no act starts on weights six versions behind, the very
// first included (the engine is asked before every generation): the
// episode ends aborted, saying why, and the engine generates nothing.
func TestBoundedStaleness(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 97}, actor: sim.Config{Seed: 98}})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := e.trainer(t).Resume(ctx, schema.RoleActor, "actor-v9"); err != nil {
		t.Fatal(err)
	}
	const n = 943
	tasks := []schema.Task{e.question(0, population("Chile"))} // three hops, one act a turn
	o := <-e.start(t, n, tasks, &schema.Config{MaxStaleness: 1})
	// Neither result holds anything to train on: the planner's one sample
	// is of an aborted episode. It is failed, not ok, says why, and still
	// holds that sample.
	if !errors.Is(o.perr, client.ErrFailed) || o.planner == nil || o.planner.Status != schema.ResultFailed ||
		!strings.Contains(o.planner.Reason, "no planner sample to train on") || len(o.planner.Samples) != 1 {
		t.Fatalf("planner: %v %+v; want failed, holding its aborted episode's sample", o.perr, o.planner)
	}
	// The actor's result holds nothing to train on: it is failed, not ok,
	// and says why.
	if !errors.Is(o.aerr, client.ErrFailed) || o.actor == nil || o.actor.Status != schema.ResultFailed ||
		!strings.Contains(o.actor.Reason, "aborted") || !strings.Contains(o.actor.Reason, "stale") {
		t.Fatalf("actor: %v %+v; want failed, naming the stale aborts", o.aerr, o.actor)
	}
	s, ok := sampleOf(o.planner, n, 0)
	reason, _ := s.Metadata["end_reason"].(string)
	if !ok || s.Status != schema.EpisodeAborted || !strings.Contains(reason, "max_staleness 1") || !strings.Contains(reason, "actor-v3") {
		t.Fatalf("episode: %s (%q), want aborted for staleness, naming the engine's weights", s.Status, reason)
	}
	if o.planner.Stats.Failures[schema.ActErrStale] == 0 {
		t.Errorf("failures %v: the act not started is not counted", o.planner.Stats.Failures)
	}
	if requests, _ := e.actorEngine.Stats(); requests != 0 || len(o.actor.Samples) != 0 {
		t.Errorf("%d generations on stale weights, %d actor samples: the first act ran unchecked", requests, len(o.actor.Samples))
	}
	// One weight version per generated segment: each planner turn.
	turns := asInt(s.Metadata["turns"])
	if len(s.WeightVersions) != turns || s.WeightVersions[0] != "planner-v7" {
		t.Errorf("planner weight_versions %v for %d turns", s.WeightVersions, turns)
	}
}
