package actdispatcher

import (
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// A streamed turn's partial plan is published only when the planner has
// written another whole node: the last plan message of an episode whose
// planner still writes the rest of its turn is a partial plan, for as long
// as the planner's time-out allows. The watchdog gives that episode the
// planner's time-out (with its slack), as it gives one whose last message
// is the planner's own: before, it gave it only the acts' budget, and
// asked the planner again ("the planner stopped mid-plan") while it wrote.
func TestAPartialPlanLastWaitsForThePlannersTimeOut(t *testing.T) {
	s := &Service{Deps: Deps{Stall: time.Minute, PlannerSlack: 30 * time.Second, RetryBase: 10 * time.Millisecond}}
	cfg := schema.Config{PlannerTimeoutS: 900, ActTimeoutS: 30, ActRetries: 1, StreamPlans: true}.WithDefaults()
	planner := 900*time.Second + 30*time.Second
	for _, c := range []struct {
		name string
		d    *schema.PlanDAG
		want time.Duration
	}{
		{"partial plan", planDAG(1, true, 1, search("a", "x")), planner},
		{"final plan", planDAG(1, false, 0, search("a", "x")), s.actBudget(cfg)},
	} {
		data, err := schema.Marshal(c.d)
		if err != nil {
			t.Fatal(err)
		}
		got := s.stallFor(cfg, &bus.StoredMsg{Subject: "plan.1.dag.0", Data: data})
		if got != max(c.want, s.Stall) {
			t.Errorf("%s last: stalled after %v, want %v", c.name, got, max(c.want, s.Stall))
		}
	}
}
