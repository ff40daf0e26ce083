package session_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
)

// TestFollowerForgetsRolloutsGoneWhileTheWatchWasDown: a running rollout
// whose session went while the sessions watch was down (its delete marker
// expired, or it was purged) is not in the values the watch replays when
// it starts again, and no update ever says it is gone: Running listed it
// for ever, and the act-dispatcher's watchdog kept probing its episodes.
// Now it is forgotten; a session written during the restart is kept.
func TestFollowerForgetsRolloutsGoneWhileTheWatchWasDown(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	orig := b.Sessions
	kv := bustest.Restartable(orig.KeyValue)
	watched := *orig
	watched.KeyValue = kv
	b.Sessions = &watched
	ctx, cancel := context.WithCancel(context.Background())
	f := session.NewFollower(b, bustest.Logger())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	run := func(n int64) {
		t.Helper()
		if _, _, err := bus.Mutate(ctx, orig, schema.SessionKey(n), func(v *schema.Session, _ bool) (bool, error) {
			*v = schema.Session{Rollout: n, State: schema.SessionRunning, Episodes: 1}
			return true, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	running := func() []int64 {
		var ns []int64
		for _, s := range f.Running() {
			ns = append(ns, s.Rollout)
		}
		slices.Sort(ns)
		return ns
	}
	waitFor := func(what string, n int64) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !slices.Contains(running(), n); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: rollout %d never listed as running (%v)", what, n, running())
			}
		}
	}
	const gone, kept, born, after = 1, 2, 3, 4
	run(gone)
	run(kept)
	<-kv.Started
	waitFor("before the restart", gone)
	waitFor("before the restart", kept)

	up := kv.Stop()
	if err := b.Purge(ctx, "KV_"+bus.BucketSession, "$KV."+bus.BucketSession+"."+schema.SessionKey(gone)); err != nil {
		t.Fatal(err)
	}
	run(born)
	up()
	<-kv.Started
	// Written once the watch is up again: it comes after the replay.
	run(after)
	waitFor("after the restart", after)
	if got, want := running(), []int64{kept, born, after}; !slices.Equal(got, want) {
		t.Errorf("running after the restart: %v; want %v (rollout %d's session is gone)", got, want, gone)
	}
}
