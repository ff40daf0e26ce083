package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/sim"
)

// The engine process serves a planner engine and an actor engine, each on
// its own address, speaking the part of SGLang's native HTTP API that
// planact uses (POST /generate, /tokenize, /abort_request,
// /update_weight_version; GET /get_weight_version, /get_model_info,
// /health). Each serves its Limit generations at once and queues the rest
// in arrival order; a generation holds its slot for the service time the
// model draws for it, and every generation request is recorded (GET
// /bench/calls) with its identity, the times it arrived, was admitted and
// left, and its drawn service time.
//
// The identity of a generation — which turn of which episode, or which act
// — comes from what planact sends: the routing key (X-SMG-Routing-Key,
// "<rollout>-<episode>", or SGLang's routing_key), then for the planner the
// number of <observation> blocks in the prompt (turn n has n-1: the line
// "<observation>" the act-dispatcher opens each with) and for the
// actor the "t<turn> n<node>" tag that the model's plans put at the start
// of every act's input. A header naming the generation (GenerationHeaders)
// is recorded too when planact sends one.

// GenerationHeaders are headers planact may send naming a generation.
var GenerationHeaders = []string{"Planact-Generation", "X-Planact-Generation"}

// Call is one generation request as an engine saw it.
type Call struct {
	Role    string `json:"role"`
	Rollout int64  `json:"rollout"`
	Episode int    `json:"episode"`
	Turn    int    `json:"turn"`
	Node    int    `json:"node"` // act index in its plan; -1 for the planner
	Deps    []int  `json:"deps,omitempty"`
	RID     string `json:"rid,omitempty"`
	// Generation is the value of a GenerationHeaders header, if planact sent one.
	Generation string `json:"generation,omitempty"`
	ArrivedNs  int64  `json:"arrived_ns"`
	QueuedNs   int64  `json:"queued_ns,omitempty"`   // read and placed: waits for a slot from here
	AdmittedNs int64  `json:"admitted_ns,omitempty"` // 0: never admitted
	DoneNs     int64  `json:"done_ns"`
	ServiceNs  int64  `json:"service_ns"` // drawn
	Tokens     int    `json:"tokens"`     // drawn output length
	Prompt     int    `json:"prompt_tokens"`
	// Outcome: ok, aborted (POST /abort_request or a weight update that
	// aborts), disconnected (the client went away: planact gave up or was
	// paused), cut (max_new_tokens below the drawn length), busy (answered
	// 429: the queue was full) or refused (a request the engine could not
	// place; Error says why).
	Outcome string `json:"outcome"`
	Error   string `json:"error,omitempty"`
}

// Calls is what GET /bench/calls returns.
type Calls struct {
	Role      string      `json:"role"`
	Limit     int         `json:"limit"`
	Tokenizes int64       `json:"tokenizes"`
	Calls     []Call      `json:"calls"`
	Model     EngineModel `json:"model"`
}

// scripts caches episode scripts, shared by the two engines of a process.
type scripts struct {
	m  *Model
	mu sync.Mutex
	by map[[2]int64]*Episode
}

func (s *scripts) get(r int64, e int) *Episode {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]int64{r, int64(e)}
	if ep, ok := s.by[k]; ok {
		return ep
	}
	ep := s.m.Episode(r, e)
	s.by[k] = &ep
	return &ep
}

// benchEngine is one simulated engine with the latency model.
type benchEngine struct {
	role    string
	em      EngineModel
	scripts *scripts
	slots   chan struct{}
	mux     *http.ServeMux
	waiting atomic.Int64 // requests waiting for a slot
	inSlot  atomic.Int64 // requests holding one

	mu        sync.Mutex
	version   string
	calls     []Call
	running   map[string]chan string // rid → closed with the reason of an abort
	tokenizes int64
}

func newBenchEngine(role string, em EngineModel, s *scripts, version string) *benchEngine {
	e := &benchEngine{role: role, em: em, scripts: s, slots: make(chan struct{}, em.Limit), version: version,
		running: map[string]chan string{}}
	m := http.NewServeMux()
	m.HandleFunc("POST /generate", e.handleGenerate)
	m.HandleFunc("POST /tokenize", e.handleTokenize)
	m.HandleFunc("POST /abort_request", e.handleAbort)
	m.HandleFunc("POST /update_weight_version", e.handleUpdateWeightVersion)
	m.HandleFunc("GET /get_weight_version", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"weight_version": e.weightVersion()})
	})
	m.HandleFunc("GET /get_model_info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"model_path": "bench-" + role, "tokenizer_path": "sim-bytes",
			"is_generation": true, "weight_version": e.weightVersion()})
	})
	m.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	m.HandleFunc("GET /health_generate", func(http.ResponseWriter, *http.Request) {})
	m.HandleFunc("GET /metrics", e.handleMetrics)
	m.HandleFunc("GET /bench/calls", e.handleCalls)
	e.mux = m
	return e
}

func (e *benchEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) { e.mux.ServeHTTP(w, r) }

func (e *benchEngine) weightVersion() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.version
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"object": "error", "message": msg, "error": map[string]any{"message": msg, "code": status}})
}

type generateReq struct {
	Text           *string `json:"text"`
	InputIDs       []int   `json:"input_ids"`
	SamplingParams struct {
		MaxNewTokens *int `json:"max_new_tokens"`
	} `json:"sampling_params"`
	Stream     bool   `json:"stream"`
	RID        string `json:"rid"`
	RoutingKey string `json:"routing_key"`
}

// observationRe finds the observation blocks that the act-dispatcher
// appends to the planner's trajectory after each turn (the first prompt
// names <observation> in its instructions too, but not on a line of its own).
var observationRe = regexp.MustCompile(`(?m)^<observation>$`)

var actTagRe = regexp.MustCompile(`(?m)^[ \t]*Input:[ \t]*t(\d+) n(\d+) of e(\d+)`)

// identify finds which generation a request is, and its script.
func (e *benchEngine) identify(r *http.Request, req *generateReq, prompt string) (*Call, Gen, error) {
	key := r.Header.Get(engine.RoutingKeyHeader)
	if key == "" {
		key = req.RoutingKey
	}
	rs, es, ok := strings.Cut(key, "-")
	rollout, err1 := strconv.ParseInt(rs, 10, 64)
	episode, err2 := strconv.Atoi(es)
	if !ok || err1 != nil || err2 != nil || episode < 0 {
		return nil, Gen{}, fmt.Errorf("routing key %q: bench/step's engine needs %s: <rollout>-<episode> to know the episode", key, engine.RoutingKeyHeader)
	}
	c := &Call{Role: e.role, Rollout: rollout, Episode: episode, Node: -1, RID: req.RID}
	for _, h := range GenerationHeaders {
		if v := r.Header.Get(h); v != "" {
			c.Generation = v
		}
	}
	ep := e.scripts.get(rollout, episode)
	if e.role == rolePlanner {
		c.Turn = len(observationRe.FindAllStringIndex(prompt, -1)) + 1
		if c.Turn > len(ep.Turns) {
			return c, Gen{}, fmt.Errorf("episode %s: turn %d asked for, the script has %d turns (did a plan fail to parse?)", key, c.Turn, len(ep.Turns))
		}
		return c, ep.Turns[c.Turn-1].Planner, nil
	}
	m := actTagRe.FindStringSubmatch(prompt)
	if m == nil {
		return c, Gen{}, fmt.Errorf("episode %s: no \"Input: t<turn> n<node> of e<episode>\" line in the actor's prompt", key)
	}
	t, _ := strconv.Atoi(m[1])
	n, _ := strconv.Atoi(m[2])
	pe, _ := strconv.Atoi(m[3])
	c.Turn, c.Node = t, n-1
	if pe != episode || t < 1 || t >= len(ep.Turns) || c.Node < 0 || c.Node >= len(ep.Turns[t-1].Acts) {
		return c, Gen{}, fmt.Errorf("episode %s: act t%d n%d of e%d is not in the script", key, t, n, pe)
	}
	act := ep.Turns[t-1].Acts[c.Node]
	c.Deps = act.Deps
	return c, act.Gen, nil
}

func (e *benchEngine) record(c *Call) {
	c.DoneNs = time.Now().UnixNano()
	e.mu.Lock()
	e.calls = append(e.calls, *c)
	e.mu.Unlock()
}

func (e *benchEngine) handleGenerate(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now().UnixNano()
	var req generateReq
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	if req.Stream {
		writeError(w, http.StatusBadRequest, "bench/step's engine does not stream: leave stream_plans off")
		return
	}
	var prompt string
	switch {
	case len(req.InputIDs) > 0:
		var err error
		if prompt, err = sim.Decode(req.InputIDs); err != nil {
			writeError(w, http.StatusBadRequest, "input_ids: "+err.Error())
			return
		}
	case req.Text != nil:
		prompt = *req.Text
		req.InputIDs = sim.Encode(prompt)
	default:
		writeError(w, http.StatusBadRequest, "either text or input_ids should be provided")
		return
	}
	c, gen, err := e.identify(r, &req, prompt)
	if err != nil {
		if c != nil {
			c.ArrivedNs, c.Outcome, c.Error = arrived, "refused", err.Error()
			e.record(c)
		}
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	c.ArrivedNs, c.Tokens, c.Prompt = arrived, gen.Tokens, len(req.InputIDs)
	c.ServiceNs = int64(gen.Service())
	ids := append(sim.Encode(gen.Text), sim.EOSID)
	finish, service := "stop", gen.Service()
	if req.SamplingParams.MaxNewTokens != nil && *req.SamplingParams.MaxNewTokens < len(ids) {
		// What a real engine does: cut at max_new_tokens, finish "length".
		n := max(*req.SamplingParams.MaxNewTokens, 0)
		ids, finish = ids[:n], "length"
		service = time.Duration(gen.Slowdown * float64(gen.TTFT+time.Duration(n)*gen.PerToken))
	}
	abort := make(chan string, 1)
	if req.RID != "" {
		e.mu.Lock()
		e.running[req.RID] = abort
		e.mu.Unlock()
		defer func() {
			e.mu.Lock()
			delete(e.running, req.RID)
			e.mu.Unlock()
		}()
	}
	// Continuous batching: Limit at once, the rest wait in arrival order
	// (up to QueueLimit of them).
	c.QueuedNs = time.Now().UnixNano()
	if n := e.waiting.Add(1); e.em.QueueLimit > 0 && n > int64(e.em.QueueLimit) && len(e.slots) == cap(e.slots) {
		e.waiting.Add(-1)
		c.Outcome = "busy"
		e.record(c)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("%d requests wait for a slot already", e.em.QueueLimit))
		return
	}
	select {
	case e.slots <- struct{}{}:
		e.waiting.Add(-1)
	case <-r.Context().Done():
		e.waiting.Add(-1)
		c.Outcome = "disconnected"
		e.record(c)
		return
	case why := <-abort:
		e.waiting.Add(-1)
		c.Outcome = "aborted"
		e.record(c)
		e.reply(w, req.RID, gen, ids[:0], "abort", why, len(req.InputIDs))
		return
	}
	e.inSlot.Add(1)
	defer func() {
		e.inSlot.Add(-1)
		<-e.slots
	}()
	admitted := time.Now()
	c.AdmittedNs = admitted.UnixNano()
	t := time.NewTimer(service)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		c.Outcome = "disconnected"
		e.record(c)
		return
	case why := <-abort:
		c.Outcome = "aborted"
		e.record(c)
		done := 0
		if gen.PerToken > 0 {
			ran := time.Duration(float64(time.Since(admitted))/gen.Slowdown) - gen.TTFT
			done = max(0, min(len(ids), int(ran/gen.PerToken)))
		}
		e.reply(w, req.RID, gen, ids[:done], "abort", why, len(req.InputIDs))
		return
	}
	c.Outcome = "ok"
	if finish == "length" {
		c.Outcome = "cut"
	}
	e.record(c)
	e.reply(w, req.RID, gen, ids, finish, "", len(req.InputIDs))
}

// reply writes SGLang's /generate reply, log-probs as
// meta_info.output_token_logprobs triples, in one pass.
func (e *benchEngine) reply(w http.ResponseWriter, rid string, gen Gen, ids []int, finish, msg string, promptTokens int) {
	text, _ := sim.Decode(ids)
	b := make([]byte, 0, 256+len(ids)*28)
	b = append(b, `{"text":`...)
	b = strconv.AppendQuote(b, text)
	b = append(b, `,"output_ids":[`...)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	b = append(b, `],"meta_info":{"id":`...)
	b = strconv.AppendQuote(b, rid)
	b = append(b, `,"finish_reason":{"type":`...)
	b = strconv.AppendQuote(b, finish)
	switch finish {
	case "stop":
		b = append(b, `,"matched":`...)
		b = strconv.AppendInt(b, sim.EOSID, 10)
	case "length":
		b = append(b, `,"length":`...)
		b = strconv.AppendInt(b, int64(len(ids)), 10)
	case "abort":
		b = append(b, `,"message":`...)
		b = strconv.AppendQuote(b, msg)
	}
	b = append(b, `},"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(promptTokens), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(len(ids)), 10)
	b = append(b, `,"cached_tokens":0,"weight_version":`...)
	b = strconv.AppendQuote(b, e.weightVersion())
	b = append(b, `,"output_token_logprobs":[`...)
	x := uint64(gen.TTFT) ^ uint64(gen.Tokens)<<32 ^ 0x9e3779b97f4a7c15
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		x = x*6364136223846793005 + 1442695040888963407
		u := float64(x>>11) / (1 << 53)
		b = append(b, '[')
		b = strconv.AppendFloat(b, math.Round((-0.001-2.5*u*u)*1e6)/1e6, 'g', -1, 64)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(id), 10)
		b = append(b, ",null]"...)
	}
	b = append(b, `],"input_token_logprobs":[]}}`...)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (e *benchEngine) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt           *string `json:"prompt"`
		AddSpecialTokens *bool   `json:"add_special_tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&req); err != nil || req.Prompt == nil {
		writeError(w, http.StatusBadRequest, `want {"prompt": "…"}`)
		return
	}
	e.mu.Lock()
	e.tokenizes++
	e.mu.Unlock()
	ids := sim.Encode(*req.Prompt)
	if req.AddSpecialTokens == nil || *req.AddSpecialTokens {
		ids = append([]int{sim.BOSID}, ids...)
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": ids, "count": len(ids), "max_model_len": 1 << 17})
}

// handleAbort is SGLang's POST /abort_request {rid, abort_all}.
func (e *benchEngine) handleAbort(w http.ResponseWriter, r *http.Request) {
	var req struct {
		RID      string `json:"rid"`
		AbortAll bool   `json:"abort_all"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	e.abort(func(rid string) bool { return req.AbortAll || rid == req.RID }, "Abort request "+req.RID)
	w.WriteHeader(http.StatusOK)
}

func (e *benchEngine) abort(match func(rid string) bool, why string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for rid, ch := range e.running {
		if match(rid) {
			select {
			case ch <- why:
			default:
			}
		}
	}
}

// handleUpdateWeightVersion is SGLang's POST /update_weight_version
// {new_version, abort_all_requests}: what a trainer's weight swap ends with.
func (e *benchEngine) handleUpdateWeightVersion(w http.ResponseWriter, r *http.Request) {
	var req struct {
		NewVersion       string `json:"new_version"`
		AbortAllRequests bool   `json:"abort_all_requests"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.NewVersion == "" {
		writeError(w, http.StatusBadRequest, `"new_version" is required`)
		return
	}
	if req.AbortAllRequests {
		e.abort(func(string) bool { return true }, "weight update")
	}
	e.mu.Lock()
	e.version = req.NewVersion
	e.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "message": "Weight version updated to " + req.NewVersion, "new_version": req.NewVersion})
}

// handleMetrics serves SGLang's gauges of what runs and what waits, as its
// /metrics does, and the limit (SGLang's max_running_requests).
func (e *benchEngine) handleMetrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	label := fmt.Sprintf(`{model_name="bench-%s"}`, e.role)
	fmt.Fprintf(w, "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs%s %d\n", label, e.inSlot.Load())
	fmt.Fprintf(w, "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs%s %d\n", label, e.waiting.Load())
	fmt.Fprintf(w, "# TYPE sglang:max_running_requests gauge\nsglang:max_running_requests%s %d\n", label, e.em.Limit)
}

func (e *benchEngine) handleCalls(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	out := Calls{Role: e.role, Limit: e.em.Limit, Tokenizes: e.tokenizes, Calls: append([]Call(nil), e.calls...), Model: e.em}
	e.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// serveEngine serves h on addr until ctx ends.
func serveEngine(ctx context.Context, addr string, h http.Handler) (string, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
	}()
	return "http://" + ln.Addr().String(), nil
}
