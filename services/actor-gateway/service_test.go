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
	"github.com/planact/planact/pkg/sim"
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

	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "gateway")
	pool := &engine.Pool{Limit: 1}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- actorgateway.Run(ctx, actorgateway.Deps{Bus: b, Log: bustest.Logger(), Engines: pool}) }()

	caller := bustest.Conn(t, url)
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
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestStartedSaysWhichSend: the gateway gives back the number of the send
// a new generation started from (schema.HdrActorSend), so that the
// act-dispatcher records a retry only for a generation a send again
// started. A generation that runs a beat or longer says so in a "started"
// acknowledgement at the first beat.
func TestStartedSaysWhichSend(t *testing.T) {
	hung := startHungEngine(t)
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "gateway")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- actorgateway.Run(ctx, actorgateway.Deps{Bus: b, Log: bustest.Logger(), Engines: &engine.Pool{Limit: 4}})
	}()
	caller := bustest.Conn(t, url)
	// A generation that runs: acknowledged at the first beat.
	first := askActor(t, caller, actorRequest(t, hung.URL, "t1-s1"), caller.NewRespInbox(), "7")
	if p, n := first.Header.Get(schema.HdrActorProgress), first.Header.Get(schema.HdrActorSend); p != schema.ActorStarted || n != "7" {
		t.Fatalf("first word of a generation that runs: progress %q, send %q; want started from send 7", p, n)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestAQuickGenerationIsAcknowledgedByItsAnswer: a generation that ends
// before the first beat sends no acknowledgement: its answer is the first
// word the caller hears, and says which send it started from
// (schema.HdrActorStarted): one message to the caller, not two. An answer
// asked for again by the caller that started it says the same; another
// caller is not told that it started a generation.
func TestAQuickGenerationIsAcknowledgedByItsAnswer(t *testing.T) {
	fast := httptest.NewServer(sim.New(sim.Config{Role: schema.RoleActor, Seed: 3}))
	t.Cleanup(fast.Close)
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "gateway")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		// No beat while the test runs: however slow the machine, the
		// generation ends first.
		done <- actorgateway.Run(ctx, actorgateway.Deps{Bus: b, Log: bustest.Logger(), Engines: &engine.Pool{Limit: 4}, Beat: time.Hour})
	}()
	caller := bustest.Conn(t, url)
	body, inbox := actorRequest(t, fast.URL, "t1-s2"), caller.NewRespInbox()
	first := askActor(t, caller, body, inbox, "3")
	if p, code := first.Header.Get(schema.HdrActorProgress), first.Header.Get(micro.ErrorCodeHeader); p != "" || code != "" || len(first.Data) == 0 {
		t.Fatalf("first word of a quick generation: progress %q, error %q %q; want its answer", p, code, first.Header.Get(micro.ErrorHeader))
	}
	if got := first.Header.Get(schema.HdrActorStarted); got != "3" {
		t.Fatalf("the answer of a quick generation says it started from send %q, want 3", got)
	}
	// Asked again by the caller that started it: the kept answer, saying so.
	again := askActor(t, caller, body, inbox, "4")
	if string(again.Data) != string(first.Data) || again.Header.Get(schema.HdrActorStarted) != "3" {
		t.Errorf("asked again by its caller: started %q, same answer %v; want the answer, started from send 3",
			again.Header.Get(schema.HdrActorStarted), string(again.Data) == string(first.Data))
	}
	// By another caller (another act-dispatcher): the answer, no start.
	other := askActor(t, caller, body, caller.NewRespInbox(), "1")
	if string(other.Data) != string(first.Data) || other.Header.Get(schema.HdrActorStarted) != "" {
		t.Errorf("asked by another caller: started %q, same answer %v; want the answer, no start",
			other.Header.Get(schema.HdrActorStarted), string(other.Data) == string(first.Data))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func actorRequest(t *testing.T, engineURL, key string) []byte {
	t.Helper()
	body, err := schema.Marshal(&schema.ActorRequest{Rollout: 1, Key: key, Engine: schema.Engine{URL: engineURL}, Prompt: "Tool: search\nInput: x",
		Sampling: schema.Sampling{MaxNewTokens: 8}, DeadlineMs: time.Now().Add(time.Minute).UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// askActor sends body from inbox as send n, asking for progress, and
// returns the first message that answers it (sent again while no gateway
// is subscribed yet: no responders).
func askActor(t *testing.T, caller *nats.Conn, body []byte, inbox, n string) *nats.Msg {
	t.Helper()
	sub, err := caller.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		m := &nats.Msg{Subject: schema.ActorSubject, Reply: inbox, Header: nats.Header{}, Data: body}
		m.Header.Set(schema.HdrActorProgress, "1")
		m.Header.Set(schema.HdrActorSend, n)
		if err := caller.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		first, err := sub.NextMsg(10 * time.Second)
		if err == nil && first.Header.Get("Status") != "503" {
			return first
		}
		if err != nil && !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("no answer: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no actor-gateway subscribed")
		}
	}
}

// TestNoGenerationForARolloutOver: an act that reaches the gateway after
// its rollout ended (a retry sent as the end was being written) is answered
// at once, and the engine never sees it. It once started a generation that
// held an engine slot until a later write to the session ended it.
func TestNoGenerationForARolloutOver(t *testing.T) {
	hung := startHungEngine(t)
	started := &hung.started
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "gateway")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 3
	if _, err := bus.Create(ctx, b.Sessions, schema.SessionKey(n), &schema.Session{Rollout: n, State: schema.SessionRunning, Episodes: 1}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- actorgateway.Run(ctx, actorgateway.Deps{Bus: b, Log: bustest.Logger(), Engines: &engine.Pool{Limit: 4}})
	}()
	caller := bustest.Conn(t, url)
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
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
