// Package enginetest is a counting engine for tests: an http.Handler in
// front of a simulated engine (pkg/sim, SGLang and OpenAI HTTP) that counts
// every request it sees (in flight now and at most, per path, per episode,
// per planner turn and per act, aborts) and can make a path slow or bound
// the generations it serves at once, as a real engine's limit does. With it
// a test says how many times the engine was paid for each turn and act.
package enginetest

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/pkg/engine"
)

// Generation paths: the requests that make an engine generate.
var generationPaths = []string{"/generate", "/v1/completions", "/v1/chat/completions"}

// IsGeneration reports whether path asks the engine for a generation.
func IsGeneration(path string) bool { return slices.Contains(generationPaths, path) }

// Options make the counting engine behave like a loaded one.
type Options struct {
	// Latency is added to every request on a path ("/generate",
	// "/tokenize", …) before the engine sees it; the wait ends early if the
	// client goes away.
	Latency map[string]time.Duration
	// Limit bounds the generations the engine serves at once; above it,
	// requests queue here (counted in flight, not yet served), as they do
	// in a real engine whose limit is below planact's width. 0: no limit.
	Limit int
	// Hold, when set, holds every generation until it is closed (counted
	// in flight meanwhile): a test sees how many planact keeps in flight
	// at most, however fast its machine.
	Hold <-chan struct{}
	// HoldIf, when set, narrows Hold to the generations it returns true
	// for, by their X-Planact-Generation ("<rollout>-<episode>-t<turn>" for
	// a planner turn): the others pass.
	HoldIf func(generation string) bool
}

// Request is one request the engine saw.
type Request struct {
	Path       string
	Episode    string // the routing key (X-SMG-Routing-Key): "<rollout>-<episode>"
	Generation string // X-Planact-Generation: "<rollout>-<episode>-t<turn>" or "<rollout>-<episode>-<node key>"
	RID        string // an abort's rid
	Start, End time.Time
	Status     int
}

// Engine counts the requests on their way to the engine it wraps.
type Engine struct {
	next http.Handler
	o    Options
	slot chan struct{}

	mu          sync.Mutex
	inFlight    int // generations in the engine or queued for it
	held        int // generations held (Options.Hold)
	maxInFlight int
	log         []*Request
}

// New wraps next (a *sim.Engine, say).
func New(next http.Handler, o Options) *Engine {
	e := &Engine{next: next, o: o}
	if o.Limit > 0 {
		e.slot = make(chan struct{}, o.Limit)
	}
	return e
}

// statusWriter keeps the status an engine answered with; it flushes, for
// streamed generations.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// ServeHTTP counts r, waits as Options say, and hands it to the engine.
func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &Request{Path: r.URL.Path, Episode: r.Header.Get(engine.RoutingKeyHeader), Generation: r.Header.Get(engine.GenerationHeader), Start: time.Now()}
	if rec.Path == "/abort_request" {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		var a struct {
			RID string `json:"rid"`
		}
		_ = json.Unmarshal(body, &a)
		rec.RID = a.RID
		r.Body = io.NopCloser(strings.NewReader(string(body)))
	}
	gen := IsGeneration(rec.Path)
	e.mu.Lock()
	e.log = append(e.log, rec)
	if gen {
		e.inFlight++
		e.maxInFlight = max(e.maxInFlight, e.inFlight)
	}
	e.mu.Unlock()
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		e.mu.Lock()
		rec.End, rec.Status = time.Now(), sw.status
		if gen {
			e.inFlight--
		}
		e.mu.Unlock()
	}()
	if d := e.o.Latency[rec.Path]; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			sw.WriteHeader(499)
			return
		}
	}
	if gen && e.o.Hold != nil && (e.o.HoldIf == nil || e.o.HoldIf(rec.Generation)) {
		e.mu.Lock()
		e.held++
		e.mu.Unlock()
		defer func() {
			e.mu.Lock()
			e.held--
			e.mu.Unlock()
		}()
		select {
		case <-e.o.Hold:
		case <-r.Context().Done():
			sw.WriteHeader(499)
			return
		}
	}
	if gen && e.slot != nil {
		select {
		case e.slot <- struct{}{}:
			defer func() { <-e.slot }()
		case <-r.Context().Done():
			sw.WriteHeader(499)
			return
		}
	}
	e.next.ServeHTTP(sw, r)
}

// Counts are what the engine saw.
type Counts struct {
	InFlight    int            // generations in the engine or queued for it now
	MaxInFlight int            // the most at once
	Held        int            // generations held now (Options.Hold)
	Paths       map[string]int // requests per path
	// Episodes and Generations count generation requests (not tokenize):
	// per routing key, and per X-Planact-Generation (planner turn or act).
	Episodes    map[string]int
	Generations map[string]int
	Aborts      []string // the rids of the aborts, oldest first
}

// Counts returns what the engine saw so far.
func (e *Engine) Counts() Counts {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := Counts{InFlight: e.inFlight, MaxInFlight: e.maxInFlight, Held: e.held, Paths: map[string]int{}, Episodes: map[string]int{}, Generations: map[string]int{}}
	for _, r := range e.log {
		c.Paths[r.Path]++
		switch {
		case IsGeneration(r.Path):
			c.Episodes[r.Episode]++
			c.Generations[r.Generation]++
		case r.Path == "/abort_request":
			c.Aborts = append(c.Aborts, r.RID)
		}
	}
	return c
}

// Requests returns a copy of every request the engine saw, oldest first.
func (e *Engine) Requests() []Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Request, len(e.log))
	for i, r := range e.log {
		out[i] = *r
	}
	return out
}

// Turns are the generation counts of planner turns ("…-t<turn>" names),
// Acts those of acts: in a run without faults every value is 1.
func (c Counts) Turns() map[string]int { return c.filter(isTurn) }

// Acts: see Turns.
func (c Counts) Acts() map[string]int {
	return c.filter(func(g string) bool { return g != "" && !isTurn(g) })
}

func (c Counts) filter(keep func(string) bool) map[string]int {
	out := maps.Clone(c.Generations)
	maps.DeleteFunc(out, func(g string, _ int) bool { return !keep(g) })
	return out
}

// isTurn: a turn is named "<rollout>-<episode>-t<turn>", an act
// "<rollout>-<episode>-t<turn>-<node>".
func isTurn(g string) bool {
	parts := strings.Split(g, "-")
	return len(parts) == 3 && strings.HasPrefix(parts[2], "t")
}

// Duplicates is how many generation requests went beyond the first for
// their turn or act, and how many requests named no generation.
func (c Counts) Duplicates() (extra, unnamed int) {
	for g, n := range c.Generations {
		if g == "" {
			unnamed += n
			continue
		}
		extra += n - 1
	}
	return extra, unnamed
}

// Serve serves h on a loopback port until ctx ends and returns its URL.
func Serve(ctx context.Context, h http.Handler) (string, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() { _ = srv.Serve(ln) }()
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

// Start serves h until the end of the test and returns its URL.
func Start(t testing.TB, h http.Handler) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	url, err := Serve(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	return url
}
