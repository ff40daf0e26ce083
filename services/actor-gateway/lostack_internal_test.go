package actorgateway

import (
	"context"
	"encoding/json"
	"sync/atomic"
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

// A retry whose record was stored but whose ack was lost is sent again by
// the publish; a single server then refuses it as after another message
// (it checks the last sequence before the duplicate window): that message
// is the record itself. The retry is recorded once, not twice (before, the
// gateway read its own record and added the retry again: the act's
// outcome said two retries of one generation).
func TestARetryWhoseAckWasLostIsRecordedOnce(t *testing.T) {
	var calls atomic.Int32
	real := publishRetries
	publishRetries = func(ctx context.Context, b *bus.Bus, rec *schema.ActRetries, filter string, after uint64) (bool, error) {
		if calls.Add(1) == 1 {
			if _, err := real(ctx, b, rec, filter, after); err != nil { // stored; its ack lost
				return false, err
			}
		}
		return real(ctx, b, rec, filter, after)
	}
	defer func() { publishRetries = real }()

	hold := make(chan struct{})
	eng := enginetest.New(sim.New(sim.Config{Role: schema.RoleActor}), enginetest.Options{Hold: hold})
	engURL := enginetest.Start(t, eng)
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "gateway")
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
	req := &schema.ActorRequest{Rollout: 1, Key: "t1-s1", Engine: schema.Engine{URL: engURL}, Prompt: "Tool: search\nInput: x", Try: 1,
		Sampling: schema.Sampling{MaxNewTokens: 8}, DeadlineMs: time.Now().Add(time.Minute).UnixMilli()}
	body, err := schema.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	r := schema.Retry{By: "replica-A", Why: "no actor-gateway acknowledged the request for 3s", AtMs: 2}
	h, _ := json.Marshal(r)
	var got *nats.Msg
	for deadline := time.Now().Add(10 * time.Second); got == nil; time.Sleep(20 * time.Millisecond) {
		inbox := nc.NewRespInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		m := &nats.Msg{Subject: schema.ActorSubject, Reply: inbox, Header: nats.Header{}, Data: body}
		m.Header.Set(schema.HdrActorProgress, "1")
		m.Header.Set(schema.HdrActorSend, "2")
		m.Header.Set(schema.HdrActorRetry, string(h))
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		if a, err := sub.NextMsg(5 * time.Second); err == nil && a.Header.Get("Status") != "503" {
			got = a
		} else if time.Now().After(deadline) {
			t.Fatalf("no answer: %v", err)
		}
		_ = sub.Unsubscribe()
	}
	if p := got.Header.Get(schema.HdrActorProgress); p != schema.ActorStarted {
		t.Fatalf("answer %v, want started", got.Header)
	}
	m, err := b.LastMsg(context.Background(), bus.StreamAct, subject.ActOf(1, 0, "t1-s1"))
	if err != nil || m == nil {
		t.Fatalf("the act's retries on the ACT stream: %v, %v", m, err)
	}
	var rec schema.ActRetries
	if err := m.Decode(&rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Retries) != 1 || rec.Retries[0] != r {
		t.Errorf("recorded %+v, want the retry once", rec.Retries)
	}
}
