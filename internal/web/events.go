package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
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

// events streams what build makes as "data:" events. An error that stays
// (a bad request, a rollout that does not exist) is one "failure" event
// whose data is the message, and ends the stream; one that may pass (the
// streams did not answer in time: NATS is away, or the view is still
// reading their history) is a "stalled" event saying so, and build is
// asked again at the next tick: the page follows again once NATS answers,
// where an ended stream would leave it stopped for good (an EventSource
// does not connect again after a failure it is told of). A stream ends,
// releasing its subscription, when its client goes away, or takes nothing
// of one write for writeTimeout (its connection is closed then; an
// EventSource that is still there connects again).
func (s *Server) events(build builder) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, err := build(r); err != nil && !passing(err) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status(err))
			_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Accel-Buffering", "no")
		s.streams.Add(1)
		defer s.streams.Add(-1)
		changes, stop := s.view.Subscribe()
		defer stop()
		ticker := time.NewTicker(tick)
		defer ticker.Stop()
		quiet := time.NewTimer(s.keepAlive)
		defer quiet.Stop()
		rc := http.NewResponseController(w)
		// write writes and flushes one event, each under its deadline
		// (ServeHTTP's deadlineWriter); false when it failed and the
		// stream ends.
		write := func(format string, a ...any) bool {
			if _, err := fmt.Fprintf(w, format, a...); err != nil {
				return false
			}
			if err := rc.Flush(); err != nil {
				return false
			}
			quiet.Reset(s.keepAlive)
			return true
		}
		var last []byte
		var stalled string
		send := func() bool {
			v, err := build(r)
			if err == nil {
				var b []byte
				if b, err = json.Marshal(v); err == nil {
					stalled = ""
					if bytes.Equal(b, last) {
						return true
					}
					last = b
					return write("data: %s\n\n", b)
				}
			}
			// One line: a newline in the message would end the event early.
			msg := strings.ReplaceAll(err.Error(), "\n", " ")
			if passing(err) && r.Context().Err() == nil {
				// What comes once it passes is sent, even if the same as
				// before: the page shows it live again.
				last = nil
				if msg == stalled {
					return true
				}
				stalled = msg
				return write("event: stalled\ndata: %s\n\n", msg)
			}
			write("event: failure\ndata: %s\n\n", msg)
			return false
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
			case <-quiet.C:
				if !write(": keep-alive\n\n") {
					return
				}
			}
		}
	}
}

// passing says whether err, a builder's, may pass: not a bad request or
// something that does not exist, but the streams not answering in time.
func passing(err error) bool { return status(err) == http.StatusInternalServerError }
