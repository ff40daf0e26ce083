package actdispatcher

import (
	"strings"
	"testing"

	"github.com/planact/planact/pkg/subject"
)

// The planner's answer or parse error that decides a streamed turn, stored
// but unreadable, is an error naming its subject and sequence: never taken
// for absent, so that neither the turn's runner goes on releasing acts of
// a turn that was answered, nor the watchdog drives the turn's run on as
// if its final output were a plan (docs/guarantees.md: a message that
// cannot be decoded is never read as absent). Before, both passed over it.
func TestAnUnreadableAnswerDecidesNothing(t *testing.T) {
	t.Parallel()
	s, info, _, ctx := streamedTurn(t)
	ack, err := s.Bus.JS.Publish(ctx, subject.PlanAnswer(1, 0), []byte("garbage"))
	if err != nil {
		t.Fatal(err)
	}
	if over, err := s.superseded(ctx, 1, 0, 1); err == nil || !strings.Contains(err.Error(), "plan.1.answer.0") {
		t.Errorf("superseded by an unreadable answer (sequence %d): %v, %v; want an error naming it", ack.Sequence, over, err)
	}
	if action, err := s.driveDecided(ctx, info, planDAG(1, true, 1, search("a", "x"))); err == nil || !strings.Contains(err.Error(), "plan.1.answer.0") {
		t.Errorf("the watchdog, an unreadable answer last: did %q, %v; want an error naming it", action, err)
	}
}
