package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
)

func TestWatchFollowsOneRollout(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "test")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := func(m schema.Message) {
		if err := b.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	pub(&schema.PlanDAG{Rollout: 4, Episode: 0, Turn: 1, Plan: plan.Plan{Format: plan.FormatGraph, Nodes: []plan.Node{
		{ID: "s1", Tool: "search", Args: map[string]any{"input": "capital of Peru"}},
		{ID: "s2", Tool: "search", Deps: []string{"s1"}, Args: map[string]any{"input": "population of {s1}"}},
	}}})
	pub(&schema.PlanAnswer{Rollout: 5, Episode: 0, Turn: 1, Answers: []string{"other rollout"}})

	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"watch", "-v", "--nats", url, "4"}, noenv, nil, &out, &out) }()
	pub(&schema.ActDone{Rollout: 4, Episode: 0, Turn: 1, Key: "t1-s1", Status: schema.ActDoneOK, Output: "Lima", Attempts: 1})

	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "Lima") || !strings.Contains(out.String(), "s2<-s1") {
		if time.Now().After(deadline) {
			t.Fatalf("watch printed:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "other rollout") {
		t.Errorf("watch 4 printed rollout 5:\n%s", out.String())
	}
}

// Without -v, watch prints one line per rollout each time its progress
// changes (not a terminal): waiting, started, episodes ending, the result.
func TestWatchShowsProgressPerRollout(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "test")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := func(m schema.Message) {
		t.Helper()
		if err := b.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// Rollout 4 ran before watch started; rollout 5 runs while it watches.
	pub(&schema.Start{Rollout: 4, Episodes: 2})
	pub(&schema.Status{Rollout: 4, Event: "episode", Episode: 0, Ended: 1, Episodes: 2, Acts: 3})
	pub(&schema.EpisodeEnd{Rollout: 4, Episode: 0, Status: schema.EpisodeFailed, Reason: "plan error"})
	pub(&schema.Status{Rollout: 4, Event: "episode", Episode: 1, Ended: 2, Episodes: 2, Acts: 5})
	pub(&schema.EpisodeEnd{Rollout: 4, Episode: 1, Status: schema.EpisodeCompleted})
	pub(&schema.Result{Rollout: 4, Role: schema.RolePlanner, Status: schema.ResultOK, Stats: schema.Stats{Episodes: 2, Accuracy: 0.5, Acts: 5,
		EpisodeStatus: map[string]int{schema.EpisodeFailed: 1, schema.EpisodeCompleted: 1}}})

	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"watch", "--nats", url}, noenv, nil, &out, &out) }()
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("watch never printed %q; it printed:\n%s", want, out.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("rollout 4      [####################] 2/2 episodes, 5 acts, 1 failed  ok, accuracy 0.50")
	pub(&schema.Start{Rollout: 5, Episodes: 4})
	waitFor("rollout 5      [--------------------] 0/4 episodes, 0 acts  running")
	pub(&schema.Status{Rollout: 5, Event: "episode", Episode: 2, Ended: 1, Episodes: 4, Acts: 7})
	waitFor("rollout 5      [#####---------------] 1/4 episodes, 7 acts  running")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "rollout 4 "); n != 1 {
		t.Errorf("rollout 4 ended before watch started: one line expected, %d printed:\n%s", n, out.String())
	}
	if strings.Contains(out.String(), "plan error") || strings.Contains(out.String(), "turn ") {
		t.Errorf("per-message lines without -v:\n%s", out.String())
	}
}

// A history of many ended rollouts comes to watch in several bursts: each
// rollout is shown once, ended, never first as running.
func TestWatchReplaysHistoryWhole(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "test")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const rollouts = 60
	var msgs []schema.Message
	for n := int64(1); n <= rollouts; n++ {
		msgs = append(msgs, &schema.Start{Rollout: n, Episodes: 2},
			&schema.Status{Rollout: n, Event: "episode", Episode: 0, Ended: 1, Episodes: 2, Acts: 3},
			&schema.EpisodeEnd{Rollout: n, Episode: 0, Status: schema.EpisodeCompleted},
			&schema.Status{Rollout: n, Event: "episode", Episode: 1, Ended: 2, Episodes: 2, Acts: 5},
			&schema.EpisodeEnd{Rollout: n, Episode: 1, Status: schema.EpisodeCompleted},
			&schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK, Stats: schema.Stats{Episodes: 2, Accuracy: 1, Acts: 5,
				EpisodeStatus: map[string]int{schema.EpisodeCompleted: 2}}})
	}
	if err := b.PublishAll(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"watch", "--nats", url}, noenv, nil, &out, &out) }()
	last := fmt.Sprintf("rollout %-6d [####################] 2/2 episodes, 5 acts  ok", rollouts)
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(out.String(), last); {
		if time.Now().After(deadline) {
			t.Fatalf("watch never showed rollout %d ended; it printed:\n%s", rollouts, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != rollouts || strings.Contains(out.String(), "running") {
		t.Errorf("%d rollouts that ended before watch started: %d lines printed, want one each, all ended:\n%s", rollouts, len(lines), out.String())
	}
}

// A rollout that nothing was heard of yet: watch says what it waits for,
// once, then shows the rollout when it comes. So does watch -v.
func TestWatchSaysWhatItWaitsFor(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "test")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"watch", "--nats", url, "42"}, "rollout 42     waiting at the barrier (planner arrived)"},
		{[]string{"watch", "-v", "--nats", url, "43"}, "rollout.43.arrive.planner"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		var out syncBuffer
		done := make(chan error, 1)
		go func() { done <- run(ctx, c.args, noenv, nil, &out, &out) }()
		n := c.args[len(c.args)-1]
		waiting := "rollout " + n + ": nothing yet — waiting for its first arrival (history kept: 24h; an older rollout is gone)"
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), waiting); {
			if time.Now().After(deadline) {
				t.Fatalf("%v never said what it waits for; it printed:\n%s", c.args, out.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		var rollout int64
		fmt.Sscan(n, &rollout)
		if err := b.Publish(ctx, &schema.Arrive{Rollout: rollout, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner"},
			Tasks: []schema.Task{{Prompt: "?"}}}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), c.want); {
			if time.Now().After(deadline) {
				t.Fatalf("%v never printed %q; it printed:\n%s", c.args, c.want, out.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(out.String(), "nothing yet"); got != 1 {
			t.Errorf("%v: said %d times what it waits for, want once:\n%s", c.args, got, out.String())
		}
	}
	// Every rollout, none yet.
	if got := nothingYet("*", 90*time.Minute); got != "no rollout yet — waiting for the first arrival (history kept: 1h30m; an older rollout is gone)" {
		t.Errorf("nothingYet(*) = %q", got)
	}
}

// The board is drawn once the history is read whole, however it comes:
// here one message at a time, each drawing a chance to show a rollout
// halfway.
func TestFollowBoardDrawsAfterTheHistory(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	msgs := make(chan boardMsg) // unbuffered: every message is a burst of its own
	var out syncBuffer
	done := make(chan error, 1)
	idle := 0
	go func() {
		done <- followBoard(ctx, msgs, 4, func(context.Context, uint64) bool { return false }, &boardWriter{w: &out}, func() { idle++ })
	}()
	enc := func(m schema.Message) []byte {
		data, err := schema.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	history := []boardMsg{
		{subject: "rollout.4.start", data: enc(&schema.Start{Rollout: 4, Episodes: 1})},
		{subject: "rollout.4.status", data: enc(&schema.Status{Rollout: 4, Event: "episode", Ended: 1, Episodes: 1, Acts: 2})},
		{subject: "rollout.4.end.0", data: enc(&schema.EpisodeEnd{Rollout: 4, Status: schema.EpisodeCompleted})},
		{subject: "rollout.4.result.planner", data: enc(&schema.Result{Rollout: 4, Role: schema.RolePlanner, Status: schema.ResultOK,
			Stats: schema.Stats{Episodes: 1, Acts: 2, EpisodeStatus: map[string]int{schema.EpisodeCompleted: 1}}})},
	}
	for i, m := range history {
		m.seq, m.pending = uint64(i+1), uint64(len(history)-1-i)
		msgs <- m
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "ok"); {
		if time.Now().After(deadline) {
			t.Fatalf("the board was not drawn after the history:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(out.String(), "\n"); got != 1 || idle != 0 {
		t.Errorf("%d lines (and %d waiting lines) for one rollout that had ended, want 1:\n%s", got, idle, out.String())
	}
}

func TestBoardLine(t *testing.T) {
	b := newBoard()
	b.apply("rollout.9.arrive.planner", nil, time.Now())
	if got, want := b.rows[9].line(10), "rollout 9      waiting at the barrier (planner arrived)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := bar(3, 4, 8); got != "[######--]" {
		t.Errorf("bar(3, 4, 8) = %q", got)
	}
	if got := bar(0, 0, 4); got != "[----]" {
		t.Errorf("bar(0, 0, 4) = %q", got)
	}
}

// On a terminal the board is redrawn in place: the cursor goes back up over
// the lines drawn before.
func TestBoardRedrawsInPlace(t *testing.T) {
	var out strings.Builder
	b, bw := newBoard(), &boardWriter{w: &out, tty: true}
	b.apply("rollout.1.arrive.actor", nil, time.Now())
	b.apply("rollout.2.arrive.planner", nil, time.Now())
	bw.draw(b)
	bw.draw(b)
	if got, want := strings.Count(out.String(), "\r\033[Krollout 1 "), 2; got != want {
		t.Errorf("rollout 1 drawn %d times, want %d:\n%q", got, want, out.String())
	}
	if !strings.Contains(out.String(), "\033[2A") {
		t.Errorf("the second drawing does not go back up over two lines:\n%q", out.String())
	}
}

// A status event stored after a later one, or after the result (published
// by a handler that ran at the same time), moves no rollout back.
func TestBoardNeverMovesBack(t *testing.T) {
	enc := func(m schema.Message) []byte {
		data, err := schema.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	b := newBoard()
	b.apply("rollout.3.start", enc(&schema.Start{Rollout: 3, Episodes: 2}), time.Now())
	b.apply("rollout.3.status", enc(&schema.Status{Rollout: 3, Event: "episode", Ended: 1, Episodes: 2, Acts: 4}), time.Now())
	if b.apply("rollout.3.status", enc(&schema.Status{Rollout: 3, Event: "episode", Ended: 1, Episodes: 2, Acts: 3}), time.Now()) {
		t.Errorf("an older count of acts changed the board: %+v", b.rows[3])
	}
	b.apply("rollout.3.result.planner", enc(&schema.Result{Rollout: 3, Role: schema.RolePlanner, Status: schema.ResultOK,
		Stats: schema.Stats{Episodes: 2, Acts: 6, EpisodeStatus: map[string]int{schema.EpisodeCompleted: 2}}}), time.Now())
	ended := b.rows[3].line(10)
	for _, st := range []*schema.Status{
		{Rollout: 3, Event: "episode", Ended: 2, Episodes: 2, Acts: 5},
		{Rollout: 3, Event: "episode", Ended: 1, Episodes: 2, Acts: 7},
	} {
		if b.apply("rollout.3.status", enc(st), time.Now()) || b.rows[3].line(10) != ended {
			t.Errorf("a status after the result changed the rollout: %q, was %q", b.rows[3].line(10), ended)
		}
	}
}

// A refused arrival's answer (rollout.N.result.<role>.rejected) is not the
// rollout's result: it shows while the rollout waits and no arrival of the
// role came after it, and the real result, or a later start, replaces it.
// Before, the first answer on a result subject won: a refused re-arrival
// froze the line as invalid and the rollout's own ok result was ignored.
func TestBoardSkipsRefusedArrivals(t *testing.T) {
	enc := func(m schema.Message) []byte {
		data, err := schema.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	t0 := time.Now()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	refused := func(n int64) []byte {
		return enc(&schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultInvalid, Reason: "config.max_turns -2", Rejected: true})
	}
	ok := enc(&schema.Result{Rollout: 4, Role: schema.RolePlanner, Status: schema.ResultOK, Stats: schema.Stats{Episodes: 1, Accuracy: 1,
		EpisodeStatus: map[string]int{schema.EpisodeCompleted: 1}}})
	b := newBoard()
	// An arrival refused, then a corrected one that runs.
	b.apply("rollout.4.arrive.planner", nil, at(0))
	b.apply("rollout.4.result.planner.rejected", refused(4), at(1))
	if got, want := b.rows[4].line(10), "rollout 4      no arrival taken; planner arrival refused: config.max_turns -2"; got != want {
		t.Errorf("refused: %q, want %q", got, want)
	}
	b.apply("rollout.4.arrive.planner", nil, at(2))
	if got, want := b.rows[4].line(10), "rollout 4      waiting at the barrier (planner arrived)"; got != want {
		t.Errorf("arrived again: %q, want %q", got, want)
	}
	b.apply("rollout.4.start", enc(&schema.Start{Rollout: 4, Episodes: 1}), at(3))
	// A trainer arriving once more while it runs: refused, and no result.
	if b.apply("rollout.4.result.planner.rejected", refused(4), at(4)) {
		t.Error("a refusal changed a running rollout's line")
	}
	b.apply("rollout.4.result.planner", ok, at(5))
	if got := b.rows[4].line(10); !strings.Contains(got, "ok, accuracy 1.00") {
		t.Errorf("ended: %q, want its ok result", got)
	}
	// Read from two streams in no set order: the refusal first, then the
	// arrival it refused (stored before it).
	b.apply("rollout.5.result.planner.rejected", refused(5), at(1))
	b.apply("rollout.5.arrive.planner", nil, at(0))
	if got := b.rows[5].line(10); !strings.Contains(got, "planner arrival refused") {
		t.Errorf("a refusal read before the arrival it refused: %q", got)
	}
	// Of two arrivals, one refused: the other waits at the barrier.
	b.apply("rollout.6.arrive.actor", nil, at(0))
	b.apply("rollout.6.arrive.planner", nil, at(0))
	b.apply("rollout.6.result.planner.rejected", refused(6), at(1))
	if got, want := b.rows[6].line(10), "rollout 6      waiting at the barrier (actor arrived); planner arrival refused: config.max_turns -2"; got != want {
		t.Errorf("one of two refused: %q, want %q", got, want)
	}
	// A group's samples are not the result.
	if b.apply("rollout.4.result.planner.group.0", ok, at(6)) {
		t.Error("a group's message changed the board")
	}
}

// watch takes one rollout id, or none: anything else would match nothing
// (watch foo waited for ever) or other rollouts ('1.*' was put into the
// subject as a wildcard), and a second argument was ignored.
func TestWatchRefusesWhatIsNotARollout(t *testing.T) {
	_, url := bustest.Server(t)
	bustest.Provision(t, url)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"foo"}, `watch: rollout "foo": want a rollout id`},
		{[]string{"1.*"}, `watch: rollout "1.*": want a rollout id`},
		{[]string{">"}, `watch: rollout ">": want a rollout id`},
		{[]string{"-v", "3", "4"}, `watch: unexpected arguments ["4"]`},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var out syncBuffer
		err := run(ctx, append([]string{"watch", "--nats", url}, c.args...), noenv, nil, &out, &out)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("watch %v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
	// Flags after the rollout are read too.
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"watch", "--nats", url, "7", "-v"}, noenv, nil, &out, &out) }()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "rollout 7: nothing yet"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("watch 7 -v printed:\n%s", out.String())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestBoardSkipsWhatIsNoArrival: rollout.N.arrive (of before roles were in
// the subject, kept on ROLLOUT for the admin) and rollout.N.cancel are no
// arrival and no rollout of their own. Before, watch showed "waiting at
// the barrier (arrive arrived)" for the one and a "seen" line for the
// other.
func TestBoardSkipsWhatIsNoArrival(t *testing.T) {
	b := newBoard()
	for _, s := range []string{"rollout.9.arrive", "rollout.8.cancel", "rollout.8.cancel.planner"} {
		if b.apply(s, []byte(`{"rollout":9}`), time.Now()) {
			t.Errorf("%s changed the board", s)
		}
	}
	if len(b.rows) != 0 {
		for _, n := range b.order {
			t.Errorf("a line for what is no rollout: %q", b.rows[n].line(10))
		}
	}
}

// TestDescribeReadsJSONArrivals: watch -v describes an arrival a trainer
// sent as JSON (Content-Type: application/json, as with nats pub), as the
// session-store reads it. Before, it printed "(not a planact message)".
func TestDescribeReadsJSONArrivals(t *testing.T) {
	body := []byte(`{"schema": "rollout.arrive/1", "rollout": 7, "role": "planner", "at_ms": 1767225600000, "weight_version": "step-7",
		"engine": {"url": "http://127.0.0.1:30000", "protocol": "sglang"}, "tasks": [{"prompt": "What is the capital of France?", "label": "Paris"}]}`)
	h := nats.Header{}
	h.Set(schema.HdrContentType, schema.ContentTypeJSON)
	want := "planner arrives (engine http://127.0.0.1:30000, weights step-7, 1 tasks)"
	if got := Describe(body, h); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := Describe([]byte("hello"), h); got != "(not a planact message)" {
		t.Errorf("a body that is no message: got %q", got)
	}
}

// TestClipKeepsCharactersWhole: a text cut short for a line (a question in
// Chinese, say) is cut between characters. Before, it was cut at a byte
// count, inside a character, and inspect and watch printed an invalid one.
func TestClipKeepsCharactersWhole(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"法国的首都是哪里", 10, "法国的…"},
		{"héllo world", 2, "h…"},
		{"plain text", 5, "plain…"},
		{"short", 30, "short"},
	} {
		got := clip(c.s, c.n)
		if got != c.want || !utf8.ValidString(got) {
			t.Errorf("clip(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}
