package actdispatcher

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/schema"
)

// A request no gateway acknowledged within the silence is sent again to
// any gateway as a retry (the gateway that took the first copy may be
// generating it, its acknowledgement lost). A gateway that refuses that
// copy because the actor role is paused starts nothing, and the act sends
// the same try again after the resume, no attempt counted: that send
// still carries the retry, so that a generation a gateway starts then is
// recorded as one. It was dropped with the exchange: the try's second
// generation went unrecorded.
func TestARetryOutstandingSurvivesARefusalWhilePaused(t *testing.T) {
	t.Parallel()
	_, url := bustest.Server(t)
	var mu sync.Mutex
	var carried []string
	fakeGateway(t, url, func(nc *nats.Conn, copies []*nats.Msg) {
		m := copies[len(copies)-1]
		mu.Lock()
		carried = append(carried, m.Header.Get(schema.HdrActorRetry))
		mu.Unlock()
		switch len(copies) {
		case 1: // taken; its acknowledgement is lost
		case 2: // refused: the role is paused
			r := &nats.Msg{Subject: m.Reply, Header: nats.Header{}}
			r.Header.Set(schema.HdrActorGateway, "fake")
			r.Header.Set(micro.ErrorCodeHeader, schema.ActorCodePaused)
			_ = nc.PublishMsg(r)
		default:
			ack(nc, m, schema.ActorStarted, true)
			answer(nc, m)
		}
	})
	s := &Service{Deps: Deps{Bus: bustest.Bus(t, url, "dispatcher")}}
	run := &act{Rollout: 1, Key: "t1-s1"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, acked, err := s.exchange(ctx, run, &nats.Msg{Header: nats.Header{}, Data: []byte("request")})
	if err != nil || acked || got.Header.Get(micro.ErrorCodeHeader) != schema.ActorCodePaused {
		t.Fatalf("exchange 1: %v, acknowledged %v, answer %v; want a refusal while paused, unacknowledged", err, acked, got)
	}
	if run.resend == nil || len(run.retries) != 0 {
		t.Fatalf("after a refusal while paused: outstanding %+v, recorded %+v; want the retry outstanding, none recorded", run.resend, run.retries)
	}
	got, _, err = s.exchange(ctx, run, &nats.Msg{Header: nats.Header{}, Data: []byte("request")})
	if err != nil || string(got.Data) != "answer" {
		t.Fatalf("exchange 2: %v, answer %v", err, got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(carried) != 3 || carried[0] != "" || carried[1] == "" || carried[2] != carried[1] {
		t.Fatalf("the requests carried %q; want none, then the retry twice", carried)
	}
	if len(run.retries) != 1 || !strings.Contains(run.retries[0].Why, "no actor-gateway acknowledged") || run.resend != nil {
		t.Errorf("recorded %+v, outstanding %+v; want the retry sent again to any gateway, recorded once", run.retries, run.resend)
	}
}
