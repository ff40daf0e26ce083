package chaos_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/planact/planact/internal/chaos"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// An executed act came from a generation the engines took: when they
// counted no call of it, its calls went uncounted, and so would a second
// generation of it. The ledger says so rather than find nothing beyond one
// call per attempt.
func TestExecutedActWithoutACountedCall(t *testing.T) {
	rec := chaos.RolloutRecord{Rollout: 7, Episodes: 2,
		Planner: chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0", "1"}},
		Actor:   chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0/1/s1", "1/1/s1"}}}
	executed := map[string]bool{"0/1/s1": true, "1/1/s1": true}
	outcomes := map[string]chaos.ActOutcome{
		chaos.ActKey(0, "t1-s1"): {Rollout: 7, Episode: 0, Turn: 1, Node: "s1", Key: "t1-s1", Status: schema.ActDoneOK, Generation: true, Attempts: 1},
		chaos.ActKey(1, "t1-s1"): {Rollout: 7, Episode: 1, Turn: 1, Node: "s1", Key: "t1-s1", Status: schema.ActDoneOK, Generation: true, Attempts: 1},
		// Cached: no generation, so no call is owed.
		chaos.ActKey(1, "t2-s1"): {Rollout: 7, Episode: 1, Turn: 2, Node: "s1", Key: "t2-s1", Status: schema.ActCached, Attempts: 1},
	}
	both := map[string]int{schema.RolePlanner: 1, schema.RoleActor: 1}

	all := map[string]sim.GenerationCalls{"0/t1-s1": {Calls: 1}, "1/t1-s1": {Calls: 1}}
	if c := chaos.Check(rec, both, executed, chaos.JoinCalls(outcomes, all)); c.Verdict != chaos.VerdictOK {
		t.Fatalf("every call counted: verdict %s, problems %q", c.Verdict, c.Problems)
	}

	some := map[string]sim.GenerationCalls{"0/t1-s1": {Calls: 1}} // act 1/t1-s1's call went uncounted
	c := chaos.Check(rec, both, executed, chaos.JoinCalls(outcomes, some))
	if c.Verdict != chaos.VerdictMismatch || len(c.Problems) != 1 || !strings.Contains(c.Problems[0], "act 1/t1-s1 ") || !strings.Contains(c.Problems[0], "no call") {
		t.Fatalf("verdict %s, problems %q; want mismatch, one problem naming act 1/t1-s1", c.Verdict, c.Problems)
	}
	var tally chaos.Tally
	tally.Add(c)
	if tally.Clean() {
		t.Error("the tally is clean")
	}
}

// The counts are taken as the run goes; stopping the takes must not cut
// off one under way, whose counts the engine has handed over already: they
// are added, or the run says they may be lost.
func TestStoppingTheTakesLosesNoCount(t *testing.T) {
	inTake, release := make(chan struct{}), make(chan struct{})
	var taken atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l := sim.GenerationLog{Generations: map[string]sim.GenerationCalls{}}
		if !taken.Swap(true) { // handed over: the engine counts afresh
			l.Generations["7-0-t1-s1"] = sim.GenerationCalls{Calls: 2}
			close(inTake)
			select {
			case <-release:
			case <-r.Context().Done(): // the harness hung up: the counts are gone
			}
		}
		_ = json.NewEncoder(w).Encode(l)
	}))
	defer srv.Close()

	calls := chaos.NewEngineCalls(srv.URL)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); calls.Run(ctx, time.Millisecond) }()
	<-inTake
	stop() // while the engine answers the take
	// A take cut off ends Run at once; one finished waits for the answer.
	// The wait only gives a cut-off take the time to show itself.
	select {
	case <-done:
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	<-done
	got := calls.Acts()[7]["0/t1-s1"].Calls
	if s := calls.Summary(); got != 2 && len(s.Incomplete) == 0 {
		t.Fatalf("act 0/t1-s1: %d calls counted and no note of lost counts; want its 2 calls, or a note", got)
	}
}
