package sessionstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/telemetry"
)

// TestSweepForgetsSessionsGoneWhileTheWatchWasDown: a session whose key
// went while the sessions watch was down (its delete marker expired, or
// it was purged) is not in the values the watch replays when it starts
// again, and no update ever says it is gone. The sweep's index kept it
// for ever, and every sweep acted on it again: it "timed out" a rollout
// that no longer exists, counting a recovery and logging every 2 s. Now
// what the replay does not hold leaves the index; a session written
// during the restart is kept, and one written after it is followed.
func TestSweepForgetsSessionsGoneWhileTheWatchWasDown(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	var logs lockedLog
	s.Log = telemetry.NewLogger(&logs, telemetry.LogOptions{Level: "debug"})
	orig := s.Bus.Sessions
	kv := bustest.Restartable(orig.KeyValue)
	watched := *orig
	watched.KeyValue = kv
	s.Bus.Sessions = &watched
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Waiting for an hour: past its barrier deadline, the sweep times it out.
	long := s.Now().Add(-time.Hour).UnixMilli()
	write := func(n int64, created int64) {
		t.Helper()
		if _, _, err := bus.Mutate(ctx, orig, schema.SessionKey(n), func(v *schema.Session, _ bool) (bool, error) {
			*v = schema.Session{Rollout: n, State: schema.SessionWaiting, CreatedMs: created,
				Roles: map[string]schema.RoleInfo{schema.RolePlanner: {ArrivalID: fmt.Sprint("p", n)}}}
			return true, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	const gone, kept, born, after = 1, 2, 3, 4
	write(gone, long)
	write(kept, s.Now().UnixMilli())
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		st := &schema.RoleState{Role: role, Epoch: 1, Paused: true, Mode: schema.PauseWait, PauseID: "pause." + role,
			SinceMs: s.Now().UnixMilli(), DeadlineMs: s.Now().Add(time.Hour).UnixMilli()}
		if _, err := bus.Create(ctx, orig, schema.RoleKey(role), st); err != nil {
			t.Fatal(err)
		}
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		s.follow(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	<-kv.Started
	waitIndex(t, s, "both sessions and both roles", func(e map[int64]indexed, roles map[string]schema.RoleState) bool {
		return len(e) == 2 && len(roles) == 2
	})

	up := kv.Stop()
	// While no watch runs: one session and one role go without a trace,
	// one session is written again, one is created.
	for _, key := range []string{schema.SessionKey(gone), schema.RoleKey(schema.RoleActor)} {
		if err := s.Bus.Purge(ctx, "KV_"+bus.BucketSession, "$KV."+bus.BucketSession+"."+key); err != nil {
			t.Fatal(err)
		}
	}
	write(kept, long)
	write(born, long)
	up()
	<-kv.Started
	// Written once the watch is up again: followed, and it comes after
	// the replay ended.
	write(after, s.Now().UnixMilli())
	waitIndex(t, s, "the session written after the restart", func(e map[int64]indexed, _ map[string]schema.RoleState) bool {
		_, ok := e[after]
		return ok
	})

	s.index.mu.Lock()
	entries, roles := indexCopy(s.index)
	s.index.mu.Unlock()
	if _, ok := entries[gone]; ok {
		t.Errorf("rollout %d, gone while the watch was down, is still in the index", gone)
	}
	if e, ok := entries[kept]; !ok || e.sess.CreatedMs != long {
		t.Errorf("rollout %d, written again during the restart: %+v (%v); want what was written then", kept, e.sess, ok)
	}
	if _, ok := entries[born]; !ok {
		t.Errorf("rollout %d, created during the restart, is not in the index", born)
	}
	if _, ok := roles[schema.RoleActor]; ok {
		t.Errorf("the actor's state, gone while the watch was down, is still in the index")
	}
	if _, ok := roles[schema.RolePlanner]; !ok {
		t.Errorf("the planner's state is no longer in the index")
	}

	// The sweep leaves the rollout that is gone alone, at every pass.
	for range 3 {
		s.sweepOnce(ctx)
	}
	if k := strings.Count(logs.String(), fmt.Sprintf(`"rollout":%d,`, gone)); k != 0 {
		t.Errorf("the sweep logged %d times about rollout %d, which no longer exists:\n%s", k, gone, logs.String())
	}
	if _, _, found, err := bus.GetFresh[schema.Session](ctx, orig, schema.SessionKey(gone)); err != nil || found {
		t.Errorf("rollout %d: found %v (%v); want still gone", gone, found, err)
	}
}

func indexCopy(x *index) (map[int64]indexed, map[string]schema.RoleState) {
	e := make(map[int64]indexed, len(x.entries))
	for n, v := range x.entries {
		e[n] = v
	}
	r := make(map[string]schema.RoleState, len(x.roles))
	for k, v := range x.roles {
		r[k] = v
	}
	return e, r
}

// waitIndex polls the index until ok holds of it.
func waitIndex(t *testing.T, s *Service, what string, ok func(map[int64]indexed, map[string]schema.RoleState) bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s.index.mu.Lock()
		e, r := indexCopy(s.index)
		s.index.mu.Unlock()
		if ok(e, r) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the index never held %s: %d sessions, %d roles", what, len(e), len(r))
		}
	}
}

// lockedLog is a log written by several goroutines.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
