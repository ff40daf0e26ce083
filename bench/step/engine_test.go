package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	actdispatcher "github.com/planact/planact/services/act-dispatcher"
	plannergateway "github.com/planact/planact/services/planner-gateway"
)

// fastModel is the default model with times a thousand times shorter.
func fastModel() Model {
	m := defaultModel()
	for _, em := range []*EngineModel{&m.Planner, &m.Actor} {
		em.TTFT.Median /= 1000
		em.PerToken.Median /= 1000
		em.Stragglers = 0
	}
	return m
}

func startEngine(t *testing.T, m *Model, role string) (*httptest.Server, engine.Client) {
	t.Helper()
	em := m.Planner
	if role == roleActor {
		em = m.Actor
	}
	srv := httptest.NewServer(newBenchEngine(role, em, &scripts{m: m, by: map[[2]int64]*Episode{}}, role+"-v1"))
	t.Cleanup(srv.Close)
	c, err := engine.New(engine.ProtocolSGLang, srv.URL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return srv, c
}

func engineCalls(t *testing.T, url string) Calls {
	t.Helper()
	var cs Calls
	if err := getJSON(context.Background(), url+"/bench/calls", &cs); err != nil {
		t.Fatal(err)
	}
	return cs
}

// An episode's turns, as planact's own prompt and observations write them,
// through planact's own SGLang client: each turn gets the script's output,
// token-exact with log-probs and the engine's weight version, and the
// engine records which turn it served and the time it drew.
func TestPlannerTurnsAsPlanactAsks(t *testing.T) {
	m := fastModel()
	srv, c := startEngine(t, &m, rolePlanner)
	ep := m.Episode(7, 3)
	prompt := plannergateway.RenderPrompt(schema.Task{Prompt: m.TaskPrompt(7, m.Group(3))}, schema.DefaultConfig())
	for ti, turn := range ep.Turns {
		g, err := c.Generate(context.Background(), engine.Request{InputIDs: sim.Encode(prompt), RoutingKey: engine.EpisodeKey(7, 3)})
		if err != nil {
			t.Fatalf("turn %d: %v", ti+1, err)
		}
		want := append(sim.Encode(turn.Planner.Text), sim.EOSID)
		if g.Text != turn.Planner.Text || !slices.Equal(g.OutputIDs, want) || len(g.LogProbs) != len(want) || g.WeightVersion != "planner-v1" || g.FinishReason != engine.FinishStop {
			t.Fatalf("turn %d: got %q (%d ids, %d log-probs, version %q, %s), want the script's %q",
				ti+1, g.Text, len(g.OutputIDs), len(g.LogProbs), g.WeightVersion, g.FinishReason, turn.Planner.Text)
		}
		// The act-dispatcher's observation of the turn's acts.
		var obs strings.Builder
		obs.WriteString("\n<observation>\n")
		for k, a := range turn.Acts {
			obs.WriteString("s" + strconv.Itoa(k+1) + " search(\"" + a.Query + "\") -> " + a.Gen.Text + "\n")
		}
		obs.WriteString("</observation>\n")
		prompt += g.Text + obs.String()
	}
	cs := engineCalls(t, srv.URL)
	if len(cs.Calls) != len(ep.Turns) {
		t.Fatalf("%d calls recorded, want %d", len(cs.Calls), len(ep.Turns))
	}
	for i, call := range cs.Calls {
		if call.Outcome != "ok" || call.Rollout != 7 || call.Episode != 3 || call.Turn != i+1 || call.Node != -1 ||
			call.ServiceNs != int64(ep.Turns[i].Planner.Service()) || call.AdmittedNs < call.ArrivedNs || call.DoneNs < call.AdmittedNs {
			t.Errorf("call %d: %+v", i, call)
		}
	}
}

// The actor engine serves at most its limit at once; the rest wait, and
// every act is recorded with the dependencies of its plan.
func TestActorEngineServesItsLimitAtOnce(t *testing.T) {
	m := fastModel()
	m.Actor.Limit = 2
	srv, c := startEngine(t, &m, roleActor)
	var ep Episode
	for e := 0; ; e++ {
		if ep = m.Episode(1, e); len(ep.Turns) > 1 && len(ep.Turns[0].Acts) >= 4 {
			break
		}
	}
	acts := ep.Turns[0].Acts
	var wg sync.WaitGroup
	errs := make(chan error, len(acts))
	for _, a := range acts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prompt := actdispatcher.ActorPrompt(schema.Tool{Name: "search"}, strings.ReplaceAll(a.Query, "{s1}", "an output"))
			g, err := c.Generate(context.Background(), engine.Request{InputIDs: sim.Encode(prompt), RoutingKey: engine.EpisodeKey(1, ep.Index)})
			if err == nil && g.Text != a.Gen.Text {
				err = &textError{g.Text, a.Gen.Text}
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	cs := engineCalls(t, srv.URL)
	var evs []event
	for _, call := range cs.Calls {
		if call.Outcome != "ok" || call.Turn != 1 || !slices.Equal(call.Deps, acts[call.Node].Deps) {
			t.Errorf("call %+v", call)
		}
		evs = append(evs, event{call.AdmittedNs, 1, 0}, event{call.DoneNs, -1, 0})
	}
	if run, _, _ := peaks(evs); run > 2 || len(cs.Calls) != len(acts) {
		t.Errorf("%d calls, at most %d admitted at once: want %d calls, at most 2", len(cs.Calls), run, len(acts))
	}
}

type textError struct{ got, want string }

func (e *textError) Error() string { return "got " + e.got + ", want " + e.want }

// A client that goes away is recorded as such (a pause's abort, a
// stopped episode); a request the engine cannot place is refused with a
// reason.
func TestEngineRecordsDisconnectsAndRefusals(t *testing.T) {
	m := fastModel()
	m.Planner.TTFT = LogNormal{Median: 3600}
	srv, _ := startEngine(t, &m, rolePlanner)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		// A client that only hangs up: pkg/engine's also sends
		// /abort_request, and whichever the engine sees first would
		// decide the outcome (TestEngineAborts has the abort).
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/generate", strings.NewReader(`{"text":"Question: q","rid":"gone-1"}`))
		if err != nil {
			done <- err
			return
		}
		req.Header.Set(engine.RoutingKeyHeader, engine.EpisodeKey(1, 0))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		// The engine records a call when it leaves: wait until this one
		// is in the engine.
		e := srv.Config.Handler.(*benchEngine)
		e.mu.Lock()
		n := len(e.running)
		e.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the request never reached the engine")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	for {
		cs := engineCalls(t, srv.URL)
		if len(cs.Calls) == 1 {
			if cs.Calls[0].Outcome != "disconnected" {
				t.Errorf("outcome %q, want disconnected", cs.Calls[0].Outcome)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the disconnect was never recorded")
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Post(srv.URL+"/generate", "application/json", strings.NewReader(`{"text":"Question: q"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Message string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body.Message, "X-SMG-Routing-Key") {
		t.Errorf("no routing key: %d %q, want 400 naming the header", resp.StatusCode, body.Message)
	}
}

// POST /abort_request ends the generation it names: the engine answers
// it with finish reason abort and records the call as aborted.
func TestEngineAborts(t *testing.T) {
	m := fastModel()
	m.Planner.TTFT = LogNormal{Median: 3600}
	srv, c := startEngine(t, &m, rolePlanner)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type reply struct {
		gen engine.Generation
		err error
	}
	done := make(chan reply, 1)
	go func() {
		res, err := c.Generate(ctx, engine.Request{Text: "Question: q", RoutingKey: engine.EpisodeKey(1, 0), ID: "to-abort"})
		done <- reply{res, err}
	}()
	e := srv.Config.Handler.(*benchEngine)
	for {
		e.mu.Lock()
		_, in := e.running["to-abort"]
		e.mu.Unlock()
		if in {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the request never reached the engine")
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Post(srv.URL+"/abort_request", "application/json", strings.NewReader(`{"rid":"to-abort"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	r := <-done
	if r.err != nil || r.gen.FinishReason != engine.FinishAbort {
		t.Fatalf("the aborted generation: %+v, %v; want finish reason abort", r.gen, r.err)
	}
	cs := engineCalls(t, srv.URL)
	if len(cs.Calls) != 1 || cs.Calls[0].Outcome != "aborted" {
		t.Errorf("calls %+v, want one, aborted", cs.Calls)
	}
}

// With a bounded queue, a request beyond it is answered 429 with
// Retry-After, and the engine's gauges say what runs and what waits.
func TestEngineAnswersBusyBeyondItsQueue(t *testing.T) {
	m := fastModel()
	m.Planner.TTFT = LogNormal{Median: 3600}
	m.Planner.Limit, m.Planner.QueueLimit = 1, 1
	srv, c := startEngine(t, &m, rolePlanner)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for e := range 2 {
		go func() {
			_, _ = c.Generate(ctx, engine.Request{Text: "Question: q", RoutingKey: engine.EpisodeKey(1, e)})
		}()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		resp.Body.Close()
		if strings.Contains(b.String(), `sglang:num_running_reqs{model_name="bench-planner"} 1`) &&
			strings.Contains(b.String(), `sglang:num_queue_reqs{model_name="bench-planner"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("one running and one waiting never showed:\n%s", b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Post(srv.URL+"/generate", "application/json", strings.NewReader(`{"text":"Question: q","routing_key":"1-2"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a third request: %s, Retry-After %q; want 429 with Retry-After", resp.Status, resp.Header.Get("Retry-After"))
	}
}
