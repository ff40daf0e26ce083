package sessionstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// newTestService is a session-store on b that handles nothing by itself:
// the test calls its functions.
func newTestService(b *bus.Bus) *Service {
	return &Service{Deps: Deps{Bus: b, Log: zerolog.Nop(), Now: time.Now, Grace: time.Second, SweepEvery: time.Second,
		InlineLimit: 1 << 20, ResultPatience: time.Minute}, index: newIndex(), taskCache: &taskCache{lists: map[int64]schema.TaskList{}}}
}

// TestPauseExpiresOnceAcrossReplicas: two session-store replicas whose
// sweeps find the same pause past its time-out at the same moment end it
// once: one compare-and-set writes the expiry (one new epoch), one message
// on control.actor.expired says so, and a pause resumed meanwhile is not
// expired at all.
func TestPauseExpiresOnceAcrossReplicas(t *testing.T) {
	_, url := bustest.Server(t)
	replicas := []*Service{newTestService(bustest.Bus(t, url, "ss-1")), newTestService(bustest.Bus(t, url, "ss-2"))}
	ctx := context.Background()
	kv := replicas[0].Bus.Sessions
	key := schema.RoleKey(schema.RoleActor)
	const rounds = 20
	for round := range rounds {
		now := time.Now().UnixMilli()
		st, _, err := bus.Mutate(ctx, kv, key, func(v *schema.RoleState, _ bool) (bool, error) {
			v.Role = schema.RoleActor
			v.Epoch++
			v.Paused, v.Mode, v.PauseID, v.SinceMs, v.DeadlineMs = true, schema.PauseWait, "pause.actor."+time.Now().String(), now-3000, now-1
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		ended := make([]*schema.PauseExpiry, len(replicas))
		gate := make(chan struct{})
		for i, s := range replicas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				x, err := s.expirePause(ctx, st)
				if err != nil {
					t.Error(err)
				}
				ended[i] = x
			}()
		}
		close(gate)
		wg.Wait()
		if (ended[0] == nil) == (ended[1] == nil) {
			t.Fatalf("round %d: replicas ended the pause %v and %v: want exactly one", round, ended[0] != nil, ended[1] != nil)
		}
		got, _, _, err := bus.GetFresh[schema.RoleState](ctx, kv, key)
		if err != nil {
			t.Fatal(err)
		}
		if got.Paused || got.Epoch != st.Epoch+1 || got.Expiry == nil || got.Expiry.Epoch != st.Epoch || !got.ExpiryAnnounced {
			t.Fatalf("round %d: role state %+v (expiry %+v): want not paused, epoch %d, the expiry of epoch %d announced", round, got, got.Expiry, st.Epoch+1, st.Epoch)
		}
		// Another sweep of both, later, finds nothing to do.
		for _, s := range replicas {
			if x, err := s.expirePause(ctx, st); x != nil || err != nil {
				t.Fatalf("round %d: a pause that had expired expired again: %+v %v", round, x, err)
			}
		}
	}
	if k := count(t, replicas[0].Bus, bus.StreamControl, subject.Control(schema.RoleActor, "expired")); k != rounds {
		t.Errorf("%d messages on control.actor.expired for %d expired pauses", k, rounds)
	}

	// A pause resumed before the sweep's write is not expired.
	now := time.Now().UnixMilli()
	st, _, err := bus.Mutate(ctx, kv, key, func(v *schema.RoleState, _ bool) (bool, error) {
		v.Epoch++
		v.Paused, v.PauseID, v.SinceMs, v.DeadlineMs = true, "pause.actor.last", now-3000, now-1
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := bus.Mutate(ctx, kv, key, func(v *schema.RoleState, _ bool) (bool, error) {
		v.Epoch++
		v.Paused, v.PauseID, v.SinceMs, v.DeadlineMs = false, "", 0, 0
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	if x, err := replicas[1].expirePause(ctx, st); x != nil || err != nil {
		t.Fatalf("a resumed pause expired: %+v %v", x, err)
	}
}

// count is the number of messages stream holds on subj.
func count(t *testing.T, b *bus.Bus, stream, subj string) uint64 {
	t.Helper()
	st, err := b.JS.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subj]
}

// TestExpiryAnnouncedAfterACrash: a replica that ended a pause and stopped
// before it said so leaves the expiry unannounced in the role's state; the
// sweep of any replica announces it, once.
func TestExpiryAnnouncedAfterACrash(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	at := time.Now().Add(-2 * s.Grace).UnixMilli()
	x := &schema.PauseExpiry{Epoch: 4, PauseID: "pause.actor.9", Mode: schema.PauseAbort, SinceMs: at - 3000, DeadlineMs: at, AtMs: at,
		Reason: "pause time-out (3s): no resume came"}
	st := &schema.RoleState{Role: schema.RoleActor, Epoch: 5, Expiry: x}
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.RoleKey(schema.RoleActor), st); err != nil {
		t.Fatal(err)
	}
	s.index.putRole(st)
	for range 2 {
		s.sweepOnce(ctx)
	}
	got, _, _, err := bus.GetFresh[schema.RoleState](ctx, s.Bus.Sessions, schema.RoleKey(schema.RoleActor))
	if err != nil || !got.ExpiryAnnounced || got.Epoch != 5 || got.Paused {
		t.Fatalf("after the sweep: %+v %v; want the expiry announced, nothing else changed", got, err)
	}
	m, err := s.Bus.LastMsg(ctx, bus.StreamControl, subject.Control(schema.RoleActor, "expired"))
	if err != nil || m == nil {
		t.Fatalf("control.actor.expired: %v", err)
	}
	var said schema.PauseExpired
	if err := schema.Unmarshal(m.Data, &said); err != nil || said.PauseExpiry != *x {
		t.Errorf("announced %+v (%v), want %+v", said, err, *x)
	}
	if k := count(t, s.Bus, bus.StreamControl, subject.Control(schema.RoleActor, "expired")); k != 1 {
		t.Errorf("%d announcements", k)
	}
}
