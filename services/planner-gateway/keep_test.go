package plannergateway

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/internal/enginetest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

// unanswered makes the next n reads of the PLAN stream's last output of a
// turn go unanswered, as while its leader is elected; the hook is undone
// when the test ends.
func unanswered(t *testing.T) (start func(n int)) {
	t.Helper()
	var mu sync.Mutex
	left := 0
	orig := lastPlanMsg
	lastPlanMsg = func(ctx context.Context, b *bus.Bus, subj string) (*bus.StoredMsg, error) {
		mu.Lock()
		fails := left > 0
		if fails {
			left--
		}
		mu.Unlock()
		if fails {
			return nil, fail.Transientf("read %s %s: the test's (%w)", bus.StreamPlan, subj, bus.ErrNotAnswered)
		}
		return orig(ctx, b, subj)
	}
	t.Cleanup(func() { lastPlanMsg = orig })
	return func(n int) {
		mu.Lock()
		left = n
		mu.Unlock()
	}
}

// turnClaim reads the claim of turn 1 of episode 0 of rollout n.
func turnClaim(t *testing.T, b *bus.Bus, n int64) schema.Claim {
	t.Helper()
	c, _, found, err := bus.GetFresh[schema.Claim](context.Background(), b.Runs, schema.ClaimKey(n, 0, 1))
	if err != nil || !found {
		t.Fatalf("the turn's claim: found %v, %v", found, err)
	}
	return c
}

// TestAnOutputIsKeptWhileTheStreamDoesNotAnswer: a turn's output was
// generated; its publish failed, and the next attempt's reads went
// unanswered (the PLAN stream electing a leader). The handler handed the
// request back and dropped the output; the redelivery took the turn over
// from its own instance ("no longer generates it", untrue) and the engine
// generated the turn again. The handler now keeps the output, past its
// attempts, and publishes it once the stream answers; past the rollout's
// deadline it hands the request back, and the instance keeps the output
// for the redelivery. Either way the engine is asked once, and the claim
// records no retry.
func TestAnOutputIsKeptWhileTheStreamDoesNotAnswer(t *testing.T) {
	for _, tc := range []struct {
		name       string
		n          int64
		unanswered int  // reads after the lost publish
		late       bool // the rollout is past its deadline
	}{
		{"kept by its handler", 11, 8, false}, // more reads than a turn has attempts
		{"kept for its redelivery", 21, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, eng, ctx := oneEpisode(t, tc.n)
			if tc.late {
				_, _, err := bus.Mutate(ctx, b.Sessions, schema.SessionKey(tc.n), func(v *schema.Session, _ bool) (bool, error) {
					v.StartedMs = time.Now().Add(-schema.Seconds(v.Config.WithDefaults().RolloutTimeoutS) - time.Minute).UnixMilli()
					return true, nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			stall := unanswered(t)

			var mu sync.Mutex
			var published []*schema.PlanOutput
			orig := publishOutput
			publishOutput = func(ctx context.Context, b *bus.Bus, out *schema.PlanOutput) error {
				mu.Lock()
				published = append(published, out)
				first := len(published) == 1
				mu.Unlock()
				if first {
					stall(tc.unanswered)
					return fail.Transientf("publish %s: no ack (the test's)", out.Subject())
				}
				return orig(ctx, b, out)
			}
			t.Cleanup(func() { publishOutput = orig })
			creates := 0
			origCreate := createClaim
			createClaim = func(ctx context.Context, kv *bus.Bucket, key string, c *schema.Claim) (bool, error) {
				mu.Lock()
				creates++
				mu.Unlock()
				return origCreate(ctx, kv, key, c)
			}
			t.Cleanup(func() { createClaim = origCreate })

			out := runTurn(t, ctx, b, tc.n)

			turn := engine.TurnGeneration(tc.n, 0, 1)
			if got := eng.Counts().Turns(); len(got) != 1 || got[turn] != 1 {
				t.Errorf("the engine generated %v, want turn %s once", got, turn)
			}
			mu.Lock()
			if len(published) != 2 || published[0] != published[1] {
				t.Errorf("%d publishes of the output, want 2 of the same output (the first lost)", len(published))
			}
			if handlers := creates; tc.late != (handlers > 1) {
				t.Errorf("%d deliveries of the request claimed the turn; want one unless the rollout is past its deadline", handlers)
			}
			mu.Unlock()
			if last := out.Segments[len(out.Segments)-1]; last.Kind != schema.SegGenerated || out.Text == "" {
				t.Errorf("the stored output has no generation: %+v", last)
			}
			if c := turnClaim(t, b, tc.n); len(c.Retries) != 0 {
				t.Errorf("the claim records retries %+v, want none: nothing was generated again", c.Retries)
			}
		})
	}
}

// TestAClaimWhoseAckWasLostIsTakenOnWithoutARetry: a turn's claim was
// written but its ack lost; the handler handed the request back, and its
// redelivery found the claim of its own instance, which it took over as
// from a holder that "no longer generates it", recording a retry of a
// turn nothing had generated. It takes its own claim on now, without a
// retry, and the engine is asked once.
func TestAClaimWhoseAckWasLostIsTakenOnWithoutARetry(t *testing.T) {
	const n = 12
	b, eng, ctx := oneEpisode(t, n)

	var mu sync.Mutex
	creates := 0
	orig := createClaim
	createClaim = func(ctx context.Context, kv *bus.Bucket, key string, c *schema.Claim) (bool, error) {
		created, err := orig(ctx, kv, key, c)
		mu.Lock()
		creates++
		lose := creates == 1
		mu.Unlock()
		if lose && err == nil && created {
			return false, fail.Transientf("kv create %s: no ack (the test's)", key)
		}
		return created, err
	}
	t.Cleanup(func() { createClaim = orig })

	runTurn(t, ctx, b, n)

	mu.Lock()
	if creates < 2 {
		t.Errorf("%d claim writes, want the request delivered again after the lost ack", creates)
	}
	mu.Unlock()
	if got := eng.Counts().Turns(); len(got) != 1 || got["12-0-t1"] != 1 {
		t.Errorf("the engine generated %v, want turn 12-0-t1 once", got)
	}
	if c := turnClaim(t, b, n); len(c.Retries) != 0 {
		t.Errorf("the claim records retries %+v, want none: nothing was generated before", c.Retries)
	}
}

// failOnce answers the first generation of a turn with a 500.
type failOnce struct {
	next   http.Handler
	mu     sync.Mutex
	failed bool
	then   func() // after the failure is answered
}

func (f *failOnce) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if enginetest.IsGeneration(r.URL.Path) && r.Header.Get(engine.GenerationHeader) != "" {
		f.mu.Lock()
		first := !f.failed
		f.failed = true
		f.mu.Unlock()
		if first {
			http.Error(w, `{"error":"the test's engine failure"}`, http.StatusInternalServerError)
			f.then()
			return
		}
	}
	f.next.ServeHTTP(w, r)
}

// TestAGenerationHandedBackIsRecordedAsWhatItWas: a turn's generation
// failed, and the next attempt's reads went unanswered: the request was
// handed back. Its redelivery to the same instance took the turn over from
// itself, recording that the holder "no longer generates it". The
// generation it sends again is recorded now for what it is: one sent
// again after the engine failed.
func TestAGenerationHandedBackIsRecordedAsWhatItWas(t *testing.T) {
	const n = 13
	b, eng, ctx := oneEpisode(t, n)
	stall := unanswered(t)
	sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	f := &failOnce{next: eng, then: func() { stall(2) }}
	sess.Roles[schema.RolePlanner] = schema.RoleInfo{Engine: schema.Engine{URL: enginetest.Start(t, f), Protocol: engine.ProtocolSGLang}, WeightVersion: "planner-v1"}
	if _, _, err := bus.Mutate(ctx, b.Sessions, schema.SessionKey(n), func(v *schema.Session, _ bool) (bool, error) {
		*v = sess
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}

	runTurn(t, ctx, b, n)

	if got := eng.Counts().Turns(); got["13-0-t1"] != 1 {
		t.Errorf("the engine generated %v after its failure, want turn 13-0-t1 once", got)
	}
	c := turnClaim(t, b, n)
	if len(c.Retries) != 1 || !strings.HasPrefix(c.Retries[0].Why, "the engine failed") || c.Retries[0].From != c.Holder {
		t.Errorf("the claim records retries %+v; want one, by its holder, after the engine failed", c.Retries)
	}
}
