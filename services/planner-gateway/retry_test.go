package plannergateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/internal/enginetest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// failThenPause fails the first generation of one planner turn (a 500),
// and pauses the planner role (abort mode) while the turn's next attempt
// renders its conversation (/tokenize, before any generation): the pause
// aborts no generation. The role is resumed once the gateway gave the
// tokenize up.
type failThenPause struct {
	next       http.Handler
	generation string // the turn's X-Planact-Generation
	setRole    func(paused bool, epoch int64)

	mu       sync.Mutex
	failed   bool
	paused   bool
	aborted  chan struct{} // closed when the pause aborted the tokenize
	abortErr error
}

func (f *failThenPause) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(engine.GenerationHeader) == f.generation {
		f.mu.Lock()
		fail := enginetest.IsGeneration(r.URL.Path) && !f.failed
		pause := r.URL.Path == "/tokenize" && f.failed && !f.paused
		f.failed = f.failed || fail
		f.paused = f.paused || pause
		f.mu.Unlock()
		switch {
		case fail:
			http.Error(w, `{"error":"the test's engine failure"}`, http.StatusInternalServerError)
			return
		case pause:
			// Read to its end: the server sees the client go only then.
			_, _ = io.Copy(io.Discard, r.Body)
			f.setRole(true, 1)
			select {
			case <-r.Context().Done(): // the gate aborted the tokenize
			case <-time.After(20 * time.Second):
				f.abortErr = context.DeadlineExceeded
			}
			close(f.aborted)
			f.setRole(false, 2)
			http.Error(w, "aborted", http.StatusServiceUnavailable)
			return
		}
	}
	f.next.ServeHTTP(w, r)
}

// TestARetryRecordsWhyItIsSent: a turn's first generation failed; its
// next attempt was held by a pause (abort mode) while it rendered its
// conversation, before any generation was sent. The claim recorded the
// generation sent after the resume as one a pause aborted, which aborted
// none: it was sent again because the engine failed, and the claim now
// says so.
func TestARetryRecordsWhyItIsSent(t *testing.T) {
	p := startPlanners(t)
	const n = 300
	f := &failThenPause{generation: engine.TurnGeneration(n, 0, 2), aborted: make(chan struct{}),
		next: enginetest.New(sim.New(sim.Config{Role: schema.RolePlanner, Seed: 9, WeightVersion: "planner-v1"}), enginetest.Options{})}
	f.setRole = func(paused bool, epoch int64) {
		_, _, err := bus.Mutate(p.ctx, p.b.Sessions, schema.RoleKey(schema.RolePlanner), func(v *schema.RoleState, _ bool) (bool, error) {
			*v = schema.RoleState{Role: schema.RolePlanner, Paused: paused, Mode: schema.PauseAbort, Epoch: epoch, WeightVersion: "planner-v1"}
			return true, nil
		})
		if err != nil && p.ctx.Err() == nil {
			t.Error(err)
		}
	}
	p.rolloutOn(t, n, enginetest.Start(t, f), engine.ProtocolOpenAIChat, schema.DefaultConfig())
	p.turn(t, n, 1, "")
	out := p.turn(t, n, 2, "\n<observation>\nok\n</observation>\n")
	select {
	case <-f.aborted:
		if f.abortErr != nil {
			t.Fatalf("the pause never aborted the tokenize: %v", f.abortErr)
		}
	default:
		t.Fatal("the turn's second attempt never rendered its conversation under the pause")
	}
	if last := out.Segments[len(out.Segments)-1]; last.Kind != schema.SegGenerated || last.Turn != 2 {
		t.Fatalf("turn 2's output has no generation: %+v", last)
	}
	claim, _, found, err := bus.GetFresh[schema.Claim](context.Background(), p.b.Runs, schema.ClaimKey(n, 0, 2))
	if err != nil || !found {
		t.Fatalf("turn 2's claim: found %v, %v", found, err)
	}
	if len(claim.Retries) != 1 || !strings.HasPrefix(claim.Retries[0].Why, "the engine failed") {
		t.Errorf("turn 2's claim records retries %+v; want one, the engine failed: no pause aborted a generation", claim.Retries)
	}
}
