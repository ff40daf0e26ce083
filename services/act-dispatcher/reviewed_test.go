package actdispatcher

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// An act is abandoned between its attempts, with no outcome, only when
// the leader says its rollout is over. Rollout numbers start again when a
// training run does; the session cache may hold the earlier rollout's of
// the number, ended, while this one runs. Before, the cached session
// decided: the act of the running rollout was dropped after its first
// failure, its turn left without its outcome. A rollout that did end still
// abandons the act.
func TestAnActIsAbandonedOnlyWhenItsOwnRolloutIsOver(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		state string // the rollout's, as the leader holds it
		want  bool   // an outcome
	}{
		{"the cache holds the earlier rollout's end", schema.SessionRunning, true},
		{"the rollout ended", schema.SessionDone, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					http.Error(w, "busy", http.StatusServiceUnavailable)
					return
				}
				_, _ = w.Write([]byte("found x"))
			}))
			defer srv.Close()
			s, _ := testService(t)
			s.HTTP = srv.Client()
			s.sessions.Fresh = time.Hour // what it cached stays
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			earlier := schema.Session{Rollout: 1, State: schema.SessionDone, CreatedMs: 1000}
			if _, err := bus.Create(ctx, s.Bus.Sessions, schema.SessionKey(1), &earlier); err != nil {
				t.Fatal(err)
			}
			if cached, err := s.sessions.Get(ctx, 1); err != nil || cached.Active() {
				t.Fatalf("the earlier rollout, cached: %v, %v", cached, err)
			}
			cfg := schema.Config{MaxTurns: 5, ActTimeoutS: 30, ActRetries: 3,
				Tools: []schema.Tool{{Name: "retrieve", Kind: schema.ToolHTTP, URL: srv.URL}}}.WithDefaults()
			info := &session.Info{Session: schema.Session{Rollout: 1, State: schema.SessionRunning, CreatedMs: 2000, Episodes: 1, Config: cfg},
				Tasks: []schema.Task{{Prompt: "what is x?"}}}
			now := info.Session
			now.State = c.state
			if _, _, err := bus.Mutate(ctx, s.Bus.Sessions, schema.SessionKey(1), func(v *schema.Session, _ bool) (bool, error) {
				*v = now
				return true, nil
			}); err != nil {
				t.Fatal(err)
			}
			node := plan.Node{ID: "a", Tool: "retrieve", Args: map[string]any{"query": "x"}}
			run := &act{Rollout: 1, Episode: 0, Turn: 1, Key: subject.NodeKey(1, "a"), Node: node}
			done, err := s.execute(ctx, info, run)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.want && (done == nil || done.Status != schema.ActDoneOK || done.Output != "found x" || done.Attempts != 2):
				t.Fatalf("the act of a running rollout, its first attempt failed: outcome %+v; want done at its second attempt", done)
			case !c.want && done != nil:
				t.Fatalf("the act of a rollout that ended: outcome %+v; want none (abandoned)", done)
			case !c.want && calls.Load() != 1:
				t.Fatalf("the act of a rollout that ended was tried %d times; want once", calls.Load())
			}
		})
	}
}

// The turn's last plan, stored but unreadable, is an error naming its
// subject and sequence for the runner that checks the stream: never taken
// for absent, as if no plan had come since (docs/guarantees.md). Before,
// check passed over it.
func TestAnUnreadablePlanIsAnErrorForTheRunner(t *testing.T) {
	t.Parallel()
	s, info, _, ctx := streamedTurn(t)
	key := schema.RunKey(1, 0, 1)
	r := record(t, s, info, 5, planDAG(1, true, 1, search("a", "x")))
	_, rev := runOf(t, s, 1)
	ack, err := s.Bus.JS.Publish(ctx, subject.PlanDAG(1, 0), []byte("garbage"))
	if err != nil {
		t.Fatal(err)
	}
	log := s.Log
	runner := &runner{s: s, info: info, key: key, seq: 5, prior: map[string]priorAct{}, log: &log, run: *r, rev: rev,
		known: map[string]*schema.ActDone{}, mine: map[string]bool{}, wake: make(chan struct{}, 1), ended: make(chan struct{})}
	want := fmt.Sprintf("plan.1.dag.0 sequence %d", ack.Sequence)
	if err := runner.check(ctx); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("check, an unreadable plan last: %v; want an error naming %q", err, want)
	}
}

// An episode ends once, and is counted once: its answer delivered again
// (an ack lost, the watchdog handling it again) comes to the episode's
// end again, and finds it published. Before, each delivery counted it in
// planact_episodes_ended_total. Not parallel: the counter is the
// process's.
func TestAnEpisodeEndDeliveredAgainIsCountedOnce(t *testing.T) {
	s, _ := testService(t)
	info := testInfo()
	storeSession(t, s, info)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Bus.Publish(ctx, &schema.PlanAnswer{Rollout: 1, Episode: 0, Turn: 1, Answers: []string{"x"}, FinishReason: "length"}); err != nil {
		t.Fatal(err)
	}
	ended := telemetry.EpisodesEnded.WithLabelValues(schema.EpisodeTruncated)
	before := testutil.ToFloat64(ended)
	for range 3 {
		if err := handleLast(ctx, s, subject.PlanAnswer(1, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(ended) - before; got != 1 {
		t.Errorf("an answer handled 3 times counted %v episodes ended; want 1", got)
	}
	if end := episodeEnd(t, s); end.Status != schema.EpisodeTruncated {
		t.Errorf("the episode ended %s; want %s", end.Status, schema.EpisodeTruncated)
	}
}

// A turn with two acts refused as stale ends its episode for the first of
// them, as a turn with two that drifted is quarantined for the first.
// Before, the last stale act's error was the reason.
func TestAStaleTurnEndsItsEpisodeForItsFirstStaleAct(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	info := testInfo()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := search("a", "x"), search("b", "y")
	r := &schema.Run{Rollout: 1, Episode: 0, Turn: 1, Complete: true, Finished: true, Nodes: []*schema.NodeState{
		{Node: a, Key: subject.NodeKey(1, "a"), Status: schema.NodeFailed, ErrorKind: schema.ActErrStale, Error: "weights v1 are 3 behind"},
		{Node: b, Key: subject.NodeKey(1, "b"), Status: schema.NodeFailed, ErrorKind: schema.ActErrStale, Error: "weights v2 are 2 behind"},
	}}
	if err := s.finishTurn(ctx, info, r); err != nil {
		t.Fatal(err)
	}
	end := episodeEnd(t, s)
	if want := "stale: weights v1 are 3 behind"; end.Status != schema.EpisodeAborted || end.Reason != want {
		t.Errorf("the episode ended %s, %q; want %s, %q", end.Status, end.Reason, schema.EpisodeAborted, want)
	}
}
