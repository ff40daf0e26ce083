package web_test

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/stacktest"
	"github.com/planact/planact/internal/web"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/view"
)

// TestEventsOutliveASilentServer: a page follows a rollout the view reads
// again from the streams (it dropped its episodes from memory) while NATS
// does not answer (a restart, a partition): its events stream says it is
// stalled, stays open, and sends the rollout once NATS answers again.
// Before, the first read that went unanswered ended the stream (a 500, or
// a "failure" event), and the page stopped following for good: an
// EventSource does not connect again after either.
func TestEventsOutliveASilentServer(t *testing.T) {
	env := stacktest.Start(t, sim.Config{Seed: 1}, sim.Config{Seed: 2})
	for n := int64(1); n <= 2; n++ {
		env.Begin(t, n, stacktest.Tasks(2, 1, n), nil)
		env.Wait(t, n)
	}
	proxy := bustest.StartProxy(t, env.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := view.OpenWith(ctx, bustest.Conn(t, proxy.URL), view.Options{KeepFull: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if err := r.Synced(ctx); err != nil {
		t.Fatal(err)
	}
	// Rollout 1 is compacted once a read of it needs the streams (one with
	// a context that has ended fails).
	ended, end := context.WithCancel(context.Background())
	end()
	for {
		if _, err := r.RolloutContext(ended, 1, view.Filter{}); err != nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("rollout 1 was never compacted")
		case <-time.After(20 * time.Millisecond):
		}
	}
	srv := httptest.NewServer(web.NewWithReadTimeout(r, 300*time.Millisecond))
	t.Cleanup(srv.Close)

	proxy.Freeze()
	thawed := false
	defer func() {
		if !thawed {
			proxy.Thaw()
		}
	}()
	req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/rollouts/1/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); res.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("events of rollout 1 while NATS is silent: %d %s; want the stream opened", res.StatusCode, ct)
	}
	lines := bufio.NewReader(res.Body)
	next := func() string {
		t.Helper()
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatalf("events stream ended: %v", err)
		}
		return strings.TrimSuffix(line, "\n")
	}
	if line := next(); line != "event: stalled" {
		t.Fatalf("first line %q, want event: stalled", line)
	}
	if line := next(); !strings.Contains(line, "deadline exceeded") {
		t.Errorf("stalled event %q: want why (the read's deadline passed)", line)
	}
	proxy.Thaw()
	thawed = true
	for {
		line := next()
		if strings.HasPrefix(line, "event: failure") {
			t.Fatalf("stream failed: %s %s", line, next())
		}
		if strings.HasPrefix(line, "data: ") {
			if !strings.Contains(line, `"rollout":1`) || !strings.Contains(line, `"episode_list":[{`) {
				t.Fatalf("first data once NATS answers: %.300s; want rollout 1 with its episodes", line)
			}
			return
		}
	}
}
