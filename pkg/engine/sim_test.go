package engine

// Tests over real HTTP against the simulated engines of pkg/sim, which
// speak SGLang's and vLLM's protocols.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/sim"
)

const actorPrompt = "Tool: search\nInput: capital of France\n"

// waitFor polls cond until it holds, failing the test after a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func serveSim(t *testing.T, cfg sim.Config) (*sim.Engine, string) {
	t.Helper()
	e := sim.New(cfg)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return e, srv.URL
}

func plannerPrompt(t *testing.T) string {
	q := sim.DefaultWorld().Tasks(1, 1)[0].Question
	return "You are a planner. Tools:\n- search: look up one fact\nPlan format: graph\nQuestion: " + q + "\n"
}

// TestChatConversationIsTokenExact plays two planner turns through a chat
// engine as the planner-gateway does: the conversation of turn 2 is built
// from turn 1's messages with their ids, the server's rendering of it begins
// with the trajectory so far, and what it adds is the observation with the
// template's glue. The trajectory equals the ids the engine generated from.
func TestChatConversationIsTokenExact(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			e, url := serveSim(t, sim.Config{Role: sim.RolePlanner, Seed: 4})
			c, err := New(ProtocolOpenAIChat, url+"/v1", "sim-planner", nil)
			if err != nil {
				t.Fatal(err)
			}
			gen := func(r Request) Generation {
				t.Helper()
				var g Generation
				var err error
				if stream {
					g, err = c.(Streamer).GenerateStream(context.Background(), r, nil)
				} else {
					g, err = c.Generate(context.Background(), r)
				}
				if err != nil {
					t.Fatal(err)
				}
				return g
			}
			prompt := plannerPrompt(t)
			r1 := Request{Messages: []Message{{Role: RoleUser, Text: prompt}}, RoutingKey: "5-0"}
			g1 := gen(r1)
			promptIDs := TrajectoryIDs(r1, g1, nil)
			if want := append(append(sim.Encode("<|user|>\n"+prompt), sim.EOSID), sim.Encode("<|assistant|>\n")...); !reflect.DeepEqual(promptIDs, want) {
				t.Fatalf("turn 1 prompt ids: %v\nwant the template's %v", promptIDs, want)
			}
			if len(g1.OutputIDs) == 0 || g1.OutputIDs[len(g1.OutputIDs)-1] != sim.EOSID || len(g1.LogProbs) != len(g1.OutputIDs) || !strings.Contains(g1.Text, "<graph>") {
				t.Fatalf("turn 1 = %+v", g1)
			}
			obs := "\n<observation>\ns1 search(\"x\") -> y\n</observation>\n"
			r2 := Request{Messages: []Message{
				{Role: RoleUser, Text: prompt, IDs: promptIDs},
				{Role: RoleAssistant, Text: g1.Text, IDs: g1.OutputIDs},
				{Role: RoleUser, Text: obs},
			}, RoutingKey: "5-0"}
			g2 := gen(r2)
			trajectory := slices.Concat(promptIDs, g1.OutputIDs)
			if !slices.Equal(g2.PromptIDs[:len(trajectory)], trajectory) {
				t.Fatal("turn 2's prompt does not begin with the trajectory")
			}
			obsIDs := TrajectoryIDs(r2, g2, sim.Encode(obs))
			if want := slices.Concat(sim.Encode("<|user|>\n"+obs), []int{sim.EOSID}, sim.Encode("<|assistant|>\n")); !slices.Equal(obsIDs, want) {
				t.Errorf("observation ids %v\nwant %v", obsIDs, want)
			}
			if got := slices.Concat(trajectory, obsIDs); !slices.Equal(got, g2.PromptIDs) {
				t.Error("trajectory + observation is not what the engine generated from")
			}
			if g2.PromptTokens != len(g2.PromptIDs) || g2.FinishReason != FinishStop {
				t.Errorf("turn 2 = %+v", g2)
			}
			if keys := e.RoutingKeys(); keys["5-0"] != 2 {
				t.Errorf("routing keys %v", keys)
			}
		})
	}
}

// TestChatTemplateRetokenizes: a template that drops <think> from earlier
// turns (Qwen3's does) renders a history that is not the trajectory: a
// permanent error that says so, not a sample that lies.
func TestChatTemplateRetokenizes(t *testing.T) {
	_, url := serveSim(t, sim.Config{Role: sim.RolePlanner, Seed: 4, ChatStripThink: true})
	c, _ := New(ProtocolOpenAIChat, url, "sim-planner", nil)
	prompt := plannerPrompt(t)
	r1 := Request{Messages: []Message{{Role: RoleUser, Text: prompt}}}
	g1, err := c.Generate(context.Background(), r1)
	if err != nil || !strings.Contains(g1.Text, "<think>") {
		t.Fatalf("turn 1: %+v, %v", g1, err)
	}
	_, err = c.Generate(context.Background(), Request{Messages: []Message{
		{Role: RoleUser, Text: prompt, IDs: TrajectoryIDs(r1, g1, nil)},
		{Role: RoleAssistant, Text: g1.Text, IDs: g1.OutputIDs},
		{Role: RoleUser, Text: "\n<observation>\n</observation>\n"},
	}})
	if fail.KindOf(err) != fail.Permanent || !errors.Is(err, ErrTokenDrift) || !strings.Contains(err.Error(), "re-rendered the conversation") {
		t.Errorf("turn 2: %v (kind %v), want a permanent re-tokenization error", err, fail.KindOf(err))
	}
}

// TestChatActor: a single-turn prompt as text; the prompt's ids are the
// template's rendering of it.
func TestChatActor(t *testing.T) {
	_, url := serveSim(t, sim.Config{Role: sim.RoleActor, Seed: 1, WeightVersion: "a1"})
	c, _ := New(ProtocolOpenAIChat, url, "sim-actor", nil)
	r := Request{InputIDs: sim.Encode(actorPrompt), Text: actorPrompt}
	g, err := c.Generate(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	wantPrompt := slices.Concat(sim.Encode("<|user|>\n"+actorPrompt), []int{sim.EOSID}, sim.Encode("<|assistant|>\n"))
	if g.Text != "Paris" || !slices.Equal(g.OutputIDs, append(sim.Encode("Paris"), sim.EOSID)) || len(g.LogProbs) != 6 ||
		g.WeightVersion != "a1" || !slices.Equal(TrajectoryIDs(r, g, r.InputIDs), wantPrompt) {
		t.Errorf("generation = %+v", g)
	}
}

// stickyRouter is a tiny router in front of engines: it picks one by a hash
// of the X-SMG-Routing-Key header, as sgl-model-gateway's consistent_hashing
// policy does (and at random without one).
func stickyRouter(t *testing.T, backends ...string) string {
	t.Helper()
	proxies := make([]*httputil.ReverseProxy, len(backends))
	for i, b := range backends {
		u, err := url.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		proxies[i] = httputil.NewSingleHostReverseProxy(u)
	}
	var n atomic.Uint32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if key := r.Header.Get(RoutingKeyHeader); key != "" {
			h := fnv.New32a()
			h.Write([]byte(key))
			i = h.Sum32()
		}
		proxies[int(i%uint32(len(proxies)))].ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestRoutingIsSticky: behind a router, every request of an episode, by
// every protocol, reaches the same engine.
func TestRoutingIsSticky(t *testing.T) {
	a, urlA := serveSim(t, sim.Config{Role: sim.RoleActor})
	b, urlB := serveSim(t, sim.Config{Role: sim.RoleActor})
	router := stickyRouter(t, urlA, urlB)
	ctx := context.Background()
	for _, proto := range Protocols {
		c, _ := New(proto, router, "sim-actor", nil)
		for episode := range 8 {
			for range 2 {
				if _, err := c.Generate(ctx, Request{InputIDs: sim.Encode(actorPrompt), Text: actorPrompt, RoutingKey: EpisodeKey(12, episode)}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	keysA, keysB := a.RoutingKeys(), b.RoutingKeys()
	if len(keysA) == 0 || len(keysB) == 0 {
		t.Fatalf("one engine got every episode: %v / %v", keysA, keysB)
	}
	for episode := range 8 {
		key := EpisodeKey(12, episode)
		if keysA[key]+keysB[key] != 2*len(Protocols) || (keysA[key] != 0 && keysB[key] != 0) {
			t.Errorf("episode %s: %d requests on one engine, %d on the other", key, keysA[key], keysB[key])
		}
	}
}

// TestBusyEngine: 429 and 503 are tried again inside the client, as
// Retry-After says (however long, up to the caller's deadline) or with
// back-off, within the caller's context; an engine that asks for a wait
// past the deadline is refused at once, in its own words, for good.
func TestBusyEngine(t *testing.T) {
	quick := Backoff{Base: time.Millisecond, Max: 10 * time.Second}
	for _, tc := range []struct {
		name       string
		retryAfter string
		marker     string
		backoff    Backoff
		timeout    time.Duration
		requests   int64
		ok         bool
		after      time.Duration // the error's fail.RetryAfter, when named
		named      bool
		busy       bool // refused for good: ErrBusy
	}{
		{"429 twice, Retry-After 0", "0", sim.FaultTimes(sim.FaultBusy, 2), quick, 0, 3, true, 0, false, false},
		{"429 twice, Retry-After a past date", "Mon, 02 Jan 2006 15:04:05 GMT", sim.FaultTimes(sim.FaultBusy, 2), quick, 0, 3, true, 0, false, false},
		{"503 twice, back-off", "", sim.FaultTimes(sim.FaultUnavailable, 2), quick, 0, 3, true, 0, false, false},
		{"429 always: out of attempts", "0", sim.FaultBusy, Backoff{Attempts: 3, Base: time.Millisecond}, 0, 3, false, 0, true, false},
		{"503 always: out of attempts", "", sim.FaultUnavailable, Backoff{Attempts: 2, Base: time.Millisecond}, 0, 2, false, 0, false, false},
		{"Retry-After past the deadline", "3600", sim.FaultBusy, quick, time.Minute, 1, false, time.Hour, true, true},
		{"Retry-After past Max, no deadline", "60", sim.FaultBusy, Backoff{Max: time.Second}, 0, 1, false, time.Minute, true, false},
		{"Retry-After past Max, within the deadline", "1", sim.FaultTimes(sim.FaultBusy, 1), Backoff{Max: 10 * time.Millisecond}, time.Minute, 2, true, 0, false, false},
	} {
		for _, proto := range Protocols {
			t.Run(tc.name+"/"+proto, func(t *testing.T) {
				e, url := serveSim(t, sim.Config{Role: sim.RoleActor, RetryAfter: tc.retryAfter})
				c, _ := NewClient(proto, url, Options{Model: "sim-actor", Backoff: tc.backoff})
				ctx := context.Background()
				if tc.timeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.timeout)
					defer cancel()
				}
				prompt := "Tool: search\nInput: capital of France " + tc.marker + "\n"
				g, err := c.Generate(ctx, Request{InputIDs: sim.Encode(prompt), Text: prompt})
				if n, _ := e.Stats(); n != tc.requests {
					t.Errorf("%d requests, want %d", n, tc.requests)
				}
				if tc.ok {
					if err != nil || g.Text != "Paris" {
						t.Errorf("Generate = %+v, %v", g, err)
					}
					return
				}
				after, named := fail.RetryAfter(err)
				kind := fail.Transient
				if tc.busy {
					kind = fail.Permanent
					if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "429 Too Many Requests") || !strings.Contains(err.Error(), "Retry-After") {
						t.Errorf("error %v: want ErrBusy, in the engine's words", err)
					}
				}
				if fail.KindOf(err) != kind || after != tc.after || named != tc.named {
					t.Errorf("error %v (kind %v, retry after %v %v), want %v, retry after %v", err, fail.KindOf(err), after, named, kind, tc.after)
				}
			})
		}
	}
}

// TestBusyEngineCancelled: a caller that gives up while waiting out a busy
// engine gets its context's error at once.
func TestBusyEngineCancelled(t *testing.T) {
	e, url := serveSim(t, sim.Config{Role: sim.RoleActor, RetryAfter: "20"})
	c, _ := New(ProtocolSGLang, url, "", nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Generate(ctx, Request{Text: actorPrompt + sim.FaultBusy})
		errc <- err
	}()
	waitFor(t, "the first request", func() bool { n, _ := e.Stats(); return n == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("Generate = %v, want context.Canceled", err)
	}
}

// TestAbortOnCancel: when the caller gives up while a generation runs, the
// engine hears of it: SGLang by POST /abort_request with the request's rid,
// OpenAI-compatible servers by the connection closing.
func TestAbortOnCancel(t *testing.T) {
	for _, tc := range []struct {
		proto  string
		stream bool
		by     string
	}{
		{ProtocolSGLang, false, "abort_request"},
		{ProtocolSGLang, true, "abort_request"},
		{ProtocolOpenAI, false, "disconnect"},
		{ProtocolOpenAI, true, "disconnect"},
		{ProtocolOpenAIChat, false, "disconnect"},
		{ProtocolOpenAIChat, true, "disconnect"},
	} {
		for _, deadline := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v/deadline=%v", tc.proto, tc.stream, deadline), func(t *testing.T) {
				e, url := serveSim(t, sim.Config{Role: sim.RoleActor})
				c, _ := New(tc.proto, url, "sim-actor", nil)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var expire func()
				if deadline {
					// The deadline passes once the engine runs the
					// generation: a real timer could pass before the
					// request reaches a loaded engine, testing nothing.
					ctx, expire = withDeadlineAtWill(ctx)
				}
				prompt := "Tool: search\nInput: capital of France " + sim.FaultActorHang + "\n"
				r := Request{InputIDs: sim.Encode(prompt), Text: prompt, RoutingKey: "9-2"}
				errc := make(chan error, 1)
				go func() {
					var err error
					if tc.stream {
						_, err = c.(Streamer).GenerateStream(ctx, r, nil)
					} else {
						_, err = c.Generate(ctx, r)
					}
					errc <- err
				}()
				waitFor(t, "the generation running", func() bool { return e.InFlight() == 1 })
				if deadline {
					expire()
				} else {
					cancel()
				}
				if err := <-errc; err == nil {
					t.Fatal("a cancelled generation returned no error")
				}
				waitFor(t, "the engine seeing the abort", func() bool {
					for _, a := range e.Aborts() {
						if a.By == tc.by && (tc.by != "abort_request" || strings.HasPrefix(a.RID, "planact-9-2-")) {
							return true
						}
					}
					return false
				})
				waitFor(t, "the engine idle", func() bool { return e.InFlight() == 0 })
			})
		}
	}
}

// TestAbortNamedRequest: Request.ID is the rid the engine knows it by, and
// aborting it ends the generation with what it had, finish reason abort.
func TestAbortNamedRequest(t *testing.T) {
	e, url := serveSim(t, sim.Config{Role: sim.RoleActor})
	c, _ := New(ProtocolSGLang, url, "", nil)
	gc := make(chan Generation, 1)
	go func() {
		g, err := c.Generate(context.Background(), Request{Text: actorPrompt + sim.FaultActorHang, ID: "act-7"})
		if err != nil {
			t.Error(err)
		}
		gc <- g
	}()
	waitFor(t, "the generation running", func() bool { return e.InFlight() == 1 })
	if err := c.(*SGLang).Abort(context.Background(), "act-7"); err != nil {
		t.Fatal(err)
	}
	if g := <-gc; g.FinishReason != FinishAbort || len(g.OutputIDs) != 0 {
		t.Errorf("aborted generation = %+v", g)
	}
	if a := e.Aborts(); len(a) != 1 || a[0] != (sim.Abort{RID: "act-7", By: "abort_request", Running: true}) {
		t.Errorf("aborts %+v", a)
	}
}

// TestPauseResume: Pause and Resume over each protocol and mode, as the
// simulated engine behaves like SGLang and vLLM: mode abort ends a running
// generation with finish reason abort; in_place (vLLM's keep) holds it and
// it finishes after Resume; wait (vLLM's) returns once it has finished.
// In every mode a request sent while paused waits for Resume.
func TestPauseResume(t *testing.T) {
	for _, tc := range []struct {
		proto  string
		mode   PauseMode
		finish string // of the generation running when the engine pauses
		mark   string // pause_mode the engine reports
	}{
		{ProtocolSGLang, PauseAbort, FinishAbort, "abort"},
		{ProtocolSGLang, PauseInPlace, FinishStop, "in_place"},
		{ProtocolSGLang, PauseRetract, FinishStop, "retract"},
		{ProtocolOpenAI, PauseAbort, FinishAbort, "abort"},
		{ProtocolOpenAI, PauseInPlace, FinishStop, "keep"},
		{ProtocolOpenAI, PauseWait, FinishStop, "wait"},
		{ProtocolOpenAIChat, PauseAbort, FinishAbort, "abort"},
		{ProtocolOpenAIChat, PauseWait, FinishStop, "wait"},
	} {
		t.Run(tc.proto+"/"+string(tc.mode), func(t *testing.T) {
			t.Parallel() // each mostly waits on its own engine
			// 10ms a token, one token a chunk: the planner writes for about
			// 3 s, so that the pause lands while it writes even on a loaded
			// machine (at 2ms a token it could finish first).
			e, url := serveSim(t, sim.Config{Role: sim.RolePlanner, Seed: 4, PerToken: 10 * time.Millisecond})
			c, _ := New(tc.proto, url, "sim-planner", nil)
			ctx := context.Background()
			prompt := plannerPrompt(t)
			r := Request{InputIDs: sim.Encode(prompt), Text: prompt}
			first := make(chan struct{})
			var chunks atomic.Int64
			running := make(chan Generation, 1)
			go func() {
				g, err := c.(Streamer).GenerateStream(ctx, r, func(string) {
					if chunks.Add(1) == 1 {
						close(first)
					}
				})
				if err != nil {
					t.Error(err)
				}
				running <- g
			}()
			<-first
			if err := c.Pause(ctx, tc.mode); err != nil {
				t.Fatal(err)
			}
			if paused, mode := e.Paused(); !paused || mode != tc.mark {
				t.Fatalf("engine paused %v in mode %q", paused, mode)
			}
			var g Generation
			if tc.finish == FinishAbort || tc.mode == PauseWait {
				g = <-running // ended by the pause, or finished before Pause returned
			}
			// A request sent while paused waits.
			queued := make(chan Generation, 1)
			go func() {
				g, err := c.Generate(ctx, Request{InputIDs: sim.Encode(actorPrompt), Text: actorPrompt})
				if err != nil {
					t.Error(err)
				}
				queued <- g
			}()
			busy := 1
			if g.FinishReason != "" {
				busy = 0
			}
			waitFor(t, "the new request in the engine", func() bool { return e.InFlight() == busy+1 })
			held := chunks.Load()
			select {
			case g := <-queued:
				t.Fatalf("a request ran while the engine was paused: %+v", g)
			case g := <-running:
				t.Fatalf("a held generation finished while the engine was paused: %+v", g)
			default:
			}
			if tc.finish != FinishAbort && tc.mode != PauseWait && chunks.Load() != held {
				t.Error("a held generation went on streaming while paused")
			}
			if err := c.Resume(ctx); err != nil {
				t.Fatal(err)
			}
			if g.FinishReason == "" {
				g = <-running
			}
			if g.FinishReason != tc.finish || (tc.finish == FinishAbort && len(g.OutputIDs) == 0) {
				t.Errorf("running generation = %q (%d tokens), want finish %s", g.FinishReason, len(g.OutputIDs), tc.finish)
			}
			if q := <-queued; q.FinishReason != FinishStop {
				t.Errorf("queued request = %+v", q)
			}
			if paused, _ := e.Paused(); paused {
				t.Error("engine still paused after Resume")
			}
		})
	}
}

// TestWeightVersion reads the version each protocol reports, before and
// after a weight update (SGLang's /update_weights_from_disk).
func TestWeightVersion(t *testing.T) {
	e, url := serveSim(t, sim.Config{Role: sim.RoleActor, WeightVersion: "step-1"})
	ctx := context.Background()
	for _, version := range []string{"step-1", "step-2"} {
		if version != "step-1" {
			c, _ := New(ProtocolSGLang, url, "", nil)
			if err := c.(*SGLang).doJSON(ctx, http.MethodPost, "/update_weights_from_disk",
				map[string]any{"model_path": "/ckpt/step-2", "weight_version": version}, nil, nil); err != nil {
				t.Fatal(err)
			}
		}
		for _, proto := range Protocols {
			c, _ := New(proto, url, "sim-actor", nil)
			if v, err := c.WeightVersion(ctx); v != version || err != nil {
				t.Errorf("%s WeightVersion = %q, %v; want %q", proto, v, err, version)
			}
		}
	}
	if e.ModelPath() != "/ckpt/step-2" {
		t.Errorf("model path %q", e.ModelPath())
	}
}

// withDeadlineAtWill returns a context that reports a deadline and passes
// it (Done closed, Err context.DeadlineExceeded) when expire is called.
func withDeadlineAtWill(parent context.Context) (ctx context.Context, expire func()) {
	d := &deadlineAtWill{Context: parent, at: time.Now().Add(time.Hour), done: make(chan struct{})}
	var once sync.Once
	return d, func() { once.Do(func() { close(d.done) }) }
}

type deadlineAtWill struct {
	context.Context
	at   time.Time
	done chan struct{}
}

func (d *deadlineAtWill) Deadline() (time.Time, bool) { return d.at, true }
func (d *deadlineAtWill) Done() <-chan struct{}       { return d.done }
func (d *deadlineAtWill) Err() error {
	select {
	case <-d.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// TestAbortAnsweredBeforeReturn: a generation given up returns only once
// the engine has answered its /abort_request, so that what counts it as
// running (a pause's drain) never says drained while the engine still
// generates for an abort on its way.
func TestAbortAnsweredBeforeReturn(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			e := sim.New(sim.Config{Role: sim.RoleActor})
			heard, release := make(chan struct{}), make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/abort_request" {
					close(heard)
					<-release
				}
				e.ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free) // before srv.Close, which waits for the handler
			c, _ := New(ProtocolSGLang, srv.URL, "sim-actor", nil)
			ctx, cancel := context.WithCancel(context.Background())
			prompt := "Tool: search\nInput: capital of France " + sim.FaultActorHang + "\n"
			r := Request{InputIDs: sim.Encode(prompt), Text: prompt, RoutingKey: "9-2"}
			errc := make(chan error, 1)
			go func() {
				var err error
				if stream {
					_, err = c.(Streamer).GenerateStream(ctx, r, nil)
				} else {
					_, err = c.Generate(ctx, r)
				}
				errc <- err
			}()
			waitFor(t, "the generation running", func() bool { return e.InFlight() == 1 })
			cancel()
			<-heard
			select {
			case err := <-errc:
				t.Fatalf("Generate returned (%v) while the engine had not answered the abort", err)
			default:
			}
			free()
			if err := <-errc; err == nil {
				t.Fatal("a cancelled generation returned no error")
			}
			// The connection's close may reach the engine first; the
			// abort_request must have been answered by now.
			a := e.Aborts()
			if !slices.ContainsFunc(a, func(a sim.Abort) bool { return a.By == "abort_request" }) {
				t.Errorf("aborts the engine saw when Generate returned: %+v", a)
			}
		})
	}
}

// TestABrokenStreamIsAborted: a stream that breaks after the engine took
// the request (a proxy cuts it) fails the generation, which is then tried
// again; the engine, which may still be generating it for nobody, used to
// be told nothing, and ran two copies of the turn beside the share planact
// keeps of it. It is now told to abort the request, by its rid.
func TestABrokenStreamIsAborted(t *testing.T) {
	aborted := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/abort_request":
			var body struct {
				RID string `json:"rid"`
			}
			_ = json.NewDecoder(r.Body).Decode(&body)
			aborted <- body.RID
		case "/generate":
			var body struct {
				RID string `json:"rid"`
			}
			_ = json.NewDecoder(r.Body).Decode(&body)
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"text\": \"s1\", \"output_ids\": [5], \"meta_info\": {\"id\": %q}}\n\n", body.RID)
			w.(http.Flusher).Flush()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close() // cut mid-stream
			}
		}
	}))
	t.Cleanup(srv.Close)
	c, _ := New(ProtocolSGLang, srv.URL, "m", nil)
	_, err := c.(Streamer).GenerateStream(context.Background(), Request{InputIDs: []int{1, 2}, RoutingKey: "9-2"}, nil)
	if err == nil {
		t.Fatal("a stream cut mid-way returned no error")
	}
	select {
	case rid := <-aborted:
		if !strings.HasPrefix(rid, "planact-9-2-") {
			t.Errorf("abort_request for rid %q, want the generation's (planact-9-2-…)", rid)
		}
	default:
		t.Errorf("the stream broke (%v) and the engine was not told to abort the request", err)
	}
}
