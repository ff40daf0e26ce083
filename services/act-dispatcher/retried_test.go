package actdispatcher

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/enginetest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	actorgateway "github.com/planact/planact/services/actor-gateway"
)

// startGateway runs an actor-gateway on url until the test ends and
// returns its instance id.
func startGateway(t *testing.T, url, name string) string {
	t.Helper()
	b := bustest.Bus(t, url, name)
	if _, err := b.AddService(bus.ServiceConfig{Name: actorgateway.Name, Version: actorgateway.Version}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- actorgateway.Run(ctx, actorgateway.Deps{Bus: b, Log: bustest.Logger(), Engines: &engine.Pool{}})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("actor-gateway %s: %v", name, err)
		}
	})
	return b.Service().ID()
}

// sendAs sends req to subj as an act-dispatcher's exchange does (send n,
// with the retry it would be, if any) and returns the gateway's first
// answer, sending again while no gateway is subscribed there yet.
func sendAs(t *testing.T, nc *nats.Conn, subj string, req *schema.ActorRequest, n string, retry *schema.Retry) *nats.Msg {
	t.Helper()
	body, err := schema.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		inbox := nc.NewRespInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		m := &nats.Msg{Subject: subj, Reply: inbox, Header: nats.Header{}, Data: body}
		m.Header.Set(schema.HdrActorProgress, "1")
		m.Header.Set(schema.HdrActorSend, n)
		if retry != nil {
			h, _ := json.Marshal(retry)
			m.Header.Set("Planact-Retry", string(h)) // schema.HdrActorRetry
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
			t.Fatalf("no answer on %s: %v", subj, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Two runners of one act, as a chaos run with a NATS kill found them: the
// first (A) sent try 1 to one gateway, which started it and whose
// acknowledgement was lost, then, the gateway silent, to any gateway, and
// another gateway started a second generation (A recorded the retry, in
// memory); the runner that took the turn over (B) sent try 1 and was
// attached to a running generation, so it recorded no retry, and its
// outcome was published first. That outcome said 1 attempt and 0 retries
// for an act the engine generated twice, and A's record went with its
// outcome, refused as a second. Now the gateway that starts a retry
// records it on the ACT stream before the engine is called, and the
// outcome published first carries it, whoever publishes it.
func TestARetryOfAnotherRunnerIsInTheOutcomeThatCounts(t *testing.T) {
	hold := make(chan struct{})
	eng := enginetest.New(sim.New(sim.Config{Role: schema.RoleActor}), enginetest.Options{Hold: hold})
	engURL := enginetest.Start(t, eng)
	s, url := testService(t) // runner B
	g1, g2 := startGateway(t, url, "gateway-1"), startGateway(t, url, "gateway-2")
	info := testInfo()
	info.Session.Roles = map[string]schema.RoleInfo{schema.RoleActor: {Engine: schema.Engine{URL: engURL}}}
	node := search("s2", "x")
	cfg := info.Session.Config
	md, err := mode.For(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := md.Tool(cfg, node.Tool)
	task, err := info.Task(0)
	if err != nil {
		t.Fatal(err)
	}
	req := &schema.ActorRequest{Rollout: 1, Episode: 0, Key: "t1-s2", Engine: schema.Engine{URL: engURL}, Try: 1,
		Prompt:   md.ActorPrompt(task, tool, mode.Node{ID: node.ID, Tool: node.Tool, Args: node.Args}, node.Input()),
		Sampling: cfg.ActorSampling, DeadlineMs: time.Now().Add(time.Minute).UnixMilli()}

	// Runner A: try 1, started on gateway 2 (the acknowledgement lost on
	// its way), then sent again to any gateway: gateway 1 starts it anew.
	a := bustest.Conn(t, url)
	if got := sendAs(t, a, schema.ActorInstanceSubject(g2), req, "1", nil); got.Header.Get(schema.HdrActorProgress) != schema.ActorStarted {
		t.Fatalf("gateway 2, send 1: %v, want started", got.Header)
	}
	retry := &schema.Retry{By: "replica-A", Why: "no actor-gateway acknowledged the request for 3s", AtMs: time.Now().UnixMilli()}
	if got := sendAs(t, a, schema.ActorInstanceSubject(g1), req, "2", retry); got.Header.Get(schema.HdrActorProgress) != schema.ActorStarted {
		t.Fatalf("gateway 1, send 2: %v, want started", got.Header)
	}

	// Both generations reached the engine, held there.
	for deadline := time.Now().Add(30 * time.Second); eng.Counts().Held < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the engine holds %d generations of the act, want 2", eng.Counts().Held)
		}
	}

	// Runner B takes the act over: try 1 is attached to a running
	// generation (or answered from it), no retry of B's own.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		d   *schema.ActDone
		err error
	}
	res := make(chan result, 1)
	go func() {
		d, err := s.runAct(ctx, info, &act{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-s2", Node: node, ReleasedMs: 1,
			rerun: "released by an earlier runner of the turn, which is gone: it may have generated it too"})
		res <- result{d, err}
	}()
	close(hold)
	r := <-res
	if r.err != nil || r.d == nil || r.d.Status != schema.ActDoneOK {
		t.Fatalf("runner B: %+v, %v", r.d, r.err)
	}
	stored, err := s.outcome(ctx, 1, 0, "t1-s2")
	if err != nil || stored == nil {
		t.Fatalf("stored outcome: %v, %v", stored, err)
	}
	calls := eng.Counts().Acts()["1-0-t1-s2"]
	if calls != 2 {
		t.Fatalf("the engine took %d calls of the act, want 2: the test does not set up what it means to", calls)
	}
	found := false
	for _, rt := range stored.Retries {
		found = found || rt == *retry
	}
	if !found || max(stored.Attempts, 1)+len(stored.Retries) < calls {
		t.Errorf("the outcome that counts: %d attempts, retries %+v, for %d engine calls; want runner A's retry %+v among them",
			stored.Attempts, stored.Retries, calls, *retry)
	}
}

// A retry outstanding before an exchange (here a try a pause aborted) is
// carried by its request (schema.HdrActorRetry), for the gateway to record
// when it starts a generation; a refusal while the role is paused starts
// nothing, and the retry stays outstanding for the next exchange, whose
// generation records it. A request that is no retry carries none.
func TestARetryIsCarriedUntilAGenerationStarts(t *testing.T) {
	t.Parallel()
	_, url := bustest.Server(t)
	var mu sync.Mutex
	var carried []string
	fakeGateway(t, url, func(nc *nats.Conn, copies []*nats.Msg) {
		m := copies[len(copies)-1]
		mu.Lock()
		carried = append(carried, m.Header.Get(schema.HdrActorRetry))
		mu.Unlock()
		if len(copies) == 1 {
			r := &nats.Msg{Subject: m.Reply, Header: nats.Header{}}
			r.Header.Set(schema.HdrActorGateway, "fake")
			r.Header.Set(micro.ErrorCodeHeader, schema.ActorCodePaused)
			_ = nc.PublishMsg(r)
			return
		}
		ack(nc, m, schema.ActorStarted, true)
		answer(nc, m)
	})
	s := &Service{Deps: Deps{Bus: bustest.Bus(t, url, "dispatcher")}}
	paused := &schema.Retry{By: "dispatcher", From: "gateway-1", Why: "aborted by a pause of the actor role; generated again after the resume"}
	run := &act{Rollout: 1, Key: "t1-s1", resend: paused, resendReason: "paused"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 2 {
		if _, _, err := s.exchange(ctx, run, &nats.Msg{Header: nats.Header{}, Data: []byte("request")}); err != nil {
			t.Fatalf("exchange %d: %v", i+1, err)
		}
		if i == 0 && (run.resend == nil || len(run.retries) != 0) {
			t.Fatalf("after a refusal while paused: outstanding %+v, recorded %+v; want it outstanding, none recorded", run.resend, run.retries)
		}
	}
	if _, _, err := s.exchange(ctx, run, &nats.Msg{Header: nats.Header{}, Data: []byte("request")}); err != nil {
		t.Fatalf("exchange 3: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	var want schema.Retry
	if len(carried) != 3 || json.Unmarshal([]byte(carried[0]), &want) != nil || carried[1] != carried[0] || carried[2] != "" {
		t.Fatalf("the requests carried %q; want the retry twice, then none", carried)
	}
	if run.resend != nil || len(run.retries) != 1 || run.retries[0] != want || want.Why != paused.Why || want.AtMs == 0 {
		t.Errorf("outstanding %+v, recorded %+v; want the retry as carried (%+v), recorded once", run.resend, run.retries, want)
	}
}

// The outcome's retries are those the gateways recorded with the runner's
// own that are not among them (a retry the runner heard started is the
// one its gateway recorded), oldest first.
func TestMergeRetries(t *testing.T) {
	a := schema.Retry{By: "A", Why: "unanswered", AtMs: 1}
	b := schema.Retry{By: "B", Why: "rerun", AtMs: 2}
	c := schema.Retry{By: "B", Why: "paused", AtMs: 3}
	for _, tc := range []struct {
		name          string
		recorded, own []schema.Retry
		want          []schema.Retry
	}{
		{"none", nil, nil, nil},
		{"recorded by another runner's gateway", []schema.Retry{a}, nil, []schema.Retry{a}},
		{"the runner's own, recorded", []schema.Retry{a, b}, []schema.Retry{b}, []schema.Retry{a, b}},
		{"the runner's own, not recorded (a gateway that records none)", []schema.Retry{a}, []schema.Retry{c}, []schema.Retry{a, c}},
		{"the same retry twice is two", []schema.Retry{a, a}, []schema.Retry{a}, []schema.Retry{a, a}},
		{"oldest first", []schema.Retry{c}, []schema.Retry{a, c}, []schema.Retry{a, c}},
	} {
		if got := mergeRetries(tc.recorded, tc.own); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestAnUnreadableRetryRecordDoesNotBlockTheOutcome: a retries record that
// cannot be decoded (another version wrote it) still says a retry was
// recorded; the act's outcome is published after it, saying so, rather
// than refused for ever.
func TestAnUnreadableRetryRecordDoesNotBlockTheOutcome(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "dispatcher")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := &schema.ActRetries{Rollout: 3, Episode: 1, Key: "t1-s1"}
	if _, err := b.JS.Publish(ctx, rec.Subject(), []byte{0xc1}); err != nil { // 0xc1: never valid msgpack
		t.Fatal(err)
	}
	done := &schema.ActDone{Rollout: 3, Episode: 1, Turn: 1, Key: "t1-s1", NodeID: "s1", Status: schema.ActDoneOK, Output: "x", Attempts: 1}
	stored, err := publishActOutcome(ctx, b, done)
	if err != nil || !stored {
		t.Fatalf("outcome after an unreadable retries record: stored %v, %v", stored, err)
	}
	m, err := b.LastMsg(ctx, bus.StreamAct, done.Subject())
	if err != nil || m == nil {
		t.Fatalf("the outcome on the stream: %v %v", m, err)
	}
	var got schema.ActDone
	if err := m.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if len(got.Retries) != 1 || !strings.Contains(got.Retries[0].Why, "cannot be read") {
		t.Errorf("the outcome's retries: %+v, want one saying a retry was recorded whose record cannot be read", got.Retries)
	}
}
