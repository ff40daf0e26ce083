package actorgateway_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	actorgateway "github.com/planact/planact/services/actor-gateway"
)

// hungEngine is an SGLang-like engine whose generations never end: each
// holds its request until the caller goes. It tokenizes, and answers any
// other request (an abort) at once.
type hungEngine struct {
	*httptest.Server
	started, cancelled atomic.Int64 // generations begun, and ended by their caller leaving
}

func startHungEngine(t *testing.T) *hungEngine {
	h := &hungEngine{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // so that the server notices the client leaving
		switch r.URL.Path {
		case "/tokenize":
			w.Write([]byte(`{"tokens":[1,2,3]}`))
		case "/generate":
			h.started.Add(1)
			<-r.Context().Done()
			h.cancelled.Add(1)
		}
	}))
	t.Cleanup(h.Close)
	return h
}

// TestDeadlineFreesTheEngineSlot: when the caller's deadline passes, the
// gateway abandons a hung generation, so the engine's slot is free again.
func TestDeadlineFreesTheEngineSlot(t *testing.T) {
	hung := startHungEngine(t)
	started, cancelled := &hung.started, &hung.cancelled

	pool := &engine.Pool{Limit: 1}
	_, _, caller := runGateway(t, actorgateway.Deps{Engines: pool})
	req := &schema.ActorRequest{Rollout: 1, Key: "t1-s1", Engine: schema.Engine{URL: hung.URL}, Prompt: "Tool: search\nInput: x",
		Sampling: schema.Sampling{MaxNewTokens: 8}}
	deadline := time.Now().Add(10 * time.Second)
	// The caller's deadline must pass while the generation runs: on a
	// loaded machine it can pass before the request reaches the engine
	// (the gateway then answers time-out without a generation), so the
	// request is made again with twice the time.
	for window := 300 * time.Millisecond; ; {
		req.DeadlineMs = time.Now().Add(window).UnixMilli()
		body, err := schema.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		reply, err := caller.Request(schema.ActorSubject, body, 5*time.Second)
		if err == nil {
			if code := reply.Header.Get(micro.ErrorCodeHeader); code != actorgateway.CodeTimeout {
				t.Fatalf("reply to a hung generation: code %q, want %s (%s)", code, actorgateway.CodeTimeout, reply.Header.Get(micro.ErrorHeader))
			}
			if started.Load() > 0 {
				break
			}
			window *= 2
		}
		if time.Now().After(deadline) { // the service may not be registered yet
			t.Fatalf("no generation timed out: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for pool.InFlight("", hung.URL, "") != 0 || started.Load() == 0 || cancelled.Load() != started.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("slot still held (%d in flight, %d generations started, %d cancelled)", pool.InFlight("", hung.URL, ""), started.Load(), cancelled.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStartedSaysWhichSend: the acknowledgement of a new generation gives
// back the number of the send it started from (schema.HdrActorSend), so
// that the act-dispatcher records a retry only for a generation a send
// again started.
func TestStartedSaysWhichSend(t *testing.T) {
	hung := startHungEngine(t)
	_, _, caller := runGateway(t, actorgateway.Deps{Engines: &engine.Pool{Limit: 1}})
	body, err := schema.Marshal(&schema.ActorRequest{Rollout: 1, Key: "t1-s1", Engine: schema.Engine{URL: hung.URL}, Prompt: "Tool: search\nInput: x",
		Sampling: schema.Sampling{MaxNewTokens: 8}, DeadlineMs: time.Now().Add(time.Minute).UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		inbox := caller.NewRespInbox()
		sub, err := caller.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		m := &nats.Msg{Subject: schema.ActorSubject, Reply: inbox, Header: nats.Header{}, Data: body}
		m.Header.Set(schema.HdrActorProgress, "1")
		m.Header.Set(schema.HdrActorSend, "7")
		if err := caller.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		first, err := sub.NextMsg(2 * time.Second)
		_ = sub.Unsubscribe()
		if err == nil && first.Header.Get("Status") != "503" {
			if p, n := first.Header.Get(schema.HdrActorProgress), first.Header.Get(schema.HdrActorSend); p != schema.ActorStarted || n != "7" {
				t.Fatalf("first answer: progress %q, send %q; want started from send 7", p, n)
			}
			break
		}
		if time.Now().After(deadline) { // the service may not be subscribed yet
			t.Fatalf("no acknowledgement: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNoGenerationForARolloutOver: an act that reaches the gateway after
// its rollout ended (a retry sent as the end was being written) is answered
// at once, and the engine never sees it. It once started a generation that
// held an engine slot until a later write to the session ended it.
func TestNoGenerationForARolloutOver(t *testing.T) {
	hung := startHungEngine(t)
	started := &hung.started
	const n = 3
	ctx, b, caller := runGateway(t, actorgateway.Deps{Engines: &engine.Pool{Limit: 4}}, n)
	ask := func(key string, within time.Duration) (*nats.Msg, error) {
		body, err := schema.Marshal(&schema.ActorRequest{Rollout: n, Key: key, Engine: schema.Engine{URL: hung.URL}, Prompt: "Tool: search\nInput: x",
			Sampling: schema.Sampling{MaxNewTokens: 8}, DeadlineMs: time.Now().Add(within).UnixMilli()})
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			reply, err := caller.Request(schema.ActorSubject, body, within+5*time.Second)
			if !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) { // the service may not be subscribed yet
				return reply, err
			}
		}
	}
	isOver := func(what string, reply *nats.Msg, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if code, desc := reply.Header.Get(micro.ErrorCodeHeader), reply.Header.Get(micro.ErrorHeader); code != actorgateway.CodeUnavailable || desc != "rollout is over" {
			t.Fatalf("%s: code %q (%s), want %s: rollout is over", what, code, desc, actorgateway.CodeUnavailable)
		}
	}
	type answer struct {
		m   *nats.Msg
		err error
	}
	first := make(chan answer, 1)
	go func() { m, err := ask("t1-s1", time.Minute); first <- answer{m, err} }()
	for deadline := time.Now().Add(30 * time.Second); started.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the running rollout's act never reached the engine")
		}
	}
	_, _, err := bus.Mutate(ctx, b.Sessions, schema.SessionKey(n), func(s *schema.Session, _ bool) (bool, error) {
		s.State = schema.SessionDone
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	a := <-first // the gateway has seen the end: it stopped this one
	isOver("the act running when the rollout ended", a.m, a.err)
	m, err := ask("t1-s2", 5*time.Second)
	isOver("an act sent after the rollout ended", m, err)
	if got := started.Load(); got != 1 {
		t.Errorf("the engine saw %d generations, want 1: none for the act sent after the end", got)
	}
}

// TestAPausedAbortIsNotKeptForLaterCallers: a try that a pause in abort
// mode stopped has no answer to keep. The callers it had are told (and
// told again, asking again, as any caller whose answer was lost); a
// caller that comes after the resume — a runner that took the turn over
// and numbers its tries alike — gets the try generated. Before, it was
// given the kept "paused" answer for 30 s, without an acknowledgement:
// the act-dispatcher waited and sent the same try again, some 600 times,
// and then lost an attempt to "no longer keeps the answer".
func TestAPausedAbortIsNotKeptForLaterCallers(t *testing.T) {
	hung := startHungEngine(t)
	ctx, b, caller := runGateway(t, actorgateway.Deps{Engines: &engine.Pool{Limit: 4}})
	request := func(key string) []byte {
		body, err := schema.Marshal(&schema.ActorRequest{Rollout: 1, Key: key, Try: 1, Engine: schema.Engine{URL: hung.URL}, Prompt: "Tool: search\nInput: x",
			Sampling: schema.Sampling{MaxNewTokens: 8}, DeadlineMs: time.Now().Add(time.Minute).UnixMilli()})
		if err != nil {
			t.Fatal(err)
		}
		return body
	}
	// send sends key's try 1 with its replies to inbox, and returns the
	// first reply that is no "running" beat.
	publish := func(inbox *nats.Subscription, key string) {
		t.Helper()
		m := &nats.Msg{Subject: schema.ActorSubject, Reply: inbox.Subject, Header: nats.Header{}, Data: request(key)}
		m.Header.Set(schema.HdrActorProgress, "1")
		if err := caller.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	send := func(inbox *nats.Subscription, key string) *nats.Msg {
		t.Helper()
		publish(inbox, key)
		return next(t, inbox)
	}
	inbox := func() *nats.Subscription {
		sub, err := caller.SubscribeSync(caller.NewRespInbox())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		return sub
	}
	setRole := func(paused bool, epoch int64) {
		_, _, err := bus.Mutate(ctx, b.Sessions, schema.RoleKey(schema.RoleActor), func(v *schema.RoleState, _ bool) (bool, error) {
			*v = schema.RoleState{Role: schema.RoleActor, Paused: paused, Mode: schema.PauseAbort, Epoch: epoch}
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	first := inbox()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		publish(first, "t1-s1")
		m, err := first.NextMsg(5 * time.Second)
		if err == nil {
			if p := m.Header.Get(schema.HdrActorProgress); p != schema.ActorStarted {
				t.Fatalf("first answer: progress %q (%s), want started", p, m.Header.Get(micro.ErrorHeader))
			}
			break
		}
		if !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) { // the service may not be subscribed yet
			t.Fatalf("no acknowledgement: %v", err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); hung.started.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the generation never reached the engine")
		}
	}
	setRole(true, 1)
	if m := next(t, first); m.Header.Get(micro.ErrorCodeHeader) != actorgateway.CodePaused {
		t.Fatalf("answer to the aborted try: code %q (%s), want %s", m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader), actorgateway.CodePaused)
	}
	// Its caller, asking again, is told again.
	if m := send(first, "t1-s1"); m.Header.Get(micro.ErrorCodeHeader) != actorgateway.CodePaused || m.Header.Get(schema.HdrActorProgress) != "" {
		t.Fatalf("the aborted try's caller asking again: code %q, progress %q; want its answer, %s", m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(schema.HdrActorProgress), actorgateway.CodePaused)
	}
	setRole(false, 2)
	probe := inbox()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		m := send(probe, "t1-probe") // refused, it leaves no record: asked again alike
		if m.Header.Get(schema.HdrActorProgress) == schema.ActorStarted {
			break // the gateway has seen the resume
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway did not see the resume: %q (%s)", m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader))
		}
	}
	later := inbox()
	if m := send(later, "t1-s1"); m.Header.Get(schema.HdrActorProgress) != schema.ActorStarted {
		t.Errorf("a caller of the aborted try after the resume: code %q (%s), progress %q; want it generated again (started)",
			m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader), m.Header.Get(schema.HdrActorProgress))
	}
}

// next is the next reply on inbox that is no "running" beat.
func next(t *testing.T, inbox *nats.Subscription) *nats.Msg {
	t.Helper()
	for {
		m, err := inbox.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if m.Header.Get(schema.HdrActorProgress) != schema.ActorRunning {
			return m
		}
	}
}

// runGateway runs an actor-gateway with deps (its bus and logger filled in)
// on a fresh server until the test ends, when Run must have returned no
// error. running, if given, are rollouts whose sessions are running before
// it starts. It returns a context for the test, the gateway's bus and a
// connection to call it on.
func runGateway(t *testing.T, deps actorgateway.Deps, running ...int64) (context.Context, *bus.Bus, *nats.Conn) {
	t.Helper()
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "gateway")
	ctx, cancel := context.WithCancel(context.Background())
	for _, n := range running {
		if _, err := bus.Create(ctx, b.Sessions, schema.SessionKey(n), &schema.Session{Rollout: n, State: schema.SessionRunning, Episodes: 1}); err != nil {
			t.Fatal(err)
		}
	}
	deps.Bus, deps.Log = b, bustest.Logger()
	done := make(chan error, 1)
	go func() { done <- actorgateway.Run(ctx, deps) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return ctx, b, bustest.Conn(t, url)
}
