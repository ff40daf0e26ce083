package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestWatchShowsTrainerTextWithoutObeyingIt: what watch prints holds what
// trainers wrote: a cancel's reason (in both roles' results), a refused
// arrival's reason, a planner's output (from the trainer's own engine), a
// subject's token. Printed as it was, an escape sequence in it made the
// viewer's terminal clear the screen, move the cursor and rewrite the
// lines above (the board, or what watch -v printed before), a carriage
// return or a line break forged lines of their own. Now a control
// character is shown as its escape (\x1b), and the board's own cursor
// moves are the only ones.
func TestWatchShowsTrainerTextWithoutObeyingIt(t *testing.T) {
	const evil = "\x1b[2J\x1b[1A\x1b[2K\r\nrollout 9      ok\u202e"
	enc := func(m schema.Message) []byte {
		data, err := schema.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	t0 := time.Now()
	b := newBoard()
	b.apply("rollout.4.arrive.planner", nil, t0)
	b.apply("rollout.4.result.planner.rejected", enc(&schema.Result{Rollout: 4, Role: schema.RolePlanner, Status: schema.ResultInvalid,
		Reason: "engine " + evil, Rejected: true}), t0.Add(time.Second))
	b.apply("rollout.5.arrive.planner", nil, t0)
	b.apply("rollout.5.start", enc(&schema.Start{Rollout: 5, Episodes: 1}), t0.Add(time.Second))
	for _, role := range bus.Roles {
		b.apply("rollout.5.result."+role, enc(&schema.Result{Rollout: 5, Role: role, Status: schema.ResultAborted,
			Reason: "aborted by the actor trainer: " + evil}), t0.Add(2*time.Second))
	}
	own := regexp.MustCompile(`\r\x1b\[K|\x1b\[[0-9]+A`) // the board's redrawing
	for _, tty := range []bool{false, true} {
		var out bytes.Buffer
		bw := &boardWriter{w: &out, tty: tty}
		bw.draw(b)
		bw.draw(b)
		got := own.ReplaceAllString(out.String(), "")
		lines := 2 // a log prints a line once, until it changes
		if tty {
			lines = 4 // drawn twice
		}
		if strings.ContainsAny(got, "\x1b\r\u202e") || strings.Count(got, "\n") != lines {
			t.Errorf("tty %v: the board printed %q: want the trainer's text escaped, one line per rollout", tty, out.String())
		}
		if !strings.Contains(got, `\x1b[2J`) {
			t.Errorf("tty %v: the board printed %q: want the reason shown, escaped", tty, out.String())
		}
	}
	for _, m := range []bus.StoredMsg{
		{Subject: "rollout.5.result.planner", Data: enc(&schema.Result{Rollout: 5, Role: schema.RolePlanner, Status: schema.ResultAborted, Reason: evil})},
		{Subject: "plan.5.out.0", Data: enc(&schema.PlanOutput{Rollout: 5, Turn: 1, Text: evil})},
		{Subject: "rollout.\x1b[2J.arrive.planner", Data: []byte("hello")},
	} {
		m.Time = t0
		if got := watchLine(m); strings.ContainsAny(got, "\x1b\r\n\u202e") {
			t.Errorf("watch -v printed %q for %s", got, m.Subject)
		}
	}
}

// TestInspectShowsTrainerTextWithoutObeyingIt: planact inspect prints a
// rollout's questions, weight versions, planner outputs and reasons,
// which trainers and their engines wrote; an escape sequence there
// reached the terminal as it was. Now its lines and tabs are kept, and
// every other control character is shown as its escape.
func TestInspectShowsTrainerTextWithoutObeyingIt(t *testing.T) {
	const evil = "\x1b[2J\x1b]52;c;cHduZWQ=\x07\r"
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "test")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.PublishAll(ctx,
		&schema.Arrive{Rollout: 1, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner"}, WeightVersion: "v" + evil,
			Tasks: []schema.Task{{Prompt: "question " + evil, Label: "x"}}},
		&schema.Start{Rollout: 1, Episodes: 1},
		&schema.PlanRequest{Rollout: 1, Episode: 0, Turn: 1},
		&schema.PlanOutput{Rollout: 1, Episode: 0, Turn: 1, Text: "plan " + evil},
		&schema.EpisodeEnd{Rollout: 1, Episode: 0, Turns: 1, Status: schema.EpisodeAborted, Reason: "aborted by the actor trainer: " + evil},
		&schema.Result{Rollout: 1, Role: schema.RolePlanner, Status: schema.ResultAborted, Reason: "aborted by the actor trainer: " + evil}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"1"}, {"1", "0"}} {
		var out, errOut syncBuffer
		if err := run(ctx, append([]string{"inspect", "--nats", url}, args...), noenv, nil, &out, &errOut); err != nil {
			t.Fatalf("inspect %v: %v\n%s", args, err, errOut.String())
		}
		if got := out.String(); strings.ContainsAny(got, "\x1b\x07\r") || !strings.Contains(got, `\x1b[2J`) {
			t.Errorf("inspect %v printed %q: want the trainer's text shown escaped", args, got)
		}
	}
}
