package actdispatcher

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/planact/planact/pkg/schema"
)

// An act held aside (the actor role paused for a weight swap, no
// actor-gateway running yet) spends none of its budget: once a gateway
// runs it, a wait the engine asks for is honoured while its attempts and
// back-offs fit, however long it was held. Before, the time held counted
// as spent, and an act held longer than its budget failed at the engine's
// first "try again in 200 ms", past a deadline it had not reached. The
// act's clock is the test's (Service.now): it is moved by the time held,
// while the act is held, rather than slept through.
// Not parallel: it sees the act's postponements (postponed).
func TestAnActHeldAsideKeepsItsBudget(t *testing.T) {
	// The act's budget: 2 attempts of 1 s and a back-off; held 1.2 s.
	const held = 1200 * time.Millisecond
	setRole := func(t *testing.T, s *Service, st schema.RoleState) {
		t.Helper()
		data, err := schema.Marshal(&st)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Bus.Sessions.Put(context.Background(), schema.RoleKey(st.Role), data); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		// hold holds the act aside while its clock moves by the time
		// held (hold moves it, or waits for moved: closed once the act's
		// postponement moved it), then lets it reach the gateway that
		// gateway() starts.
		hold func(s *Service, clock *testClock, moved <-chan struct{}, gateway func())
	}{
		{"paused", func(s *Service, clock *testClock, moved <-chan struct{}, gateway func()) {
			gateway()
			waitFor(t, "the act to wait at the gate", func() bool { return s.follow.Gate(schema.RoleActor).Waiting() > 0 })
			clock.add(held)
			setRole(t, s, schema.RoleState{Role: schema.RoleActor, Epoch: 2}) // resumed
		}},
		{"no gateway", func(s *Service, clock *testClock, moved <-chan struct{}, gateway func()) {
			<-moved
			gateway()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, url := testService(t)
			clock := &testClock{at: time.Now()}
			s.now = clock.now
			info := testInfo()
			info.Session.Config.ActTimeoutS, info.Session.Config.ActRetries = 1, 1
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			go func() { _ = s.follow.Run(ctx) }()
			if tc.name == "paused" {
				setRole(t, s, schema.RoleState{Role: schema.RoleActor, Paused: true, Epoch: 1, Mode: schema.PauseWait})
				waitFor(t, "the replica to see the pause", func() bool { return s.follow.Gate(schema.RoleActor).State().Paused })
			}
			// With no gateway, the clock moves while the act's first try
			// for one waits to try again (a postponement is told in that
			// wait): the time is held, whenever the test gets to run.
			moved := make(chan struct{})
			if tc.name == "no gateway" {
				var once sync.Once
				postponed = func(string, time.Time) {
					once.Do(func() {
						clock.add(held)
						close(moved)
					})
				}
				t.Cleanup(func() { postponed = func(string, time.Time) {} })
			}
			a := &act{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-a", Node: search("a", "x")}
			result := make(chan *schema.ActDone, 1)
			go func() {
				d, err := s.execute(ctx, info, a)
				if err != nil {
					t.Errorf("execute: %v", err)
				}
				result <- d
			}()
			// The engine is busy at first, and asks for 200 ms.
			var sends atomic.Int64
			tc.hold(s, clock, moved, func() {
				fakeGateway(t, url, func(nc *nats.Conn, copies []*nats.Msg) {
					m := &nats.Msg{Subject: copies[len(copies)-1].Reply, Header: nats.Header{}}
					m.Header.Set(schema.HdrActorGateway, "fake")
					if sends.Add(1) == 1 {
						m.Header.Set(micro.ErrorCodeHeader, schema.ActorCodeUnavailable)
						m.Header.Set(micro.ErrorHeader, "503 Service Unavailable: engine busy")
						m.Header.Set(schema.ActorRetryAfterHeader, "200")
					} else {
						m.Data, _ = schema.Marshal(&schema.ActorReply{Generation: schema.Generation{Text: "x is 1"}})
					}
					_ = nc.PublishMsg(m)
				})
			})
			var d *schema.ActDone
			select {
			case d = <-result:
			case <-ctx.Done():
				t.Fatal("the act did not end")
			}
			if d == nil || d.Status != schema.ActDoneOK || d.Output != "x is 1" || d.Attempts != 2 {
				t.Fatalf("the act held aside for %v: %+v; want it done at its second attempt", held, d)
			}
		})
	}
}
