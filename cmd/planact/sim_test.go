package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for one writer and one poller.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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

func TestRunSim(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncBuffer
	errc := make(chan error, 1)
	go func() {
		errc <- runSim(ctx, []string{"--planner-addr", "127.0.0.1:0", "--actor-addr", "127.0.0.1:0",
			"--ttft", "0s", "--per-token", "0s", "--tasks", "2"}, &out, io.Discard)
	}()
	urlRe := regexp.MustCompile(`(?m)^(planner|actor) engine: (http://\S+)$`)
	deadline := time.Now().Add(10 * time.Second)
	for len(urlRe.FindAllString(out.String(), -1)) < 2 || !bytes.Contains([]byte(out.String()), []byte("ready")) {
		if time.Now().After(deadline) {
			t.Fatalf("no engine URLs in %q", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, m := range urlRe.FindAllStringSubmatch(out.String(), -1) {
		resp, err := http.Get(m[2] + "/health")
		if err != nil || resp.StatusCode != 200 {
			t.Errorf("%s health: %v %v", m[1], resp, err)
		}
		if resp != nil {
			resp.Body.Close()
		}
	}
	if n := len(regexp.MustCompile(`(?m)^task: `).FindAllString(out.String(), -1)); n != 2 {
		t.Errorf("%d sample tasks printed, want 2", n)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("runSim = %v", err)
	}
}

func TestRunSimFlags(t *testing.T) {
	if err := runSim(context.Background(), []string{"--error-rate", "2"}, io.Discard, io.Discard); err == nil {
		t.Error("accepted an error rate of 2")
	}
	if err := runSim(context.Background(), []string{"-h"}, io.Discard, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}
