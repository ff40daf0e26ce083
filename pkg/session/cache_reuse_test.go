package session_test

import (
	"context"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
)

// TestCacheNeverDropsWorkOnAnEarlierRolloutsEnd: a state that is not
// running makes a service drop the rollout's work, so it is never served
// from the cache. It was, for Fresh: a rollout number used again (a new
// training run, once the earlier run's session is gone) read as the
// earlier rollout's end, and the new rollout's plan requests and acts were
// dropped as "rollout over".
func TestCacheNeverDropsWorkOnAnEarlierRolloutsEnd(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	// Fresh long enough that only a cache that never serves an ended
	// state passes, however slow the machine.
	c := &session.Cache{KV: b.Sessions, Fresh: time.Hour}
	if _, err := bus.Create(ctx, b.Sessions, schema.SessionKey(6), &schema.Session{Rollout: 6, State: schema.SessionDone, Episodes: 1, CreatedMs: 1000}); err != nil {
		t.Fatal(err)
	}
	if info, err := c.Get(ctx, 6); err != nil || info.Active() {
		t.Fatalf("the earlier rollout 6: %v %v; want it read as over", info, err)
	}
	if err := b.Sessions.Delete(ctx, schema.SessionKey(6)); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Create(ctx, b.Sessions, schema.SessionKey(6), &schema.Session{Rollout: 6, State: schema.SessionRunning, Episodes: 1, CreatedMs: 2000}); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Create(ctx, b.Sessions, schema.TasksKey(6), &schema.TaskList{Tasks: []schema.Task{{Prompt: "this run's question"}}}); err != nil {
		t.Fatal(err)
	}
	info, err := c.Get(ctx, 6)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Active() || info.Session.CreatedMs != 2000 || len(info.Tasks) != 1 || info.Tasks[0].Prompt != "this run's question" {
		t.Fatalf("the new rollout 6 read as %v (created %d, tasks %v): its work would be dropped", info, info.Session.CreatedMs, info.Tasks)
	}
	// A running rollout is still served from the cache.
	again, err := c.Get(ctx, 6)
	if err != nil || again != info {
		t.Errorf("a running rollout read again within Fresh: %v %v; want the cached info", again, err)
	}
}
