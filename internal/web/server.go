// Package web serves planact's web view: the pages Rollouts, Rollout and
// Episode, the JSON they show, and live updates of it by Server-Sent
// Events, all read from a view.Reader. Its pages and JavaScript libraries
// are embedded in the binary: nothing to build or install.
package web

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/planact/planact/pkg/view"
)

//go:embed static
var static embed.FS

//go:embed page.html
var pageHTML string

var page = template.Must(template.New("page").Parse(pageHTML))

// Server answers the web view's pages and endpoints.
type Server struct {
	view *view.Reader
	mux  *http.ServeMux
	// writeTimeout bounds each write of an answer (a page, JSON, one
	// event of a stream): a client that takes nothing for that long is
	// given up on, so that it holds no handler, subscription or buffer.
	writeTimeout time.Duration
	// keepAlive is the longest an events stream stays silent: a comment
	// then, so that proxies do not cut it as idle.
	keepAlive time.Duration
	// readTimeout bounds, for one request or one event, reading a
	// rollout's episodes again from the streams, or waiting for the view
	// to read their history.
	readTimeout time.Duration
	streams     atomic.Int64
}

const (
	// WriteTimeout is how long one write of an answer may wait for its
	// client to take it.
	WriteTimeout = 10 * time.Second
	// KeepAlive is how often a silent events stream sends a comment.
	KeepAlive = 15 * time.Second
)

// New returns the web view of what r reads.
func New(r *view.Reader) *Server {
	return newServer(r, WriteTimeout, KeepAlive)
}

func newServer(r *view.Reader, writeTimeout, keepAlive time.Duration) *Server {
	s := &Server{view: r, mux: http.NewServeMux(), writeTimeout: writeTimeout, keepAlive: keepAlive, readTimeout: ReadTimeout}
	assets, _ := fs.Sub(static, "static")
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(assets)))

	s.mux.HandleFunc("GET /{$}", s.page("rollouts"))
	s.mux.HandleFunc("GET /rollouts/{n}", s.page("rollout"))
	s.mux.HandleFunc("GET /rollouts/{n}/episodes/{e}", s.page("episode"))

	s.mux.HandleFunc("GET /api/rollouts", s.json(s.rollouts))
	s.mux.HandleFunc("GET /api/rollouts/{n}", s.json(s.rollout))
	s.mux.HandleFunc("GET /api/rollouts/{n}/episodes/{e}", s.json(s.episode))
	s.mux.HandleFunc("GET /api/rollouts/events", s.events(s.rollouts))
	s.mux.HandleFunc("GET /api/rollouts/{n}/events", s.events(s.rollout))
	s.mux.HandleFunc("GET /api/rollouts/{n}/episodes/{e}/events", s.events(s.episode))
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	if r.ContentLength != 0 {
		// Nothing here reads a body, and net/http reads what is left of
		// one after the handler, with no deadline: a body that never
		// comes would hold the connection (and before an events
		// stream's first event, its handler) forever.
		_ = rc.SetReadDeadline(time.Now().Add(s.writeTimeout))
		w.Header().Set("Connection", "close")
		http.Error(w, fmt.Sprintf("%s %s: the web view takes no request body", r.Method, r.URL.Path), http.StatusBadRequest)
		return
	}
	s.mux.ServeHTTP(&deadlineWriter{ResponseWriter: w, rc: rc, timeout: s.writeTimeout}, r)
}

// Streams is how many events streams are open now.
func (s *Server) Streams() int { return int(s.streams.Load()) }

// deadlineWriter gives each write and flush of a response its own
// deadline, writeTimeout from when it starts: the server's WriteTimeout
// would end every events stream after that long, however fast its client
// reads.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (w *deadlineWriter) extend() error {
	err := w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	if errors.Is(err, http.ErrNotSupported) {
		return nil // a writer with no connection under it (httptest's recorder): nothing waits
	}
	return err
}

// WriteHeader extends the deadline too: an answer of only a status line
// and headers is written after the handler, under the last deadline set.
func (w *deadlineWriter) WriteHeader(code int) {
	_ = w.extend()
	w.ResponseWriter.WriteHeader(code)
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	if err := w.extend(); err != nil {
		return 0, err
	}
	return w.ResponseWriter.Write(p)
}

// FlushError flushes what was written; http.ResponseController's Flush
// calls it.
func (w *deadlineWriter) FlushError() error {
	if err := w.extend(); err != nil {
		return err
	}
	return w.rc.Flush()
}

func (w *deadlineWriter) Flush() { _ = w.FlushError() }

func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// errBadRequest marks errors in what the request asked for.
var errBadRequest = errors.New("bad request")

// A builder makes what an endpoint answers.
type builder func(r *http.Request) (any, error)

// ReadTimeout bounds reading a rollout's episodes again from the streams
// (a rollout the view dropped from memory), or waiting for the view to
// read the streams' history, for one request; the read also ends when the
// request does (its client went away, the server stops).
const ReadTimeout = 30 * time.Second

func (s *Server) rollouts(*http.Request) (any, error) { return s.view.Rollouts(), nil }

func (s *Server) rollout(r *http.Request) (any, error) {
	n, err := rolloutID(r)
	if err != nil {
		return nil, err
	}
	f, err := view.ParseFilter(r.URL.Query())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.readTimeout)
	defer cancel()
	return s.view.RolloutContext(ctx, n, f)
}

func (s *Server) episode(r *http.Request) (any, error) {
	n, err := rolloutID(r)
	if err != nil {
		return nil, err
	}
	e, err := strconv.Atoi(r.PathValue("e"))
	if err != nil || e < 0 {
		return nil, fmt.Errorf("%w: episode %q: want an episode index (0, 1, …)", errBadRequest, r.PathValue("e"))
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.readTimeout)
	defer cancel()
	return s.view.EpisodeContext(ctx, n, e)
}

func rolloutID(r *http.Request) (int64, error) {
	n, err := strconv.ParseInt(r.PathValue("n"), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: rollout %q: want a rollout id (an integer)", errBadRequest, r.PathValue("n"))
	}
	return n, nil
}

// status is the HTTP status of a builder's error.
func status(err error) int {
	switch {
	case errors.Is(err, errBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, view.ErrNotFound):
		return http.StatusNotFound
	}
	return http.StatusInternalServerError
}

// json answers what build makes, as JSON; errors as {"error": "…"}.
func (s *Server) json(build builder) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := build(r)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if err != nil {
			w.WriteHeader(status(err))
			v = map[string]string{"error": err.Error()}
		}
		_ = json.NewEncoder(w).Encode(v)
	}
}

// page answers the HTML page named name; its script reads the ids from
// the page and follows its events. An id that names nothing is a 404
// page saying so.
func (s *Server) page(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		data := map[string]string{"Page": name, "Rollout": r.PathValue("n"), "Episode": r.PathValue("e"), "Title": "Rollouts"}
		var err error
		switch name {
		case "rollout":
			_, err = s.rollout(r)
			data["Title"] = "Rollout " + data["Rollout"]
		case "episode":
			_, err = s.episode(r)
			data["Title"] = "Rollout " + data["Rollout"] + ", episode " + data["Episode"]
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err != nil {
			w.WriteHeader(status(err))
			data["Page"], data["Error"] = "error", err.Error()
		}
		_ = page.Execute(w, data)
	}
}
