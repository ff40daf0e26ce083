package actdispatcher

import (
	"slices"
	"testing"
	"time"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// An act run twice (two runners of its turn) has one outcome: the first,
// the one the ACT stream keeps; the second is refused. But a subscriber to
// the turn's outcomes hears both, the refused one too, and the runner took
// what it heard as the act's outcome: with the stored one not heard first
// (published before the runner followed the turn, or reaching the
// stream's leader before this server on a cluster), the run recorded the
// refused outcome, and the acts that depend on it were given its output,
// one no sample holds. The outcome heard is now read from the stream.
func TestARefusedSecondOutcomeHeardIsNotTheActs(t *testing.T) {
	t.Parallel()
	s, info, g, ctx := streamedTurn(t)
	k, m := search("k", "x"), search("m", "y {k}", "k")
	key := subject.NodeKey(1, "k")
	// The outcome another runner's run of k stored.
	stored := &schema.ActDone{Rollout: 1, Episode: 0, Turn: 1, Key: key, NodeID: "k", Tool: "search", Input: k.Input(),
		Status: schema.ActDoneOK, Output: "kept"}
	if ok, err := s.Bus.PublishOnce(ctx, stored); err != nil || !ok {
		t.Fatalf("stored outcome: stored %v, %v", ok, err)
	}
	ended := make(chan error, 1)
	go func() { ended <- s.handleDAG(ctx, info, msg(3), planDAG(1, true, 1, k, m)) }()
	<-g.started // this runner's run of k generates, held
	// A second run of k ends: its outcome is refused, and heard. It is
	// published again until the runner, which follows the turn (its plan
	// is partial), has released m.
	refused := *stored
	refused.Output = "refused"
	for {
		if ok, err := s.Bus.PublishOnce(ctx, &refused); err != nil || ok {
			t.Fatalf("second outcome: stored %v, %v", ok, err)
		}
		r, _ := runOf(t, s, 1)
		if n := byID(&r)["m"]; n.Status != schema.NodePending {
			if n.Input != "y kept" {
				t.Errorf("m was released with input %q, want %q: the output of k's outcome the stream keeps", n.Input, "y kept")
			}
			break
		}
		select {
		case err := <-ended:
			t.Fatalf("the runner ended (%v) before it released m", err)
		case <-ctx.Done():
			t.Fatal("the runner never released m")
		case <-time.After(5 * time.Millisecond):
		}
	}
	if o, err := s.outcome(ctx, 1, 0, key); err != nil || o == nil || o.Output != "kept" {
		t.Fatalf("the stream's outcome of k: %+v, %v", o, err)
	}
	if got := g.generated(); !slices.Equal(got[:1], []string{key}) || slices.Contains(got[1:], key) {
		t.Errorf("generations %v, want one of %s, the runner's", got, key)
	}
}
