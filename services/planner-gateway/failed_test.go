package plannergateway

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/planact/planact/internal/enginetest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// refuseAll answers every generation of a planner turn with a 400, and
// counts them; then runs after each refusal is answered.
type refuseAll struct {
	next http.Handler
	then func()

	mu      sync.Mutex
	refused int
}

func (f *refuseAll) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if enginetest.IsGeneration(r.URL.Path) && r.Header.Get(engine.GenerationHeader) != "" {
		f.mu.Lock()
		f.refused++
		f.mu.Unlock()
		http.Error(w, `{"error":"the test's refusal"}`, http.StatusBadRequest)
		f.then()
		return
	}
	f.next.ServeHTTP(w, r)
}

func (f *refuseAll) generations() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused
}

// TestAFailedTurnIsNotGeneratedAgain: the engine refused a turn for good,
// and the turn's failure was decided; then its publish failed, or the
// holder's check of its claim before failing the turn went unanswered, and
// the request was handed back. Its redelivery took the turn on with the
// generation its instance kept, and sent it to the engine again (a retry
// recorded) for a turn already decided failed. The failure decided is kept
// now, as an output is: the redelivery publishes it, and the engine is
// asked once.
func TestAFailedTurnIsNotGeneratedAgain(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int64
		// lose makes the next publish of the turn's failure, or the next
		// read of its claim by its holder's check, fail once.
		lose func(t *testing.T) (arm func())
	}{
		{"its publish failed", 51, func(t *testing.T) func() {
			var mu sync.Mutex
			armed := false
			orig := publishFailure
			publishFailure = func(ctx context.Context, b *bus.Bus, pe *schema.PlanError) error {
				mu.Lock()
				lost := armed
				armed = false
				mu.Unlock()
				if lost {
					return fail.Transientf("publish %s: no ack (the test's)", pe.Subject())
				}
				return orig(ctx, b, pe)
			}
			t.Cleanup(func() { publishFailure = orig })
			return func() {
				mu.Lock()
				armed = true
				mu.Unlock()
			}
		}},
		{"its claim was not read", 52, func(t *testing.T) func() {
			var mu sync.Mutex
			armed := false
			orig := readClaim
			readClaim = func(ctx context.Context, kv *bus.Bucket, key string) (schema.Claim, bool, error) {
				mu.Lock()
				lost := armed
				armed = false
				mu.Unlock()
				if lost {
					return schema.Claim{}, false, fail.Transientf("read %s: the test's (%w)", key, bus.ErrNotAnswered)
				}
				return orig(ctx, kv, key)
			}
			t.Cleanup(func() { readClaim = orig })
			return func() {
				mu.Lock()
				armed = true
				mu.Unlock()
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, eng, ctx := oneEpisode(t, tc.n)
			arm := tc.lose(t)
			var once sync.Once
			f := &refuseAll{next: eng, then: func() { once.Do(arm) }}
			sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(tc.n))
			if err != nil {
				t.Fatal(err)
			}
			sess.Roles[schema.RolePlanner] = schema.RoleInfo{Engine: schema.Engine{URL: enginetest.Start(t, f), Protocol: engine.ProtocolSGLang}, WeightVersion: "planner-v1"}
			if _, _, err := bus.Mutate(ctx, b.Sessions, schema.SessionKey(tc.n), func(v *schema.Session, _ bool) (bool, error) {
				*v = sess
				return true, nil
			}); err != nil {
				t.Fatal(err)
			}

			pe := runFailedTurn(t, ctx, b, tc.n)

			if got := f.generations(); got != 1 {
				t.Errorf("the engine was asked %d times for the turn, want once: its failure was decided after the first", got)
			}
			if pe.ErrorKind != schema.PlanErrPlannerRejected || !strings.Contains(pe.Message, "the test's refusal") {
				t.Errorf("the turn's failure is %s %q, want the engine's refusal", pe.ErrorKind, pe.Message)
			}
			if c := turnClaim(t, b, tc.n); len(c.Retries) != 0 {
				t.Errorf("the claim records retries %+v, want none: nothing was generated again", c.Retries)
			}
		})
	}
}

// runFailedTurn runs a planner-gateway on b, asks it for turn 1 of episode
// 0 of rollout n, waits for the turn's failure and stops the service; it
// returns the failure.
func runFailedTurn(t *testing.T, ctx context.Context, b *bus.Bus, n int64) schema.PlanError {
	t.Helper()
	return runTurnUntil[schema.PlanError](t, ctx, b, n, subject.PlanError(n, 0))
}
