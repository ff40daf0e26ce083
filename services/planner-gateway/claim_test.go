package plannergateway

import (
	"context"
	"testing"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/schema"
)

// TestAClaimIsHeldWhileItIsWritten: another instance asks the holder of a
// claim whether it still generates the turn before it takes the turn over.
// The holder marked the turn held only after its claim's write returned,
// so a question in between was answered no, and the asker generated the
// turn beside it. The mark now comes before the write.
func TestAClaimIsHeldWhileItIsWritten(t *testing.T) {
	_, url := bustest.Server(t)
	s := &Service{Deps: Deps{Bus: bustest.Bus(t, url, "planner-gateway-test")}, id: "me", held: map[string]bool{}}
	req := &schema.PlanRequest{Rollout: 3, Episode: 1, Turn: 2}
	tn := &turn{key: schema.ClaimKey(req.Rollout, req.Episode, req.Turn)}
	var heldThen []bool
	orig := claimWritten
	claimWritten = func() {
		s.mu.Lock()
		heldThen = append(heldThen, s.held[tn.key])
		s.mu.Unlock()
	}
	t.Cleanup(func() { claimWritten = orig })
	if served, err := s.claim(context.Background(), req, tn); err != nil || served || !tn.holding {
		t.Fatalf("claim: served %v, holding %v, %v", served, tn.holding, err)
	}
	if len(heldThen) != 1 || !heldThen[0] {
		t.Errorf("held as the claim's write returned: %v; want true (a holds request then is answered yes)", heldThen)
	}
	s.release(tn)
	if s.held[tn.key] {
		t.Error("still held after its release")
	}
}
