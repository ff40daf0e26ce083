package actorgateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
	actorgateway "github.com/planact/planact/services/actor-gateway"
)

// lengthEngine is an SGLang-like engine that ends every generation at
// "length" after n tokens, whatever it was asked for.
func lengthEngine(t *testing.T, n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(5 + i)
	}
	reply := fmt.Sprintf(`{"text":%q,"output_ids":[%s],"meta_info":{"finish_reason":{"type":"length"},"prompt_tokens":3,"completion_tokens":%d}}`,
		strings.Repeat("a", n), strings.Join(ids, ","), n)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/tokenize":
			w.Write([]byte(`{"tokens":[1,2,3]}`))
		case "/generate":
			w.Write([]byte(reply))
		}
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// TestTruncatedNamesTheLimitThatCutIt: an act the engine ends at "length"
// short of the tokens it was asked for was cut by a limit of the engine's
// own (SGLang's --allow-auto-truncate fits max_new_tokens to its context),
// and its sample says so, as a planner turn's does. It used to say that
// actor_sampling.max_new_tokens cut it, which the engine never reached.
func TestTruncatedNamesTheLimitThatCutIt(t *testing.T) {
	for _, tc := range []struct {
		name          string
		asked, got    int
		says, notSays string
	}{
		{"cut at max_new_tokens", 8, 8, "actor_sampling.max_new_tokens 8", "own limit"},
		{"cut short by the engine", 8, 3, "the actor engine's own limit: the act's generation was cut after 3 tokens, of the 8 it was asked for", "actor_sampling.max_new_tokens"},
		{"no max_new_tokens asked", 0, 3, "the actor engine's own limit: the act's generation was cut after 3 tokens", "actor_sampling.max_new_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := lengthEngine(t, tc.got)
			req := &schema.ActorRequest{Rollout: 1, Key: "t1-s1", Engine: schema.Engine{URL: url}, Prompt: "Tool: search\nInput: x",
				Sampling: schema.Sampling{MaxNewTokens: tc.asked}}
			g, err := actorgateway.Generate(context.Background(), &engine.Pool{Limit: 1}, req, nil)
			if err != nil {
				t.Fatal(err)
			}
			if g.FinishReason != engine.FinishLength || len(g.OutputIDs) != tc.got {
				t.Fatalf("generation %+v: want %d tokens cut at length", g, tc.got)
			}
			if !strings.Contains(g.Truncated, tc.says) || strings.Contains(g.Truncated, tc.notSays) {
				t.Errorf("truncated %q: want it to say %q, not %q", g.Truncated, tc.says, tc.notSays)
			}
		})
	}
}

// TestATryAPauseAbortedIsRecordedWhenGeneratedAgain: a try that a pause in
// abort mode stopped on its engine, asked for again after the resume by a
// request that says no retry (its caller never heard it start: the
// acknowledgement was lost, and a refusal while paused looked the same to
// it), is a second engine call of the act: the gateway records it as a
// retry of its own before the engine is called, so that the act's outcome
// says so. It was generated again unrecorded.
func TestATryAPauseAbortedIsRecordedWhenGeneratedAgain(t *testing.T) {
	hung := startHungEngine(t)
	ctx, b, caller := runGateway(t, actorgateway.Deps{Engines: &engine.Pool{Limit: 4}})
	body, err := schema.Marshal(&schema.ActorRequest{Rollout: 1, Key: "t1-s1", Try: 1, Engine: schema.Engine{URL: hung.URL}, Prompt: "Tool: search\nInput: x",
		Sampling: schema.Sampling{MaxNewTokens: 8}, DeadlineMs: time.Now().Add(time.Minute).UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	inbox := func() *nats.Subscription {
		sub, err := caller.SubscribeSync(caller.NewRespInbox())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		return sub
	}
	publish := func(to *nats.Subscription) {
		t.Helper()
		m := &nats.Msg{Subject: schema.ActorSubject, Reply: to.Subject, Header: nats.Header{}, Data: body}
		m.Header.Set(schema.HdrActorProgress, "1")
		if err := caller.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
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
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		publish(first)
		m, err := first.NextMsg(5 * time.Second)
		if err == nil && m.Header.Get(schema.HdrActorProgress) == schema.ActorStarted {
			break
		}
		if time.Now().After(deadline) { // the service may not be subscribed yet
			t.Fatalf("no acknowledgement: %v", err)
		}
	}
	for deadline := time.Now().Add(time.Minute); hung.started.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the generation never reached the engine")
		}
	}
	setRole(true, 1)
	if m := next(t, first); m.Header.Get(micro.ErrorCodeHeader) != actorgateway.CodePaused {
		t.Fatalf("answer to the aborted try: code %q (%s), want %s", m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader), actorgateway.CodePaused)
	}
	setRole(false, 2)
	var gateway string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		again := inbox()
		publish(again)
		m := next(t, again)
		if m.Header.Get(schema.HdrActorProgress) == schema.ActorStarted {
			gateway = m.Header.Get(schema.HdrActorGateway)
			break
		}
		if m.Header.Get(micro.ErrorCodeHeader) != actorgateway.CodePaused || time.Now().After(deadline) {
			t.Fatalf("the try asked again after the resume: code %q (%s), progress %q; want it started",
				m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader), m.Header.Get(schema.HdrActorProgress))
		}
	}
	for deadline := time.Now().Add(time.Minute); hung.started.Load() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the try generated again never reached the engine")
		}
	}
	m, err := b.LastMsg(ctx, bus.StreamAct, subject.ActRetries(1, 0, "t1-s1"))
	if err != nil || m == nil {
		t.Fatalf("the engine took try 1 twice, and no retry of the act is recorded (%v)", err)
	}
	var rec schema.ActRetries
	if err := m.Decode(&rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Retries) != 1 || rec.Retries[0].From != gateway || !strings.Contains(rec.Retries[0].Why, "pause") || rec.Try != 1 {
		t.Errorf("recorded %+v, want one retry of try 1 from gateway %s that names the pause", rec, gateway)
	}
}

// TestAnAnswerTooLargeForNATSIsAnError: a generation whose answer is
// larger than the NATS server takes (its max_payload) cannot reach its
// caller. Its callers are told so, naming the sizes, rather than nothing:
// the send failed, and the act-dispatcher, hearing silence, sent the act
// to other gateways, which generated it again, until its time-out.
func TestAnAnswerTooLargeForNATSIsAnError(t *testing.T) {
	text := strings.Repeat("a", 9<<20) // the embedded server takes 8 MiB
	reply := fmt.Sprintf(`{"text":%q,"output_ids":[5,6,7],"meta_info":{"finish_reason":{"type":"stop"},"prompt_tokens":3,"completion_tokens":3}}`, text)
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/tokenize":
			w.Write([]byte(`{"tokens":[1,2,3]}`))
		case "/generate":
			w.Write([]byte(reply))
		}
	}))
	t.Cleanup(eng.Close)
	_, _, caller := runGateway(t, actorgateway.Deps{Engines: &engine.Pool{Limit: 4}})
	body, err := schema.Marshal(&schema.ActorRequest{Rollout: 1, Key: "t1-s1", Try: 1, Engine: schema.Engine{URL: eng.URL}, Prompt: "Tool: search\nInput: x",
		Sampling: schema.Sampling{MaxNewTokens: 8}, DeadlineMs: time.Now().Add(time.Minute).UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	ask := func() *nats.Msg {
		t.Helper()
		sub, err := caller.SubscribeSync(caller.NewRespInbox())
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		m := &nats.Msg{Subject: schema.ActorSubject, Reply: sub.Subject, Header: nats.Header{}, Data: body}
		m.Header.Set(schema.HdrActorProgress, "1")
		if err := caller.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		for {
			a, err := sub.NextMsg(10 * time.Second)
			if errors.Is(err, nats.ErrNoResponders) {
				return nil
			}
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			if a.Header.Get(schema.HdrActorProgress) == "" {
				return a
			}
		}
	}
	var got *nats.Msg
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if got = ask(); got != nil {
			break
		}
		if time.Now().After(deadline) { // the service may not be subscribed yet
			t.Fatal("no actor-gateway")
		}
	}
	for i, a := range []*nats.Msg{got, ask()} { // and again, from what it keeps
		if code, desc := a.Header.Get(micro.ErrorCodeHeader), a.Header.Get(micro.ErrorHeader); code != actorgateway.CodeInvalid || !strings.Contains(desc, "max_payload") {
			t.Errorf("answer %d: %q (%s), want %s naming max_payload", i+1, code, desc, actorgateway.CodeInvalid)
		}
	}
}
