package actdispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/telemetry"
)

// A retry outstanding when a try is found aborted by a pause, or its
// answer no longer kept (410), stays that one retry, and keeps the
// gateway that made it and its reason; the new reason is added ("; then").
// Before, the new retry replaced it: still one retry, but the gateway that
// went (whose generation may have reached the engine) and why were lost
// from the act's record.
func TestAnOutstandingRetryKeepsItsReasonWhenAnotherIsAdded(t *testing.T) {
	t.Parallel()
	earlier := func() *schema.Retry {
		return &schema.Retry{By: "dispatcher", From: "gateway-1", Why: "actor-gateway gateway-1 answered nothing for 6s", AtMs: 5}
	}
	t.Run("an answer no longer kept", func(t *testing.T) {
		t.Parallel()
		s, url := testService(t)
		fakeGateway(t, url, func(nc *nats.Conn, copies []*nats.Msg) {
			r := &nats.Msg{Subject: copies[len(copies)-1].Reply, Header: nats.Header{}}
			r.Header.Set(schema.HdrActorGateway, "gateway-2")
			r.Header.Set(micro.ErrorCodeHeader, schema.ActorCodeGone)
			r.Header.Set(micro.ErrorHeader, "its answer was dropped")
			_ = nc.PublishMsg(r)
		})
		run := &act{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-a", Node: search("a", "x"), resend: earlier(), resendReason: "holder_gone"}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, _, err := s.try(ctx, testInfo(), run); err == nil || !strings.Contains(err.Error(), "no longer keeps") {
			t.Fatalf("try: %v, want the gateway's 410", err)
		}
		got := run.resend
		if got == nil || got.From != "gateway-1" || got.AtMs != 5 || !strings.HasPrefix(got.Why, earlier().Why+"; then ") ||
			!strings.Contains(got.Why, "actor-gateway gateway-2 no longer keeps the answer") || run.resendReason != "holder_gone" {
			t.Errorf("outstanding %+v (reason %q); want the earlier retry from gateway-1, then the 410's reason added, reason holder_gone", got, run.resendReason)
		}
	})
	t.Run("a try aborted by a pause", func(t *testing.T) {
		t.Parallel()
		s, url := testService(t)
		var mu sync.Mutex
		carried := ""
		fakeGateway(t, url, func(nc *nats.Conn, copies []*nats.Msg) {
			m := copies[len(copies)-1]
			mu.Lock()
			carried = m.Header.Get(schema.HdrActorRetry)
			mu.Unlock()
			ack(nc, m, schema.ActorStarted, true)
			r := &nats.Msg{Subject: m.Reply, Header: nats.Header{}}
			r.Header.Set(schema.HdrActorGateway, "fake")
			r.Data, _ = schema.Marshal(&schema.ActorReply{Generation: schema.Generation{Text: "x is 1"}})
			_ = nc.PublishMsg(r)
		})
		run := &act{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-a", Node: search("a", "x"), try: 1, taken: true,
			aborted: "gateway-2", resend: earlier(), resendReason: "holder_gone"}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, _, err := s.try(ctx, testInfo(), run); err != nil || out != "x is 1" {
			t.Fatalf("try: %q, %v", out, err)
		}
		mu.Lock()
		defer mu.Unlock()
		var sent schema.Retry
		if err := json.Unmarshal([]byte(carried), &sent); err != nil {
			t.Fatalf("the request carried retry %q: %v", carried, err)
		}
		if len(run.retries) != 1 || run.retries[0] != sent || run.resend != nil {
			t.Fatalf("recorded %+v, outstanding %+v; want the retry carried (%+v), recorded once", run.retries, run.resend, sent)
		}
		if got := run.retries[0]; got.From != "gateway-1" || got.AtMs != 5 || !strings.HasPrefix(got.Why, earlier().Why+"; then ") ||
			!strings.Contains(got.Why, "actor-gateway gateway-2: aborted by a pause") {
			t.Errorf("recorded %+v; want the earlier retry from gateway-1, then the pause's abort on gateway-2 added", got)
		}
	})
}

// A gateway took the act's request and went (stopped, died): the request
// sent to it again finds no responders, and so, after its patience, does
// the one sent to any gateway: there is none. That is no gateway running,
// as for an act that never reached one: the exchange says so (execute then
// waits for one, with no attempt spent), the retry outstanding kept for
// the next exchange. Before, a gateway once heard made it send again until
// the attempt's deadline, which spent the attempt, and at the last one
// failed the act as timed out, however long its patience for a gateway.
func TestNoGatewayLeftAfterOneWasHeardIsNoGateway(t *testing.T) {
	t.Parallel()
	_, url := bustest.Server(t)
	nc := bustest.Conn(t, url)
	var sub *nats.Subscription
	sub, err := nc.Subscribe(schema.ActorSubject, func(m *nats.Msg) {
		ack(nc, m, schema.ActorStarted, true)
		// The gateway goes: nothing answers on the queue group now.
		_ = sub.Unsubscribe()
		_ = nc.Flush()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s := &Service{Deps: Deps{Bus: bustest.Bus(t, url, "dispatcher")}}
	run := &act{Rollout: 1, Key: "t1-s1"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, acked, err := s.exchange(ctx, run, &nats.Msg{Header: nats.Header{}, Data: []byte("request")})
	if !errors.Is(err, errNoActorGateway) || !acked {
		t.Fatalf("exchange: %v, acknowledged %v; want no actor-gateway, after an acknowledgement", err, acked)
	}
	if run.resend == nil || run.resend.From != "fake" || !strings.Contains(run.resend.Why, "actor-gateway fake answered nothing") ||
		run.resendReason != "holder_gone" || len(run.retries) != 0 {
		t.Errorf("outstanding %+v (reason %q), recorded %+v; want the retry from the gateway that went outstanding, none recorded",
			run.resend, run.resendReason, run.retries)
	}
}

// An act whose retry a gateway refuses because another run's outcome
// stands (412) did not fail: that outcome is the act's (runAct reads it),
// counted by the run that published it. Before, it was counted again, as a
// failed act and a failure of kind invalid. Not parallel: the metrics are
// the process's.
func TestAnActWhoseOutcomeStandsIsNoFailure(t *testing.T) {
	s, url := testService(t)
	fakeGateway(t, url, func(nc *nats.Conn, copies []*nats.Msg) {
		r := &nats.Msg{Subject: copies[len(copies)-1].Reply, Header: nats.Header{}}
		r.Header.Set(schema.HdrActorGateway, "fake")
		r.Header.Set(micro.ErrorCodeHeader, schema.ActorCodeDone)
		r.Header.Set(micro.ErrorHeader, "the act has an outcome")
		_ = nc.PublishMsg(r)
	})
	failures := func() (n float64) {
		for _, k := range []string{schema.ActErrInvalid, schema.ActErrTransient, schema.ActErrTimeout, schema.ActErrUnavailable} {
			n += testutil.ToFloat64(telemetry.ActFailures.WithLabelValues(k))
		}
		return n
	}
	failed, acts := failures(), testutil.ToFloat64(telemetry.Acts.WithLabelValues(schema.ActFailed))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := &act{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-a", Node: search("a", "x"), rerun: "released by an earlier runner of the turn, which is gone"}
	d, err := s.execute(ctx, testInfo(), a)
	if err != nil || d == nil || !strings.Contains(d.Error, "has an outcome") || d.Attempts != 1 {
		t.Fatalf("execute: %+v, %v; want the gateway's refusal at the first attempt", d, err)
	}
	if got, gotActs := failures()-failed, testutil.ToFloat64(telemetry.Acts.WithLabelValues(schema.ActFailed))-acts; got != 0 || gotActs != 0 {
		t.Errorf("counted %v act failures and %v failed acts; want none: another run's outcome stands", got, gotActs)
	}
}
