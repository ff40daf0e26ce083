package actorgateway

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/enginetest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// A pause in abort mode that comes while a retry is being recorded, before
// its generation, aborts it like one that comes while it waits for a slot:
// its callers are told 423 (send it again after the resume), and the
// act-dispatcher sends the try again after the resume, no attempt lost.
// It was answered 503 ("could not be recorded … context canceled"), an
// error that cost the act an attempt, and its last one failed the act
// because of a pause.
func TestAPauseWhileARetryIsRecordedAnswersPaused(t *testing.T) {
	hold := make(chan struct{})
	eng := enginetest.New(sim.New(sim.Config{Role: schema.RoleActor}), enginetest.Options{Hold: hold})
	engURL := enginetest.Start(t, eng)
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "gateway")

	var calls atomic.Int32
	real := publishRetries
	publishRetries = func(ctx context.Context, pb *bus.Bus, rec *schema.ActRetries, filter string, after uint64) (bool, error) {
		if calls.Add(1) == 1 {
			// The pause comes now: the gate aborts what entered it.
			_, _, err := bus.Mutate(context.Background(), pb.Sessions, schema.RoleKey(schema.RoleActor), func(v *schema.RoleState, _ bool) (bool, error) {
				*v = schema.RoleState{Role: schema.RoleActor, Paused: true, Mode: schema.PauseAbort, Epoch: 1}
				return true, nil
			})
			if err != nil {
				return false, err
			}
			select {
			case <-ctx.Done():
			case <-time.After(30 * time.Second):
				t.Error("the pause did not abort the generation recording its retry")
			}
		}
		return real(ctx, pb, rec, filter, after)
	}
	defer func() { publishRetries = real }()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Deps{Bus: b, Log: bustest.Logger(), Engines: &engine.Pool{}}) }()
	t.Cleanup(func() {
		close(hold)
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	nc := bustest.Conn(t, url)
	req := &schema.ActorRequest{Rollout: 1, Key: "t1-s1", Engine: schema.Engine{URL: engURL}, Prompt: "Tool: search\nInput: x", Try: 2,
		Sampling: schema.Sampling{MaxNewTokens: 8}, DeadlineMs: time.Now().Add(time.Minute).UnixMilli()}
	body, err := schema.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := json.Marshal(schema.Retry{By: "replica-A", Why: "no actor-gateway acknowledged the request for 3s", AtMs: 2})
	var got *nats.Msg
	for deadline := time.Now().Add(time.Minute); got == nil; time.Sleep(20 * time.Millisecond) {
		inbox := nc.NewRespInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		m := &nats.Msg{Subject: schema.ActorSubject, Reply: inbox, Header: nats.Header{}, Data: body}
		m.Header.Set(schema.HdrActorRetry, string(h))
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		if a, err := sub.NextMsg(40 * time.Second); err == nil && a.Header.Get("Status") != "503" {
			got = a
		} else if time.Now().After(deadline) {
			t.Fatalf("no answer: %v", err)
		}
		_ = sub.Unsubscribe()
	}
	if code, desc := got.Header.Get(micro.ErrorCodeHeader), got.Header.Get(micro.ErrorHeader); code != CodePaused {
		t.Errorf("answer %q (%s), want %s: aborted by the pause", code, desc, CodePaused)
	}
	if n := eng.Counts().Paths["/generate"]; n != 0 {
		t.Errorf("the engine took %d generations of a try the pause aborted", n)
	}
}
