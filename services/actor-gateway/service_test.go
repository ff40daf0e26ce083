package actorgateway_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	actorgateway "github.com/planact/planact/services/actor-gateway"
)

// TestDeadlineFreesTheEngineSlot: when the caller's deadline passes, the
// gateway abandons a hung generation, so the engine's slot is free again.
func TestDeadlineFreesTheEngineSlot(t *testing.T) {
	var started, cancelled atomic.Int64
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // so that the server notices the client leaving
		if r.URL.Path == "/tokenize" {
			w.Write([]byte(`{"tokens":[1,2,3]}`))
			return
		}
		started.Add(1)
		<-r.Context().Done()
		cancelled.Add(1)
	}))
	defer hung.Close()

	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "gateway")
	pool := &engine.Pool{Limit: 1}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- actorgateway.Run(ctx, actorgateway.Deps{Bus: b, Log: bustest.Logger(), Engines: pool}) }()

	caller := bustest.Conn(t, url)
	req := &schema.ActorRequest{Rollout: 1, Key: "t1-s1", Engine: schema.Engine{URL: hung.URL}, Prompt: "Tool: search\nInput: x",
		Sampling: schema.Sampling{MaxNewTokens: 8}, DeadlineMs: time.Now().Add(300 * time.Millisecond).UnixMilli()}
	body, err := schema.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		reply, err := caller.Request(schema.ActorSubject, body, 5*time.Second)
		if err == nil {
			if code := reply.Header.Get(micro.ErrorCodeHeader); code != actorgateway.CodeTimeout {
				t.Fatalf("reply to a hung generation: code %q, want %s (%s)", code, actorgateway.CodeTimeout, reply.Header.Get(micro.ErrorHeader))
			}
			break
		}
		if time.Now().After(deadline) { // the service may not be registered yet
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for pool.InFlight("", hung.URL, "") != 0 || started.Load() == 0 || cancelled.Load() != started.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("slot still held (%d in flight, %d generations started, %d cancelled)", pool.InFlight("", hung.URL, ""), started.Load(), cancelled.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
