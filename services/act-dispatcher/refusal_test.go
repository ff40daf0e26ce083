package actdispatcher

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/planact/planact/pkg/schema"
)

// A request sent again to any gateway (the first copy taken, and then
// nothing heard) that a gateway answers 503 without starting anything (it
// could not record the retry) ends the attempt; the first copy may still
// be generating on the gateway that took it. The act's next try is then a
// retry when a gateway starts it: it carries the retry, and the outcome
// records it. Before, the 503 dropped it, and the next try started with
// none (a runner that took the turn over, answered from the first
// generation, published an outcome that explained one engine call of two).
func TestARetryOutstandingSurvivesAGatewaysRefusal(t *testing.T) {
	t.Parallel()
	s, url := testService(t)
	info := testInfo()
	var mu sync.Mutex
	retryOfTry2 := ""
	fakeGateway(t, url, func(nc *nats.Conn, copies []*nats.Msg) {
		m := copies[len(copies)-1]
		var req schema.ActorRequest
		if err := schema.Unmarshal(m.Data, &req); err != nil {
			t.Errorf("request: %v", err)
			return
		}
		r := &nats.Msg{Subject: m.Reply, Header: nats.Header{}}
		r.Header.Set(schema.HdrActorGateway, "fake")
		switch {
		case req.Try == 1 && len(copies) == 1:
			// Taken, and then silent: generating, its words lost.
		case req.Try == 1:
			r.Header.Set(micro.ErrorCodeHeader, schema.ActorCodeUnavailable)
			r.Header.Set(micro.ErrorHeader, "the retry could not be recorded before its generation")
			_ = nc.PublishMsg(r)
		default:
			mu.Lock()
			retryOfTry2 = m.Header.Get(schema.HdrActorRetry)
			mu.Unlock()
			ack(nc, m, schema.ActorStarted, true)
			r.Data, _ = schema.Marshal(&schema.ActorReply{Generation: schema.Generation{Text: "x is 1"}})
			_ = nc.PublishMsg(r)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := &act{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-a", Node: search("a", "x")}
	d, err := s.execute(ctx, info, a)
	if err != nil || d == nil || d.Status != schema.ActDoneOK {
		t.Fatalf("execute: %+v, %v", d, err)
	}
	if d.Attempts != 2 {
		t.Fatalf("%d attempts, want 2: the test does not set up what it means to", d.Attempts)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(retryOfTry2, "no actor-gateway acknowledged") {
		t.Errorf("try 2 carried retry %q, want the one outstanding when the 503 came", retryOfTry2)
	}
	if len(d.Retries) != 1 || !strings.Contains(d.Retries[0].Why, "no actor-gateway acknowledged") {
		t.Errorf("retries %+v, want the one sent again to any gateway, recorded by try 2", d.Retries)
	}
}

// A runner that takes a turn over while its predecessor still runs it (the
// plan message delivered again elsewhere after a NATS restart lost its
// progress signals) attaches to the predecessor's generation of try 1.
// When that try fails, both runners ask for try 2, and the gateway that
// starts it from this runner's request may be another than the one the
// predecessor's reaches: the rerun stays outstanding past the attachment,
// and try 2 records it. Before, the attachment consumed it, and try 2
// started with none (three engine calls, an outcome of two attempts
// explaining two).
func TestARerunStaysOutstandingPastAnAttachedTry(t *testing.T) {
	t.Parallel()
	s, url := testService(t)
	info := testInfo()
	var mu sync.Mutex
	retryOfTry2 := ""
	fakeGateway(t, url, func(nc *nats.Conn, copies []*nats.Msg) {
		m := copies[len(copies)-1]
		var req schema.ActorRequest
		if err := schema.Unmarshal(m.Data, &req); err != nil {
			t.Errorf("request: %v", err)
			return
		}
		r := &nats.Msg{Subject: m.Reply, Header: nats.Header{}}
		r.Header.Set(schema.HdrActorGateway, "fake")
		if req.Try == 1 {
			// The predecessor's generation of try 1 runs here, and fails.
			ack(nc, m, schema.ActorAttached, true)
			r.Header.Set(micro.ErrorCodeHeader, "500")
			r.Header.Set(micro.ErrorHeader, "engine restarting")
			_ = nc.PublishMsg(r)
			return
		}
		mu.Lock()
		retryOfTry2 = m.Header.Get(schema.HdrActorRetry)
		mu.Unlock()
		ack(nc, m, schema.ActorStarted, true)
		r.Data, _ = schema.Marshal(&schema.ActorReply{Generation: schema.Generation{Text: "x is 1"}})
		_ = nc.PublishMsg(r)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := &act{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-a", Node: search("a", "x"), rerun: "released by an earlier runner of the turn, which is gone"}
	d, err := s.execute(ctx, info, a)
	if err != nil || d == nil || d.Status != schema.ActDoneOK {
		t.Fatalf("execute: %+v, %v", d, err)
	}
	if d.Attempts != 2 {
		t.Fatalf("%d attempts, want 2: the test does not set up what it means to", d.Attempts)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(retryOfTry2, "earlier runner") {
		t.Errorf("try 2 carried retry %q, want the rerun", retryOfTry2)
	}
	if len(d.Retries) != 1 || !strings.Contains(d.Retries[0].Why, "earlier runner") {
		t.Errorf("retries %+v, want the rerun, recorded by try 2, which started a generation", d.Retries)
	}
}
