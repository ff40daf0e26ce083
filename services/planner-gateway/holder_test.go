package plannergateway

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/enginetest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
)

// otherHolder answers holds requests as planner-gateway instance id, which
// generates a turn: the first question it is asked publishes out (its
// output), and every answer is then "no" (it let the turn go). asked is
// closed at the first question.
func otherHolder(t *testing.T, b *bus.Bus, id string, out *schema.PlanOutput) (asked chan struct{}) {
	t.Helper()
	asked = make(chan struct{})
	var once sync.Once
	sub, err := b.NC.Subscribe(holdsSubject(id), func(m *nats.Msg) {
		once.Do(func() {
			if out != nil {
				if err := b.Publish(context.Background(), out); err != nil {
					t.Error(err)
				}
			}
			close(asked)
		})
		_ = m.Respond([]byte("no"))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return asked
}

// othersOutput is turn 1 of episode 0 of rollout n as another instance
// generated it.
func othersOutput(n int64) *schema.PlanOutput {
	return &schema.PlanOutput{Rollout: n, Episode: 0, Turn: 1, Text: "the other instance's plan", FinishReason: engine.FinishStop, WeightVersion: "planner-v1",
		Segments: []schema.Segment{{Kind: schema.SegGenerated, Turn: 1, Text: "the other instance's plan", Version: "planner-v1"}}}
}

// TestATurnTakenOverBeforeItsGenerationIsNotGenerated: an instance claimed
// a turn, then waited before its engine call (at the paused role's gate,
// for an engine's share) while NATS restarted; another instance, told
// nothing for the holder's patience, took the turn over and generated it.
// Only a generation sent again checked that the claim was still this
// instance's: the first was sent all the same, and the engine generated the
// turn twice, one of them by an instance that no longer held it. Every
// generation now checks the claim first: the request is handed back, and
// its redelivery waits for the holder's output.
func TestATurnTakenOverBeforeItsGenerationIsNotGenerated(t *testing.T) {
	const n = 41
	b, eng, ctx := oneEpisode(t, n)
	key := schema.ClaimKey(n, 0, 1)
	var once sync.Once
	orig := claimWritten
	claimWritten = func() {
		once.Do(func() {
			// Taken over right after this instance's claim was written.
			_, _, err := bus.Mutate(ctx, b.Runs, key, func(c *schema.Claim, exists bool) (bool, error) {
				c.Retries = append(c.Retries, schema.Retry{By: "other", From: c.Holder, Why: "the test's take-over", AtMs: time.Now().UnixMilli()})
				c.Holder, c.Replica = "other", "other-0"
				return true, nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(func() { claimWritten = orig })
	otherHolder(t, b, "other", othersOutput(n))

	out := runTurn(t, ctx, b, n)

	if got := eng.Counts().Turns(); len(got) != 0 {
		t.Errorf("the engine generated %v, want nothing: the turn was taken over before its generation", got)
	}
	if out.Text != othersOutput(n).Text {
		t.Errorf("the turn's output is %q, want the holder's", out.Text)
	}
	if c := turnClaim(t, b, n); c.Holder != "other" || len(c.Retries) != 1 {
		t.Errorf("the claim is %+v, want the other instance's, with its take-over only", c)
	}
}

// TestWhatAnInstanceLeftIsDroppedWhenItTakesTheTurnOver: an instance's
// handler handed its turn back after a generation (what it had of the turn
// kept for its redelivery); another instance took the turn over, and let it
// go; a handler of the first instance took it over from that one (a retry
// recorded), generated it and published the output. A copy of the request
// that came meanwhile then found its instance's claim idle, and took on the
// generation kept from before the take-over: a turn with its output was
// generated once more. A take-over now drops what its instance kept of the
// turn: the copy finds the output.
func TestWhatAnInstanceLeftIsDroppedWhenItTakesTheTurnOver(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planner-gateway-test")
	s := &Service{Deps: Deps{Bus: b}, id: "me", replica: "me-0", held: map[string]int{}, left: map[string]leftTurn{}}
	const n = 42
	req := &schema.PlanRequest{Rollout: n, Episode: 0, Turn: 1}
	key := schema.ClaimKey(n, 0, 1)
	ctx := context.Background()
	if _, err := bus.Create(ctx, b.Runs, key, &schema.Claim{Rollout: n, Episode: 0, Turn: 1, Holder: "other", Replica: "other-0",
		Retries: []schema.Retry{{By: "other", From: "me", Why: "holder me (me-0) no longer generates it"}}}); err != nil {
		t.Fatal(err)
	}
	// What the handler that handed the turn back left, before "other" took it over.
	s.left[key] = leftTurn{rollout: n, calls: 1, retry: "failed", retryWhy: "the engine failed: the test's"}
	otherHolder(t, b, "other", nil)

	held := &turn{key: key, rollout: n}
	if served, err := s.claim(ctx, req, held); err != nil || served || !held.holding {
		t.Fatalf("the take-over: served %v, holding %v, %v", served, held.holding, err)
	}
	if err := b.Publish(ctx, othersOutput(n)); err != nil { // (generated by this handler)
		t.Fatal(err)
	}
	s.release(held, true)

	cp := &turn{key: key, rollout: n}
	served, err := s.claim(ctx, req, cp)
	if err != nil || !served {
		t.Errorf("the copy: served %v (calls %d, retry %q), %v; want served: the turn has its output", served, cp.calls, cp.retryWhy, err)
	}
	s.release(cp, err == nil)
	if len(s.held) != 0 || len(s.left) != 0 {
		t.Errorf("marks %v and kept turns %v left after every handler let go", s.held, s.left)
	}
}

// takenOverWhileRefused answers a planner turn's first generation with a
// 400, after another instance ("other") took the turn over meanwhile.
type takenOverWhileRefused struct {
	next     http.Handler
	takeOver func()
	once     sync.Once
}

func (f *takenOverWhileRefused) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if enginetest.IsGeneration(r.URL.Path) && r.Header.Get(engine.GenerationHeader) != "" {
		refused := false
		f.once.Do(func() {
			refused = true
			f.takeOver()
		})
		if refused {
			http.Error(w, `{"error":"the test's refusal"}`, http.StatusBadRequest)
			return
		}
	}
	f.next.ServeHTTP(w, r)
}

// TestATurnTakenOverIsNotFailedByItsFormerHolder: an instance's generation
// of a turn was refused for good while another instance, told nothing by
// it for the holder's patience, took the turn over and generated it. The
// former holder published the turn's failure all the same: the turn had an
// error and an output, and the episode ended failed with a plan in hand. A
// holder checks its claim before it fails a turn now: taken over, the turn
// is the new holder's, and the request is handed back to wait for it.
func TestATurnTakenOverIsNotFailedByItsFormerHolder(t *testing.T) {
	const n = 43
	b, _, ctx := oneEpisode(t, n)
	sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	key := schema.ClaimKey(n, 0, 1)
	f := &takenOverWhileRefused{next: enginetest.New(sim.New(sim.Config{Role: schema.RolePlanner, WeightVersion: "planner-v1"}), enginetest.Options{}),
		takeOver: func() {
			_, _, err := bus.Mutate(ctx, b.Runs, key, func(c *schema.Claim, exists bool) (bool, error) {
				c.Retries = append(c.Retries, schema.Retry{By: "other", From: c.Holder, Why: "the test's take-over", AtMs: time.Now().UnixMilli()})
				c.Holder, c.Replica = "other", "other-0"
				return true, nil
			})
			if err != nil {
				t.Error(err)
			}
		}}
	sess.Roles[schema.RolePlanner] = schema.RoleInfo{Engine: schema.Engine{URL: enginetest.Start(t, f), Protocol: engine.ProtocolSGLang}, WeightVersion: "planner-v1"}
	if _, _, err := bus.Mutate(ctx, b.Sessions, schema.SessionKey(n), func(v *schema.Session, _ bool) (bool, error) {
		*v = sess
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	otherHolder(t, b, "other", othersOutput(n))

	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- Run(sctx, Deps{Bus: b, Log: bustest.TestLogger(t, "debug"), Engines: &engine.Pool{}, RetryBase: 10 * time.Millisecond})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	})
	if err := b.Publish(ctx, &schema.PlanRequest{Rollout: n, Episode: 0, Turn: 1, WeightVersion: "planner-v1"}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		pe, err := b.LastMsg(ctx, bus.StreamPlan, subject.PlanError(n, 0))
		if err != nil {
			t.Fatal(err)
		}
		if pe != nil {
			t.Fatalf("the turn failed (%s) after another instance took it over", pe.Data)
		}
		out, err := b.LastMsg(ctx, bus.StreamPlan, subject.PlanOut(n, 0))
		if err != nil {
			t.Fatal(err)
		}
		if out != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the turn has neither an output nor an error")
		}
	}
}

// TestATakeOverFromAHolderThatSentNothingIsNoRetry: a turn's claim was
// written but its ack lost (or its handler handed the request back before
// its engine call), and the request went to another instance. That one
// asked the holder, which answered that it no longer generates the turn,
// and recorded a retry (and counted one) of a turn nothing had generated.
// The holder now says it sent none of the turn's generations: the take-over
// records no retry. A holder that left a generation of the turn is still
// taken over with a retry; one that kept only the turn's failure, decided
// before any generation (its publish failed), sent none.
func TestATakeOverFromAHolderThatSentNothingIsNoRetry(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int64
		left    bool // the holder's handler sent a generation before it handed the turn back
		failed  bool // the holder's handler decided the turn's failure, with no generation sent, before it handed the turn back
		retries int
	}{
		{"nothing sent", 44, false, false, 0},
		{"a generation sent", 45, true, false, 1},
		{"a failure kept, nothing sent", 46, false, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, url := bustest.Server(t)
			b := bustest.Bus(t, url, "planner-gateway-test")
			holder := &Service{Deps: Deps{Bus: b}, id: "holder", replica: "holder-0", held: map[string]int{}, left: map[string]leftTurn{}}
			taker := &Service{Deps: Deps{Bus: b}, id: "taker", replica: "taker-0", held: map[string]int{}, left: map[string]leftTurn{}}
			sub, err := b.NC.Subscribe(holdsSubject(holder.id), holder.answerHolds)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			req := &schema.PlanRequest{Rollout: tc.n, Episode: 0, Turn: 1}
			key := schema.ClaimKey(tc.n, 0, 1)
			ctx := context.Background()
			if _, err := bus.Create(ctx, b.Runs, key, &schema.Claim{Rollout: tc.n, Episode: 0, Turn: 1, Holder: holder.id, Replica: holder.replica}); err != nil {
				t.Fatal(err)
			}
			if tc.left {
				held := &turn{key: key, rollout: tc.n, holding: true, calls: 1, retry: "failed", retryWhy: "the engine failed: the test's"}
				holder.mark(key)
				holder.release(held, false)
			}
			if tc.failed {
				held := &turn{key: key, rollout: tc.n, holding: true,
					failed: &schema.PlanError{Rollout: tc.n, Episode: 0, Turn: 1, ErrorKind: schema.PlanErrPlannerRejected, Message: "tokenize prompt: the test's refusal"}}
				holder.mark(key)
				holder.release(held, false)
			}

			tt := &turn{key: key, rollout: tc.n}
			if served, err := taker.claim(ctx, req, tt); err != nil || served || !tt.holding {
				t.Fatalf("the take-over: served %v, holding %v, %v", served, tt.holding, err)
			}
			taker.release(tt, true)
			c, _, _, err := bus.GetFresh[schema.Claim](ctx, b.Runs, key)
			if err != nil {
				t.Fatal(err)
			}
			if c.Holder != taker.id || len(c.Retries) != tc.retries {
				t.Errorf("the claim is %+v; want it the taker's, with %d retries", c, tc.retries)
			}
		})
	}
}
