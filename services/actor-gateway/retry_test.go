package actorgateway_test

import (
	"context"
	"encoding/json"
	"strings"
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
	"github.com/planact/planact/pkg/subject"
	actorgateway "github.com/planact/planact/services/actor-gateway"
)

// retryGateway runs a gateway in front of a counting engine that holds
// every generation until hold is closed.
func retryGateway(t *testing.T, hold chan struct{}) (*enginetest.Engine, string, *bus.Bus, *nats.Conn) {
	t.Helper()
	eng := enginetest.New(sim.New(sim.Config{Role: schema.RoleActor}), enginetest.Options{Hold: hold})
	engURL := enginetest.Start(t, eng)
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "gateway")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- actorgateway.Run(ctx, actorgateway.Deps{Bus: b, Log: bustest.Logger(), Engines: &engine.Pool{}})
	}()
	t.Cleanup(func() {
		close(hold)
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return eng, engURL, b, bustest.Conn(t, url)
}

// ask sends req with header h (the retry it is, when set) and returns the
// gateway's first answer, sending again while the gateway is not
// subscribed yet.
func ask(t *testing.T, nc *nats.Conn, req *schema.ActorRequest, h string) *nats.Msg {
	t.Helper()
	body, err := schema.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		inbox := nc.NewRespInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		m := &nats.Msg{Subject: schema.ActorSubject, Reply: inbox, Header: nats.Header{}, Data: body}
		m.Header.Set(schema.HdrActorProgress, "1")
		m.Header.Set(schema.HdrActorSend, "2")
		if h != "" {
			m.Header.Set(schema.HdrActorRetry, h)
		}
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		got, err := sub.NextMsg(5 * time.Second)
		_ = sub.Unsubscribe()
		if err == nil && got.Header.Get("Status") != "503" {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer: %v", err)
		}
	}
}

func retryRequest(engURL string) *schema.ActorRequest {
	return &schema.ActorRequest{Rollout: 1, Key: "t1-s1", Engine: schema.Engine{URL: engURL}, Prompt: "Tool: search\nInput: x", Try: 1,
		Sampling: schema.Sampling{MaxNewTokens: 8}, DeadlineMs: time.Now().Add(time.Minute).UnixMilli()}
}

// A new generation of a request that says it is a retry is recorded as
// one on the ACT stream (act.N.retries.E.K, every retry of the act) before
// it is acknowledged and its engine called: the act's outcome, whichever
// runner of the act publishes it first, carries it. Before, only the
// runner that sent the retry knew of it, and lost it when another runner's
// outcome came first.
func TestARetryIsRecordedBeforeItsGeneration(t *testing.T) {
	hold := make(chan struct{})
	eng, engURL, b, nc := retryGateway(t, hold)
	ctx := context.Background()
	// A retry of the act recorded already, by another gateway.
	first := schema.Retry{By: "replica-B", From: "gateway-0", Why: "actor-gateway gateway-0 answered nothing for 6s", AtMs: 1}
	if stored, _, err := b.PublishAfter(ctx, &schema.ActRetries{Rollout: 1, Key: "t1-s1", Retries: []schema.Retry{first}, Gateway: "gateway-0", Try: 1},
		subject.ActOf(1, 0, "t1-s1"), 0); err != nil || !stored {
		t.Fatalf("the first retry: %v, %v", stored, err)
	}
	r := schema.Retry{By: "replica-A", Why: "no actor-gateway acknowledged the request for 3s", AtMs: 2}
	h, _ := json.Marshal(r)
	got := ask(t, nc, retryRequest(engURL), string(h))
	if p := got.Header.Get(schema.HdrActorProgress); p != schema.ActorStarted {
		t.Fatalf("answer %v, want started", got.Header)
	}
	m, err := b.LastMsg(ctx, bus.StreamAct, subject.ActRetries(1, 0, "t1-s1"))
	if err != nil || m == nil {
		t.Fatalf("the act's retries on the ACT stream: %v, %v", m, err)
	}
	var rec schema.ActRetries
	if err := m.Decode(&rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Retries) != 2 || rec.Retries[0] != first || rec.Retries[1] != r || rec.Try != 1 || rec.Gateway == "" {
		t.Errorf("recorded %+v, want the first retry and this one, by this gateway for try 1", rec)
	}
	if rec.Turn != 1 || m.Header.Get(schema.HdrTurn) != "1" {
		// Every message of the ACT stream says its turn (the contract's
		// headers: TestHeadersAndDecode).
		t.Errorf("the record's turn %d, header %s %q: want turn 1 of key t1-s1", rec.Turn, schema.HdrTurn, m.Header.Get(schema.HdrTurn))
	}
	for deadline := time.Now().Add(30 * time.Second); eng.Counts().Held < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the retry did not reach the engine")
		}
	}
}

// A retry that reaches a gateway once the act has an outcome (another
// runner's, published first) is not generated: the outcome counts, and a
// generation now could be in no outcome. A retry header that is not a
// retry is refused, naming the header.
func TestNoRetryOfAnActThatHasAnOutcome(t *testing.T) {
	hold := make(chan struct{})
	eng, engURL, b, nc := retryGateway(t, hold)
	ctx := context.Background()
	if _, err := b.PublishOnce(ctx, &schema.ActDone{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-s1", NodeID: "s1", Tool: "search", Input: "x", Status: schema.ActDoneOK, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name, header, code, says string
	}{
		{"a retry", `{"by":"replica-A","why":"no actor-gateway acknowledged the request for 3s","at_ms":2}`, schema.ActorCodeDone, "has an outcome"},
		{"not a retry", `{"by":`, schema.ActorCodeInvalid, schema.HdrActorRetry},
		{"a retry without why", `{"by":"replica-A"}`, schema.ActorCodeInvalid, "no why"},
	} {
		req := retryRequest(engURL)
		req.Try = i + 1 // a try of its own: the gateway keeps each try's answer
		got := ask(t, nc, req, tc.header)
		if code, desc := got.Header.Get(micro.ErrorCodeHeader), got.Header.Get(micro.ErrorHeader); code != tc.code || !strings.Contains(desc, tc.says) {
			t.Errorf("%s: answer %q %q, want %s saying %q", tc.name, code, desc, tc.code, tc.says)
		}
	}
	if n := eng.Counts().Paths["/generate"]; n != 0 {
		t.Errorf("the engine took %d generations of an act with an outcome", n)
	}
}
