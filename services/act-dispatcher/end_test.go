package actdispatcher

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// episodeEnd reads the end of rollout 1's episode 0.
func episodeEnd(t *testing.T, s *Service) *schema.EpisodeEnd {
	t.Helper()
	m, err := s.Bus.LastMsg(context.Background(), bus.StreamRollout, subject.EpisodeEnd(1, 0))
	if err != nil || m == nil {
		t.Fatalf("episode end: %v, %v", m, err)
	}
	var end schema.EpisodeEnd
	if err := schema.Unmarshal(m.Data, &end); err != nil {
		t.Fatal(err)
	}
	return &end
}

// A streamed turn whose final output is an answer abandons its partial
// run: the episode ends with the run as its runner last wrote it, once
// every act it released has an outcome (one still running is waited for:
// see TestAnAbandonedActThatEndsAfterTheAnswerIsListed). The episode's end
// lists exactly the acts whose outcome the ACT stream holds (what the
// session-store reads its samples from). Before, it listed the
// run's states: a node answered from the cache whose outcome its runner
// never published (it died first, and the partial delivered again was
// dropped as superseded) was listed without an outcome, and the
// session-store failed the rollout ("episode lists act t2-b, whose outcome
// is not in the ACT stream"); an act done whose completion the run had not
// recorded yet was left out, its sample lost or not by timing.
func TestAnAbandonedTurnListsTheActsWithAnOutcome(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	info := testInfo()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	finishedTurn1(t, s, "out of a")
	done(t, s, 1, search("a", "x"))
	// Turn 2's partial plan: b repeats t1-a (cached, its outcome never
	// published), c ran (its outcome published, the run not told yet), d
	// runs still (its outcome comes once the answer is there).
	b, c, d := search("b", "x"), search("c", "y"), search("d", "z")
	r2 := record(t, s, info, 9, planDAG(2, true, 1, b, c, d))
	if n := r2.Nodes[0]; n.Status != schema.NodeCached || n.CachedFrom != subject.NodeKey(1, "a") {
		t.Fatalf("t2-b is %s from %q, want cached from t1-a: the test does not set up what it means to", n.Status, n.CachedFrom)
	}
	done(t, s, 2, c)
	if err := s.Bus.Publish(ctx, &schema.PlanAnswer{Rollout: 1, Episode: 0, Turn: 2, Answers: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		ended <- s.handleAnswer(ctx, info, &schema.PlanAnswer{Rollout: 1, Episode: 0, Turn: 2, Answers: []string{"x"}})
	}()
	endDecided(t, s, 2, ended)
	done(t, s, 2, d)
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	end := episodeEnd(t, s)
	if want := []string{"t1-a", "t2-b", "t2-c", "t2-d"}; !slices.Equal(end.Acts, want) {
		t.Errorf("the episode lists acts %v, want %v: those with an outcome", end.Acts, want)
	}
	for _, key := range end.Acts {
		o, err := s.outcome(ctx, 1, 0, key)
		if err != nil {
			t.Fatal(err)
		}
		if o == nil {
			t.Errorf("the episode lists act %s, whose outcome is not in the ACT stream", key)
		}
	}
	if o, err := s.outcome(ctx, 1, 0, "t2-b"); err != nil || o == nil || o.Status != schema.ActCached || o.Output != "out of a" {
		t.Errorf("outcome of t2-b: %+v (%v), want cached with the output of t1-a", o, err)
	}
}

// The duplicate guard takes the calls of an earlier turn that did not
// finish (its partial plan abandoned for a parse error, the episode
// re-planned) from the outcomes the ACT stream holds, as the episode's
// end lists them: a call that succeeded there is not made again, however
// late its runner would have recorded it. Before, it took the nodes the
// run recorded done, which depended on when the runner last wrote it.
func TestAnAbandonedTurnsPublishedCallsAreNotMadeAgain(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	info := testInfo()
	a := search("a", "x")
	r1 := record(t, s, info, 5, planDAG(1, true, 1, a))
	if r1.Nodes[0].Status != schema.NodeReleased {
		t.Fatalf("t1-a is %s, want released: the test does not set up what it means to", r1.Nodes[0].Status)
	}
	done(t, s, 1, a) // its outcome, not recorded in the run
	r2 := record(t, s, info, 9, planDAG(2, false, 0, search("b", "x")))
	if n := r2.Nodes[0]; n.Status != schema.NodeCached || n.CachedFrom != "t1-a" || n.Output != "out of a" {
		t.Errorf("t2-b, which repeats t1-a, is %s from %q with %q; want cached from t1-a with its output", n.Status, n.CachedFrom, n.Output)
	}
}
