package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// runWatch follows rollouts live, from the beginning of their history:
// one line per rollout with its progress (redrawn in place on a terminal,
// a new line per change otherwise), or with -v one line per message. The
// per-message lines keep the order JetStream stored them within each
// stream (ROLLOUT, PLAN, ACT, each trainer's); the streams interleave. It
// reads with direct gets and creates no consumer, so the viewer may run it.
func runWatch(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var conn bus.ConnOptions
	conn.AddFlags(fs, "")
	acts := fs.Bool("acts", true, "with -v: show act messages too")
	verbose := fs.Bool("v", false, "one line per message (plan, act, episode end, …) instead of one progress line per rollout")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: planact watch [flags] [rollout]   (all rollouts without one)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	rollout := "*"
	if fs.NArg() > 0 {
		rollout = fs.Arg(0)
	}
	conn, err := conn.Resolve(getenv)
	if err != nil {
		return err
	}
	nc, err := conn.Dial("planact-watch")
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer nc.Close()
	if !*verbose {
		return watchBoard(ctx, nc, rollout, stdout)
	}
	streams := map[string]string{
		bus.StreamRollout: "rollout." + rollout + ".>",
		bus.StreamPlan:    "plan." + rollout + ".>",
	}
	for _, role := range bus.Roles {
		streams[bus.StreamTrainer(role)] = "rollout." + rollout + ".>"
	}
	if *acts {
		streams[bus.StreamAct] = "act." + rollout + ".>"
	}
	lines := make(chan string, 256)
	follow(ctx, nc, streams, func(m bus.StoredMsg) {
		select {
		case lines <- fmt.Sprintf("%s %-28s %s", m.Time.Format("15:04:05.000"), m.Subject, Describe(m.Data)):
		case <-ctx.Done():
		}
	})
	for {
		select {
		case l := <-lines:
			fmt.Fprintln(stdout, l)
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil
			}
			return ctx.Err()
		}
	}
}

// watchPoll is how often watch reads what is new when nothing was.
const watchPoll = 200 * time.Millisecond

// follow reads each stream on its filter from its first message, in stream
// order, with direct gets (no consumer: the viewer may run it), handing
// every message to fn until ctx ends.
func follow(ctx context.Context, nc *nats.Conn, streams map[string]string, fn func(bus.StoredMsg)) {
	for stream, filter := range streams {
		go func() { _ = bus.Follow(ctx, nc, stream, filter, 1, watchPoll, fn, nil) }()
	}
}

// watchBoard follows ROLLOUT and the trainers' arrivals for rollout ("*"
// for all) and draws the progress board until ctx ends.
func watchBoard(ctx context.Context, nc *nats.Conn, rollout string, stdout io.Writer) error {
	type stored struct {
		subject string
		data    []byte
		at      time.Time
	}
	msgs := make(chan stored, 256)
	streams := map[string]string{bus.StreamRollout: "rollout." + rollout + ".>"}
	for _, role := range bus.Roles {
		streams[bus.StreamTrainer(role)] = "rollout." + rollout + ".arrive." + role
	}
	follow(ctx, nc, streams, func(m bus.StoredMsg) {
		select {
		case msgs <- stored{m.Subject, m.Data, m.Time}:
		case <-ctx.Done():
		}
	})
	b, bw := newBoard(), &boardWriter{w: stdout, tty: isTerminal(stdout)}
	tick := time.NewTicker(time.Second) // a running rollout's clock, on a terminal
	defer tick.Stop()
	for {
		select {
		case m := <-msgs:
			changed := b.apply(m.subject, m.data, m.at)
			// Draw once the burst of history is read, not per message.
			for more := true; more; {
				select {
				case m := <-msgs:
					changed = b.apply(m.subject, m.data, m.at) || changed
				default:
					more = false
				}
			}
			if changed {
				bw.draw(b)
			}
		case <-tick.C:
			if bw.tty {
				bw.draw(b)
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil
			}
			return ctx.Err()
		}
	}
}

// Describe summarises a planact message body in one line.
func Describe(data []byte) string {
	kind, err := schema.KindOf(data)
	if err != nil {
		return "(not a planact message)"
	}
	switch strings.SplitN(kind, "/", 2)[0] {
	case "rollout.arrive":
		var v schema.Arrive
		if schema.Unmarshal(data, &v) == nil {
			return fmt.Sprintf("%s arrives (engine %s, weights %s, %d tasks)", v.Role, v.Engine.URL, v.WeightVersion, len(v.Tasks))
		}
	case "rollout.start":
		var v schema.Start
		if schema.Unmarshal(data, &v) == nil {
			return fmt.Sprintf("starts: %d episodes", v.Episodes)
		}
	case "rollout.status":
		var v schema.Status
		if schema.Unmarshal(data, &v) == nil {
			return fmt.Sprintf("%s %s", v.Event, v.Detail)
		}
	case "plan.req":
		var v schema.PlanRequest
		if schema.Unmarshal(data, &v) == nil {
			return fmt.Sprintf("turn %d: ask the planner", v.Turn)
		}
	case "plan.out":
		var v schema.PlanOutput
		if schema.Unmarshal(data, &v) == nil {
			return fmt.Sprintf("turn %d: planner wrote %d chars (%s): %s", v.Turn, len(v.Text), v.FinishReason, clip(v.Text, 80))
		}
	case "plan.partial":
		var v schema.PlanPartial
		if schema.Unmarshal(data, &v) == nil {
			return fmt.Sprintf("turn %d: planner has written %d chars so far (#%d)", v.Turn, len(v.Text), v.Seq)
		}
	case "plan.dag":
		var v schema.PlanDAG
		if schema.Unmarshal(data, &v) == nil {
			ids := make([]string, len(v.Plan.Nodes))
			for i, n := range v.Plan.Nodes {
				ids[i] = n.ID
				if len(n.Deps) > 0 {
					ids[i] += "<-" + strings.Join(n.Deps, ",")
				}
			}
			if v.Partial {
				return fmt.Sprintf("turn %d: partial %s plan #%d, nodes %s", v.Turn, v.Plan.Format, v.Seq, strings.Join(ids, " "))
			}
			return fmt.Sprintf("turn %d: %s plan, nodes %s", v.Turn, v.Plan.Format, strings.Join(ids, " "))
		}
	case "plan.answer":
		var v schema.PlanAnswer
		if schema.Unmarshal(data, &v) == nil {
			return fmt.Sprintf("turn %d: answer %q", v.Turn, v.Answers)
		}
	case "plan.error":
		var v schema.PlanError
		if schema.Unmarshal(data, &v) == nil {
			return fmt.Sprintf("turn %d: %s: %s", v.Turn, v.ErrorKind, v.Message)
		}
	case "act.done":
		var v schema.ActDone
		if schema.Unmarshal(data, &v) == nil {
			out := v.Output
			if v.Error != "" {
				out = v.Error
			}
			return fmt.Sprintf("%s after %d attempt(s): %s", v.Status, v.Attempts, clip(out, 60))
		}
	case "rollout.end":
		var v schema.EpisodeEnd
		if schema.Unmarshal(data, &v) == nil {
			return fmt.Sprintf("episode %s after %d turns %q %s", v.Status, v.Turns, v.Answers, v.Reason)
		}
	case "rollout.result":
		var v schema.Result
		if schema.Unmarshal(data, &v) == nil {
			return fmt.Sprintf("%s result %s: %d samples, accuracy %.2f %s", v.Role, v.Status, v.SampleCount, v.Stats.Accuracy, v.Reason)
		}
	}
	return kind
}

func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
