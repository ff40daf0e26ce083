package sessionstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/schema"
)

// TestAssemblyReadsOnlyTrajectoriesItUses: assembling a rollout that
// streamed its groups builds samples only of the episodes outside the
// groups delivered (the others' come as they were delivered), and reads no
// other episode's trajectory unless max_staleness makes its unchecked
// turns count in the stats; every episode's end and acts are read.
func TestAssemblyReadsOnlyTrajectoriesItUses(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 31
	tasks := []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q0", Label: "a"}, {GroupIndex: 1, Index: 1, Prompt: "q1", Label: "a"}}
	for e := range tasks {
		for _, m := range []schema.Message{
			&schema.PlanOutput{Rollout: n, Episode: e, Turn: 1, FinishReason: "stop", Segments: []schema.Segment{
				{Kind: schema.SegPrompt, Turn: 1, Text: "q", IDs: []int{1, 2}},
				{Kind: schema.SegGenerated, Turn: 1, Text: "a", IDs: []int{3}, LogProbs: []float64{-1}, Version: "v1"},
			}},
			&schema.ActDone{Rollout: n, Episode: e, Turn: 1, Key: "t1-s1", NodeID: "s1", Tool: "search", Status: schema.ActDoneOK,
				Generation: &schema.Generation{Prompt: "p", PromptIDs: []int{4}, OutputIDs: []int{5, 6}, LogProbs: []float64{-1, -2}, FinishReason: "stop"}},
			&schema.EpisodeEnd{Rollout: n, Episode: e, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}, Acts: []string{"t1-s1"}},
		} {
			if err := s.Bus.Publish(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	cfg := schema.DefaultConfig()
	cfg.StreamGroups = true
	sess := &schema.Session{Rollout: n, Config: cfg, Episodes: len(tasks), State: schema.SessionDone, Status: schema.ResultOK,
		Groups: []schema.GroupState{{Index: 0, State: schema.GroupDelivered}}, Ended: allEnded(len(tasks))}
	for _, staleness := range []int{0, 2} {
		sess.Config.MaxStaleness = staleness
		eps, err := s.gather(ctx, sess, tasks, nil, ownSamples(sess))
		if err != nil {
			t.Fatal(err)
		}
		delivered, own := eps[0], eps[1]
		for e, ep := range eps {
			if ep.end == nil || len(ep.acts) != 1 || ep.ran != 1 || ep.reward != 1 {
				t.Errorf("max_staleness %d, episode %d: end %v, %d acts, %d ran, reward %v; want its end, its act, and the act counted and scored",
					staleness, e, ep.end, len(ep.acts), ep.ran, ep.reward)
			}
		}
		if own.last == nil || own.planner == nil || len(own.actor) != 1 {
			t.Errorf("max_staleness %d: the episode outside the delivered group has trajectory %v, planner sample %v, %d actor samples; want all built",
				staleness, own.last != nil, own.planner != nil, len(own.actor))
		}
		if delivered.planner != nil || delivered.actor != nil {
			t.Errorf("max_staleness %d: samples built of an episode of the delivered group (planner %v, %d actor)", staleness, delivered.planner != nil, len(delivered.actor))
		}
		if read := delivered.last != nil; read != (staleness > 0) {
			t.Errorf("max_staleness %d: the delivered episode's trajectory read: %v; want it read only when max_staleness counts its unchecked turns", staleness, read)
		}
	}
}

// TestGroupSamplesReadBackAsDelivered: a delivered group's samples, in
// its message or in the object store (over the inline limit), are read
// back as they were encoded: the result holds the same samples.
func TestGroupSamplesReadBackAsDelivered(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 32
	samples := randomSamples(rand.New(rand.NewPCG(7, 7)), 8, 300)
	want, err := samplesOf(asDelivered(samples))
	if err != nil {
		t.Fatal(err)
	}
	for g, limit := range []int{1 << 20, 256} {
		s.InlineLimit = limit
		m := &schema.Group{Rollout: n, Role: schema.RoleActor, GroupIndex: g, Samples: slices.Clone(samples), Delivered: []int{g}, Groups: 2}
		obj, err := s.publishSamples(ctx, m, fmt.Sprintf("rollout-%d-actor.group-%d.samples", n, g))
		if err != nil {
			t.Fatal(err)
		}
		if inObject := obj != ""; inObject != (limit == 256) {
			t.Fatalf("inline limit %d: samples in the object store: %v", limit, inObject)
		}
		held, err := s.groupSamples(ctx, n, schema.RoleActor, g)
		if err != nil {
			t.Fatalf("inline limit %d: %v", limit, err)
		}
		got, err := samplesOf(held)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("inline limit %d: read back %d samples (%v); want the %d delivered", limit, len(got), err, len(want))
		}
	}
}

// TestEvaluationCountsUncheckedTurns: an evaluation with max_staleness
// counts, by role, the generations that ran with their weights unchecked,
// the planner's turns as the actor's acts: its stats do not say that no
// planner turn ran unchecked when some did. It still builds no sample.
func TestEvaluationCountsUncheckedTurns(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 33
	const why = "the engine names no weight version"
	tasks := []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q0", Label: "a"}}
	for _, m := range []schema.Message{
		&schema.PlanOutput{Rollout: n, Episode: 0, Turn: 1, FinishReason: "stop", Segments: []schema.Segment{
			{Kind: schema.SegPrompt, Turn: 1, Text: "q", IDs: []int{1, 2}},
			{Kind: schema.SegGenerated, Turn: 1, Text: "a", IDs: []int{3}, LogProbs: []float64{-1}, Version: "v1", StalenessUnchecked: why},
		}},
		&schema.ActDone{Rollout: n, Episode: 0, Turn: 1, Key: "t1-s1", NodeID: "s1", Tool: "search", Status: schema.ActDoneOK,
			Generation: &schema.Generation{Prompt: "p", PromptIDs: []int{4}, OutputIDs: []int{5}, LogProbs: []float64{-1}, FinishReason: "stop", StalenessUnchecked: why}},
		&schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}, Acts: []string{"t1-s1"}},
	} {
		if err := s.Bus.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	cfg := schema.DefaultConfig()
	cfg.Evaluation, cfg.MaxStaleness = true, 2
	sess := &schema.Session{Rollout: n, Config: cfg, Episodes: len(tasks), State: schema.SessionDone, Status: schema.ResultOK, Ended: allEnded(len(tasks))}
	eps, err := s.gather(ctx, sess, tasks, nil, ownSamples(sess))
	if err != nil {
		t.Fatal(err)
	}
	if eps[0].planner != nil || eps[0].actor != nil {
		t.Errorf("an evaluation built samples: planner %v, %d actor", eps[0].planner != nil, len(eps[0].actor))
	}
	planner, _ := buildResults(sess, tasks, eps, nil)
	if got := planner.Stats.StalenessUnchecked; got[schema.RolePlanner] != 1 || got[schema.RoleActor] != 1 {
		t.Errorf("staleness_unchecked %v; one planner turn and one act ran unchecked", got)
	}
}

// allEnded is a session's Ended when its first n episodes all ended.
func allEnded(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// TestAnEndAfterTheRolloutIsNotCounted: the session records which episodes
// ended within the rollout. An episode's end stored after the rollout ended
// (it timed out, was cancelled, had enough groups) used to be read from the
// stream all the same: its samples were trained on, a time-out's result
// ("5 of 8 episodes ended") counted more ended than it said, and two
// assemblies at different times could differ. It counts as unfinished now.
func TestAnEndAfterTheRolloutIsNotCounted(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	const n = 45
	tasks := endedEpisodes(t, s, n, []string{"", ""}) // both ends stored
	sess := &schema.Session{Rollout: n, Config: schema.DefaultConfig(), Episodes: len(tasks), State: schema.SessionDone,
		Status: schema.ResultTimeout, Ended: []int{0}} // only episode 0 ended in time
	eps, err := s.gather(context.Background(), sess, tasks, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if eps[0].end == nil || eps[1].end != nil || eps[1].planner != nil || len(eps[1].actor) > 0 {
		t.Errorf("episode 0 end %v; episode 1 end %v, planner sample %v, %d actor samples; want 0 ended, 1 unfinished, no sample of it",
			eps[0].end != nil, eps[1].end != nil, eps[1].planner != nil, len(eps[1].actor))
	}
}
