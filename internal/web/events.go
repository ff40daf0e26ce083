package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Live updates: an endpoint's events stream (Server-Sent Events) sends
// what its JSON endpoint answers, at once and again whenever it changes.

const (
	// coalesce is the least time between two events of one stream: a busy
	// rollout changes hundreds of times a second, a person needs far fewer.
	coalesce = 200 * time.Millisecond
	// tick re-sends a running rollout's figures that move without
	// messages (its wall time).
	tick = time.Second
)

// events streams what build makes as "data:" events; an error (a bad
// request, a rollout that does not exist) is one "failure" event whose
// data is the message, and ends the stream.
func (s *Server) events(build builder) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		flusher, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "streaming is not supported by this connection", http.StatusInternalServerError)
			return
		}
		if _, err := build(r); err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status(err))
			_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Accel-Buffering", "no")
		changes, stop := s.view.Subscribe()
		defer stop()
		ticker := time.NewTicker(tick)
		defer ticker.Stop()
		var last []byte
		send := func() bool {
			v, err := build(r)
			if err != nil {
				fmt.Fprintf(w, "event: failure\ndata: %s\n\n", err)
				flusher.Flush()
				return false
			}
			b, err := json.Marshal(v)
			if err != nil {
				return false
			}
			if !bytes.Equal(b, last) {
				last = b
				fmt.Fprintf(w, "data: %s\n\n", b)
				flusher.Flush()
			}
			return true
		}
		if !send() {
			return
		}
		for {
			select {
			case <-r.Context().Done():
				return
			case <-changes:
				if !send() {
					return
				}
				select {
				case <-time.After(coalesce):
				case <-r.Context().Done():
					return
				}
			case <-ticker.C:
				if !send() {
					return
				}
			}
		}
	}
}
