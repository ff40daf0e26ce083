package actdispatcher

import (
	"testing"
	"time"

	"github.com/planact/planact/pkg/schema"
)

// TestWaitFits: a wait the engine asks for is honoured while the act's
// attempts left still fit in its budget (what the watchdog allows it),
// never past it.
func TestWaitFits(t *testing.T) {
	s := &Service{Deps: Deps{RetryBase: 100 * time.Millisecond}}
	cfg := schema.Config{ActTimeoutS: 10, ActRetries: 1} // budget: 2 × 10 s + 150 ms
	if got := s.actBudget(cfg); got != 20*time.Second+150*time.Millisecond {
		t.Fatalf("budget %v", got)
	}
	for _, tc := range []struct {
		elapsed time.Duration
		next    int
		wait    time.Duration
		fits    bool
	}{
		{0, 2, 5 * time.Second, true},                   // 5 s, then the last attempt's 10 s
		{0, 2, 11 * time.Second, false},                 // no room for the last attempt
		{9 * time.Second, 2, time.Second, true},         // 9 + 1 + 10 ≤ 20.15
		{10 * time.Second, 2, time.Second, false},       // 10 + 1 + 10 > 20.15
		{time.Minute, 2, time.Millisecond, false},       // over its budget already
		{20 * time.Second, 2, 0, false},                 // 20 + 10 > 20.15
		{9150 * time.Millisecond, 2, time.Second, true}, // exactly the budget
	} {
		if got := s.waitFits(cfg, tc.elapsed, tc.next, tc.wait); got != tc.fits {
			t.Errorf("began %v ago, attempt %d after %v: fits %v, want %v", tc.elapsed, tc.next, tc.wait, got, tc.fits)
		}
	}
	// Two attempts left: room for both, and the back-off between them.
	cfg.ActRetries = 2 // budget: 3 × 10 s + 150 ms + 300 ms
	if !s.waitFits(cfg, 0, 2, 10*time.Second) || s.waitFits(cfg, 0, 2, 10*time.Second+200*time.Millisecond) {
		t.Errorf("two attempts left: a wait of 10 s fits %v, of 10.2 s %v; want true, false",
			s.waitFits(cfg, 0, 2, 10*time.Second), s.waitFits(cfg, 0, 2, 10*time.Second+200*time.Millisecond))
	}
}
