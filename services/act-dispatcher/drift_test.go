package actdispatcher

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/schema"
)

// An act that drifted quarantines its episode however its turn ends: a
// streamed turn whose final output is an answer (or a parse error, the
// episode going on) does not finish, and finishTurn, which quarantines the
// episodes of finished turns, never sees its acts. Before, the answer's
// status stood: the episode ended completed, and both roles were trained
// on an episode whose actor engine had generated from another input.
func TestAnAbandonedTurnsDriftQuarantinesItsEpisode(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	info := testInfo()
	info.Session.Config.StreamPlans = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := search("a", "x"), search("b", "y")
	record(t, s, info, 5, planDAG(1, true, 1, a, b))
	const where = "the engine reports 230 prompt tokens (prompt_tokens) for the 229 planact sent"
	if _, err := s.Bus.PublishOnce(ctx, &schema.ActDone{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-a", NodeID: "a", Tool: "search", Input: "x",
		Status: schema.ActFailed, ErrorKind: schema.ActErrTokenDrift, Error: where, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	done(t, s, 1, b)
	answer := &schema.PlanAnswer{Rollout: 1, Episode: 0, Turn: 1, Answers: []string{"x"}}
	if err := s.Bus.Publish(ctx, answer); err != nil {
		t.Fatal(err)
	}
	if err := s.handleAnswer(ctx, info, answer); err != nil {
		t.Fatal(err)
	}
	end := episodeEnd(t, s)
	if end.Status != schema.EpisodeQuarantined || !strings.HasPrefix(end.Reason, "token_drift: act a (turn 1): "+where) {
		t.Fatalf("the episode ended %s (%s); want quarantined, saying where act a drifted", end.Status, end.Reason)
	}
}
