package actorgateway_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	actorgateway "github.com/planact/planact/services/actor-gateway"
)

// TestARolloutThatEndsStopsItsActsWaitingForASlot: an act waiting for one
// of the replica's slots (all taken by another rollout's acts) is answered
// "rollout is over" when its rollout ends, without a slot and without its
// engine. It waited until a slot came free, or to its deadline.
func TestARolloutThatEndsStopsItsActsWaitingForASlot(t *testing.T) {
	hung := startHungEngine(t)
	ctx, b, caller := runGateway(t, actorgateway.Deps{Engines: &engine.Pool{Limit: 4}, MaxInFlight: 1}, 1, 2)
	// send asks for an act of rollout n and returns the subscription its
	// answers come on, once the gateway said it has it.
	send := func(n int64, within time.Duration) *nats.Subscription {
		t.Helper()
		body, err := schema.Marshal(&schema.ActorRequest{Rollout: n, Key: "t1-s1", Try: 1, Engine: schema.Engine{URL: hung.URL}, Prompt: "Tool: search\nInput: x",
			Sampling: schema.Sampling{MaxNewTokens: 8}, DeadlineMs: time.Now().Add(within).UnixMilli()})
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
			inbox := caller.NewRespInbox()
			sub, err := caller.SubscribeSync(inbox)
			if err != nil {
				t.Fatal(err)
			}
			m := &nats.Msg{Subject: schema.ActorSubject, Reply: inbox, Header: nats.Header{}, Data: body}
			m.Header.Set(schema.HdrActorProgress, "1")
			if err := caller.PublishMsg(m); err != nil {
				t.Fatal(err)
			}
			a, err := sub.NextMsg(5 * time.Second)
			if err == nil && a.Header.Get(schema.HdrActorProgress) == schema.ActorStarted {
				return sub
			}
			_ = sub.Unsubscribe()
			if time.Now().After(deadline) { // the gateway may not be subscribed yet
				t.Fatalf("rollout %d: no acknowledgement: %v %v", n, a, err)
			}
		}
	}
	first := send(1, time.Minute)
	defer first.Unsubscribe()
	for deadline := time.Now().Add(30 * time.Second); hung.started.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("rollout 1's act never reached the engine")
		}
	}
	waiting := send(2, 20*time.Second) // the replica's one slot is taken
	defer waiting.Unsubscribe()
	if _, _, err := bus.Mutate(ctx, b.Sessions, schema.SessionKey(2), func(s *schema.Session, _ bool) (bool, error) {
		s.State = schema.SessionAborted
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	for {
		a, err := waiting.NextMsg(40 * time.Second)
		if err != nil {
			t.Fatalf("no answer for the act of the rollout that ended: %v", err)
		}
		if a.Header.Get(schema.HdrActorProgress) != "" {
			continue // still waiting
		}
		if code, desc := a.Header.Get(micro.ErrorCodeHeader), a.Header.Get(micro.ErrorHeader); code != actorgateway.CodeUnavailable || desc != "rollout is over" {
			t.Fatalf("the act waiting for a slot when its rollout ended: code %q (%s), want %s: rollout is over", code, desc, actorgateway.CodeUnavailable)
		}
		break
	}
	if got := hung.started.Load(); got != 1 {
		t.Errorf("the engine saw %d generations, want 1: none for the rollout that ended", got)
	}
}

// TestARequestWithoutADeadlineIsRefused: a request that does not say when
// its caller stops waiting (deadline_ms) is refused as invalid, naming the
// field, before it reaches its engine: nothing else would bound the engine
// call. It ran without a bound.
func TestARequestWithoutADeadlineIsRefused(t *testing.T) {
	hung := startHungEngine(t)
	_, _, caller := runGateway(t, actorgateway.Deps{Engines: &engine.Pool{Limit: 4}})
	for _, ms := range []int64{0, -1} {
		body, err := schema.Marshal(&schema.ActorRequest{Rollout: 1, Key: "t1-s1", Try: 1, Engine: schema.Engine{URL: hung.URL}, Prompt: "Tool: search\nInput: x",
			Sampling: schema.Sampling{MaxNewTokens: 8}, DeadlineMs: ms})
		if err != nil {
			t.Fatal(err)
		}
		var reply *nats.Msg
		for deadline := time.Now().Add(time.Minute); reply == nil; time.Sleep(20 * time.Millisecond) {
			if reply, err = caller.Request(schema.ActorSubject, body, 5*time.Second); err != nil && time.Now().After(deadline) {
				t.Fatalf("deadline_ms %d: no answer: %v", ms, err)
			}
		}
		code, desc := reply.Header.Get(micro.ErrorCodeHeader), reply.Header.Get(micro.ErrorHeader)
		if code != actorgateway.CodeInvalid || !strings.Contains(desc, "deadline_ms") {
			t.Errorf("deadline_ms %d: code %q (%s), want %s naming deadline_ms", ms, code, desc, actorgateway.CodeInvalid)
		}
	}
	if got := hung.started.Load(); got != 0 {
		t.Errorf("the engine saw %d generations, want none", got)
	}
}
