package plannergateway

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestAClaimIsHeldWhileItIsWritten: another instance asks the holder of a
// claim whether it still generates the turn before it takes the turn over.
// The holder marked the turn held only after its claim's write returned,
// so a question in between was answered no, and the asker generated the
// turn beside it. The mark now comes before the write.
func TestAClaimIsHeldWhileItIsWritten(t *testing.T) {
	_, url := bustest.Server(t)
	s := &Service{Deps: Deps{Bus: bustest.Bus(t, url, "planner-gateway-test")}, id: "me", held: map[string]int{}}
	req := &schema.PlanRequest{Rollout: 3, Episode: 1, Turn: 2}
	tn := &turn{key: schema.ClaimKey(req.Rollout, req.Episode, req.Turn)}
	var heldThen []bool
	orig := claimWritten
	claimWritten = func() {
		s.mu.Lock()
		heldThen = append(heldThen, s.held[tn.key] > 0)
		s.mu.Unlock()
	}
	t.Cleanup(func() { claimWritten = orig })
	if served, err := s.claim(context.Background(), req, tn); err != nil || served || !tn.holding {
		t.Fatalf("claim: served %v, holding %v, %v", served, tn.holding, err)
	}
	if len(heldThen) != 1 || !heldThen[0] {
		t.Errorf("held as the claim's write returned: %v; want true (a holds request then is answered yes)", heldThen)
	}
	s.release(tn, true)
	if s.held[tn.key] > 0 {
		t.Error("still held after its release")
	}
}

// logSignal closes seen when a log line holds want.
type logSignal struct {
	want string
	once sync.Once
	seen chan struct{}
}

func (w *logSignal) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// TestATakeOverKeepsItsMarkWhenAnotherHandlerLetsGo: two handlers of one
// instance claim the same turn (its request delivered again). B marks the
// turn and writes its claim, which fails (the claim exists); A, which
// found the holder no longer generating it, marks it and takes it over;
// then B takes its mark back. The marks were one flag, and B's took A's
// with it: A generated the turn while this instance answered that it did
// not, and B (asking itself) took the turn over from A and generated it
// beside it. Marks are counted now: B waits for A's output.
func TestATakeOverKeepsItsMarkWhenAnotherHandlerLetsGo(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planner-gateway-test")
	s := &Service{Deps: Deps{Bus: b}, id: "me", replica: "me-0", held: map[string]int{}}
	req := &schema.PlanRequest{Rollout: 3, Episode: 1, Turn: 1}
	key := schema.ClaimKey(req.Rollout, req.Episode, req.Turn)
	ctx := context.Background()
	if _, err := bus.Create(ctx, b.Runs, key, &schema.Claim{Rollout: 3, Episode: 1, Turn: 1, Holder: "old", Replica: "old-0"}); err != nil {
		t.Fatal(err)
	}

	bIn, releaseB, bTookOver := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	writes := 0
	orig := claimWritten
	claimWritten = func() {
		mu.Lock()
		writes++
		n := writes
		mu.Unlock()
		switch n {
		case 2: // B's claim, refused: B holds its mark
			close(bIn)
			<-releaseB
		case 3: // A's take-over, written: B takes its mark back now
			close(releaseB)
		case 4: // B's take-over
			close(bTookOver)
		}
	}
	t.Cleanup(func() { claimWritten = orig })

	// B's handler starts when A asks the old holder; the old holder
	// answers no once B marked the turn.
	bLog := &logSignal{want: "waiting for its output", seen: make(chan struct{})}
	bctx, stopB := context.WithCancel(zerolog.New(bLog).WithContext(ctx))
	bDone := make(chan struct{})
	var startB sync.Once
	sub, err := b.NC.Subscribe(holdsSubject("old"), func(m *nats.Msg) {
		startB.Do(func() {
			go func() {
				defer close(bDone)
				tb := &turn{key: key}
				_, _ = s.claim(bctx, req, tb)
				s.release(tb, true)
			}()
		})
		<-bIn
		_ = m.Respond([]byte("no"))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	ta := &turn{key: key}
	if served, err := s.claim(ctx, req, ta); err != nil || served || !ta.holding {
		t.Fatalf("A's claim: served %v, holding %v, %v", served, ta.holding, err)
	}
	select {
	case <-bLog.seen:
	case <-bTookOver:
		t.Error("B took the turn over from A, which generates it: the turn is generated twice")
	}
	if yes, _, _ := s.holds(ctx, s.id, key); !yes {
		t.Error("this instance answers that it does not generate the turn A holds")
	}
	stopB()
	<-bDone
	s.release(ta, true)
	if len(s.held) != 0 {
		t.Errorf("marks left after every handler let go: %v", s.held)
	}
}
