package bus

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// syncBuffer is a log the test reads while Follow writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestFollowReadsAStreamMadeAnewFromItsStart: a stream deleted and made
// again (a server restarted without its store) numbers its messages from 1
// again; a follower reads them from its start and logs that it does, both
// when the new stream holds fewer messages than were read and when it
// holds as many (another message at the sequence last read). Before, it
// polled from after the old stream's last sequence and never saw anything
// of the new one below it.
func TestFollowReadsAStreamMadeAnewFromItsStart(t *testing.T) {
	for _, again := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d messages again", again), func(t *testing.T) {
			t.Parallel()
			_, nc := startEmbedded(t)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cfg := jetstream.StreamConfig{Name: "REMADE", Subjects: []string{"remade.>"}, AllowDirect: true}
			publish := func(prefix string, n int) {
				t.Helper()
				for i := range n {
					if _, err := js.Publish(ctx, fmt.Sprintf("remade.%s.%d", prefix, i), nil); err != nil {
						t.Fatal(err)
					}
				}
			}
			if _, err := js.CreateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			publish("old", 3)
			var log syncBuffer
			got := make(chan string, 16)
			fctx, stop := context.WithCancel(zerolog.New(&log).WithContext(ctx))
			done := make(chan error, 1)
			go func() {
				done <- Follow(fctx, nc, "REMADE", "remade.>", 1, 10*time.Millisecond, func(m StoredMsg) { got <- m.Subject }, nil)
			}()
			defer func() { stop(); <-done }()
			next := func() string {
				t.Helper()
				select {
				case s := <-got:
					return s
				case <-ctx.Done():
					t.Fatalf("nothing more read; log: %s", log.String())
					return ""
				}
			}
			for i := range 3 {
				if s, want := next(), fmt.Sprintf("remade.old.%d", i); s != want {
					t.Fatalf("read %s, want %s", s, want)
				}
			}
			if err := js.DeleteStream(ctx, "REMADE"); err != nil {
				t.Fatal(err)
			}
			// The server may still be removing the old store: "error
			// creating store for stream" until it has.
			for {
				_, err := js.CreateStream(ctx, cfg)
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			publish("new", again)
			for i := range again {
				if s, want := next(), fmt.Sprintf("remade.new.%d", i); s != want {
					t.Fatalf("after the stream was made anew: read %s, want %s", s, want)
				}
			}
			if l := log.String(); !strings.Contains(l, "started again") || !strings.Contains(l, `"stream":"REMADE"`) {
				t.Errorf("log %q: want a line saying the stream REMADE was read again from its start", l)
			}
		})
	}
}
