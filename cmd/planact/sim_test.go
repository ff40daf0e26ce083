package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"regexp"
	"strings"
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
			"--ttft", "0s", "--per-token", "0s", "--busy-rate", "0.5", "--retry-after", "0", "--chat-strip-think",
			"--omit-token-ids", "--omit-logprobs", "--omit-weight-version", "--version-endpoint", "404", "--context-length", "4096"}, &out, io.Discard)
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
		for path, status := range map[string]int{"/health": 200, "/sim/stats": 200, "/get_weight_version": 404} {
			resp, err := http.Get(m[2] + path)
			if err != nil || resp.StatusCode != status {
				t.Errorf("%s %s: %v %v, want %d", m[1], path, resp, err, status)
			}
			if resp != nil {
				resp.Body.Close()
			}
		}
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("runSim = %v", err)
	}
}

// TestSimTasksFeedSubmit: the world's questions come out as JSON Lines of
// tasks, grouped, that submit reads back as they were (it could not read
// the tab-separated lines of before).
func TestSimTasksFeedSubmit(t *testing.T) {
	var out bytes.Buffer
	if err := runSim(context.Background(), []string{"--tasks", "3", "--samples-per-prompt", "2"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	tasks, err := readTasks("-", &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 6 {
		t.Fatalf("%d tasks, want 3 questions x 2", len(tasks))
	}
	for i, task := range tasks {
		if task.Index != i || task.GroupIndex != i/2 || task.Prompt == "" || task.Label == "" || task.Prompt != tasks[i/2*2].Prompt {
			t.Errorf("task %d: %+v", i, task)
		}
	}
	if _, err := readTasks("-", bytes.NewBufferString(`{"prompt":"q","lable":"a"}`+"\n")); err == nil || !strings.Contains(err.Error(), "lable") {
		t.Errorf("a misspelt task field: %v, want an error naming it", err)
	}
}

func TestRunSimFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--error-rate", "2"},
		{"--busy-rate", "-0.1"},
		{"--busy-rate", "NaN"},
		{"--retry-after", ""},
		{"--retry-after", "1\r\nX-Evil: 1"},
		{"--version-endpoint", "v1\nX"},
		{"--context-length", "-1"},
	} {
		if err := runSim(context.Background(), args, io.Discard, io.Discard); err == nil {
			t.Errorf("accepted %q", args)
		}
	}
	if err := runSim(context.Background(), []string{"-h"}, io.Discard, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}
