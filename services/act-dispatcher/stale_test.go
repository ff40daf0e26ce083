package actdispatcher

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
)

// An act refused as stale aborts its episode however its turn ends, as it
// does when the turn finishes (finishTurn): a streamed turn whose final
// output is an answer or a parse error does not finish, and the episode's
// end decides from the outcomes of its acts. Before, the answer's (or the
// parse error's) status stood: an episode ended completed though one of
// its acts never started, its weights too old. A drifted act still
// quarantines the episode rather than abort it, as finishTurn does.
func TestAnAbandonedTurnsStaleActAbortsItsEpisode(t *testing.T) {
	t.Parallel()
	const why = "the engine serves weights step-7, 3 versions behind the trainer's step-10 (max_staleness 2)"
	stale := func(n plan.Node) *schema.ActDone {
		return &schema.ActDone{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-" + n.ID, NodeID: n.ID, Tool: n.Tool, Input: n.Input(),
			Status: schema.ActFailed, ErrorKind: schema.ActErrStale, Error: why, Attempts: 1}
	}
	// Turn 1's final output, published and handled.
	endByAnswer := func(ctx context.Context, s *Service, info *session.Info) error {
		a := &schema.PlanAnswer{Rollout: 1, Episode: 0, Turn: 1, Answers: []string{"x"}}
		if err := s.Bus.Publish(ctx, a); err != nil {
			return err
		}
		return s.handleAnswer(ctx, info, a)
	}
	endByParseError := func(ctx context.Context, s *Service, info *session.Info) error {
		pe := &schema.PlanError{Rollout: 1, Episode: 0, Turn: 1, ErrorKind: string(plan.ErrUnknownDependency), Message: "node c depends on d, which is not there"}
		if err := s.Bus.Publish(ctx, pe); err != nil {
			return err
		}
		return s.handleParseError(ctx, info, pe)
	}
	for _, tc := range []struct {
		name       string
		end        func(ctx context.Context, s *Service, info *session.Info) error
		drift      bool
		wantStatus string
		wantReason string
	}{
		{"answer", endByAnswer, false, schema.EpisodeAborted, "stale: " + why + " (then: answered)"},
		{"parse error that ends the episode", endByParseError, false, schema.EpisodeAborted, "stale: " + why + " (then: "},
		{"answer, another act drifted", endByAnswer, true, schema.EpisodeQuarantined, "token_drift: act b (turn 1): "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := testService(t)
			info := testInfo()
			info.Session.Config.StreamPlans = true
			info.Session.Config.ParseErrorPolicy = schema.ParseEnd
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			a, b := search("a", "x"), search("b", "y")
			record(t, s, info, 5, planDAG(1, true, 1, a, b))
			if _, err := s.Bus.PublishOnce(ctx, stale(a)); err != nil {
				t.Fatal(err)
			}
			if tc.drift {
				if _, err := s.Bus.PublishOnce(ctx, &schema.ActDone{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-b", NodeID: "b", Tool: "search", Input: b.Input(),
					Status: schema.ActFailed, ErrorKind: schema.ActErrTokenDrift, Error: "the engine reports 230 prompt tokens", Attempts: 1}); err != nil {
					t.Fatal(err)
				}
			} else {
				done(t, s, 1, b)
			}
			if err := tc.end(ctx, s, info); err != nil {
				t.Fatal(err)
			}
			end := episodeEnd(t, s)
			if end.Status != tc.wantStatus || !strings.HasPrefix(end.Reason, tc.wantReason) {
				t.Fatalf("the episode ended %s (%s); want %s (%s…)", end.Status, end.Reason, tc.wantStatus, tc.wantReason)
			}
			if len(end.Acts) != 2 {
				t.Errorf("the episode's end lists acts %v; want both of the turn's", end.Acts)
			}
		})
	}
}

// So too when the parse error would have the planner asked again
// (parse_error_policy reprompt): an act of the turn already refused as
// stale (or drifted) ends the episode there, as finishTurn ends it after a
// finished turn, rather than let it go on to turns it cannot be trained
// on. Once the next turn was asked for, the decision stands: the parse
// error delivered again asks again, and never ends an episode whose next
// turn runs.
func TestAStaleActOfAnAbandonedTurnEndsItsEpisodeAtTheParseError(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	info := testInfo()
	info.Session.Config.StreamPlans = true
	info.Session.Config.ParseErrorPolicy = schema.ParseReprompt
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := search("a", "x"), search("b", "y")
	record(t, s, info, 5, planDAG(1, true, 1, a, b))
	done(t, s, 1, b)
	pe := &schema.PlanError{Rollout: 1, Episode: 0, Turn: 1, ErrorKind: string(plan.ErrSyntax), Message: "line 3: not a step"}
	if err := s.Bus.Publish(ctx, pe); err != nil {
		t.Fatal(err)
	}
	// a has no outcome yet: the planner is asked for turn 2.
	if err := s.handleParseError(ctx, info, pe); err != nil {
		t.Fatal(err)
	}
	nextTurn := func() int {
		t.Helper()
		m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanReq(1, 0))
		if err != nil || m == nil {
			t.Fatalf("the plan request: %v, %v", m, err)
		}
		var req schema.PlanRequest
		if err := schema.Unmarshal(m.Data, &req); err != nil {
			t.Fatal(err)
		}
		return req.Turn
	}
	if got := nextTurn(); got != 2 {
		t.Fatalf("asked for turn %d, want 2", got)
	}
	const why = "the engine serves weights step-7, 3 versions behind the trainer's step-10 (max_staleness 2)"
	if _, err := s.Bus.PublishOnce(ctx, &schema.ActDone{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-a", NodeID: "a", Tool: "search", Input: a.Input(),
		Status: schema.ActFailed, ErrorKind: schema.ActErrStale, Error: why, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	// Delivered again after turn 2 was asked for: asked again, not ended.
	if err := s.handleParseError(ctx, info, pe); err != nil {
		t.Fatal(err)
	}
	if m, err := s.Bus.LastMsg(ctx, bus.StreamRollout, subject.EpisodeEnd(1, 0)); err != nil || m != nil {
		t.Fatalf("the parse error delivered again after turn 2 was asked for ended the episode (%v, %v)", m != nil, err)
	}

	// Episode 0 of a second service's rollout: the stale outcome is there
	// when the parse error is handled.
	s2, _ := testService(t)
	record(t, s2, info, 5, planDAG(1, true, 1, a, b))
	done(t, s2, 1, b)
	if _, err := s2.Bus.PublishOnce(ctx, &schema.ActDone{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-a", NodeID: "a", Tool: "search", Input: a.Input(),
		Status: schema.ActFailed, ErrorKind: schema.ActErrStale, Error: why, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s2.Bus.Publish(ctx, pe); err != nil {
		t.Fatal(err)
	}
	for range 2 { // and delivered again: the same end
		if err := s2.handleParseError(ctx, info, pe); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := s2.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanReq(1, 0)); err != nil || m != nil {
		t.Errorf("the planner was asked for another turn of an episode with a stale act (%v, %v)", m != nil, err)
	}
	end := episodeEnd(t, s2)
	if want := "stale: " + why + " (then: syntax: line 3: not a step)"; end.Status != schema.EpisodeAborted || end.Reason != want {
		t.Fatalf("the episode ended %s (%s); want aborted (%s)", end.Status, end.Reason, want)
	}
}
