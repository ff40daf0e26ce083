package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// runWatch follows rollouts live, from the beginning of their history:
// one line per rollout with its progress (redrawn in place on a terminal,
// a new line per change otherwise), or with -v one line per message. The
// per-message lines keep the order JetStream stored them within each
// stream (ROLLOUT, PLAN, ACT); the three streams interleave.
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
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	kept, err := historyKept(ctx, js)
	if err != nil {
		return fmt.Errorf("watch: %s: %w", bus.Redact(conn.Servers()), err)
	}
	if !*verbose {
		return watchBoard(ctx, js, nc, rollout, kept, stdout)
	}
	streams := map[string]string{
		bus.StreamRollout: "rollout." + rollout + ".>",
		bus.StreamPlan:    "plan." + rollout + ".>",
	}
	if *acts {
		streams[bus.StreamAct] = "act." + rollout + ".>"
	}
	lines := make(chan string, 256)
	var history uint64
	for stream, filter := range streams {
		cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
		if err != nil {
			return fmt.Errorf("watch %s: %w", stream, err)
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			md, _ := m.Metadata()
			at := time.Now()
			if md != nil {
				at = md.Timestamp
			}
			select {
			case lines <- fmt.Sprintf("%s %-28s %s", at.Format("15:04:05.000"), m.Subject(), Describe(m.Data())):
			case <-ctx.Done():
			}
		})
		if err != nil {
			return err
		}
		defer cc.Stop()
		if info := cons.CachedInfo(); info != nil {
			history += info.NumPending
		}
	}
	if history == 0 {
		fmt.Fprintln(stdout, nothingYet(rollout, kept))
	}
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

// historyKept is how long the server keeps planact's history (the ROLLOUT
// stream's max age), or an error saying planact is not there.
func historyKept(ctx context.Context, js jetstream.JetStream) (time.Duration, error) {
	s, err := js.Stream(ctx, bus.StreamRollout)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, fmt.Errorf("no planact here: the server has no %s stream (start planact: planact up, or planact serve …)", bus.StreamRollout)
	}
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", bus.StreamRollout, err)
	}
	return s.CachedInfo().Config.MaxAge, nil
}

// nothingYet is what watch says when the history holds nothing of what it
// follows: what it waits for, and how far back the history would go.
func nothingYet(rollout string, kept time.Duration) string {
	h := "history kept: " + shortDuration(kept) + "; an older rollout is gone"
	if kept <= 0 {
		h = "history kept for ever"
	}
	if rollout == "*" {
		return fmt.Sprintf("no rollout yet — waiting for the first arrival (%s)", h)
	}
	return fmt.Sprintf("rollout %s: nothing yet — waiting for its first arrival (%s)", rollout, h)
}

// shortDuration is d without its zero minutes and seconds: 24h, 1h30m, 90s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// boardMsg is a message of ROLLOUT as the board reads it.
type boardMsg struct {
	subject string
	data    []byte
	at      time.Time
	seq     uint64 // its stream sequence
	pending uint64 // messages of the filter stored after it when it was delivered
}

// watchBoard follows ROLLOUT for rollout ("*" for all) and draws the
// progress board until ctx ends.
func watchBoard(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, rollout string, kept time.Duration, stdout io.Writer) error {
	filter := "rollout." + rollout + ".>"
	msgs := make(chan boardMsg, 256)
	cons, err := js.OrderedConsumer(ctx, bus.StreamRollout, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return fmt.Errorf("watch %s: %w", bus.StreamRollout, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		bm := boardMsg{subject: m.Subject(), data: m.Data(), at: time.Now()}
		if md, _ := m.Metadata(); md != nil {
			bm.at, bm.seq, bm.pending = md.Timestamp, md.Sequence.Stream, md.NumPending
		}
		select {
		case msgs <- bm:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return err
	}
	defer cc.Stop()
	var history uint64
	if info := cons.CachedInfo(); info != nil {
		history = info.NumPending
	}
	caughtUp := func(ctx context.Context, read uint64) bool {
		last, err := lastSeq(ctx, nc, bus.StreamRollout, filter)
		return err == nil && last <= read
	}
	return followBoard(ctx, msgs, history, caughtUp, &boardWriter{w: stdout, tty: isTerminal(stdout)},
		func() { fmt.Fprintln(stdout, nothingYet(rollout, kept)) })
}

// followBoard applies the messages of msgs to a board and draws it with
// bw until ctx ends. history is how many messages the stream held when
// the consumer was made: they are read whole before the board is first
// drawn, since the consumer hands them over in bursts and a drawing
// between two would show a rollout that had ended as running, then as
// ended again. What the history holds is known from the messages
// themselves (the last one has nothing pending after it); caughtUp, asked
// once a second while the history is read, says whether the stream holds
// nothing after sequence read (history that expired while it was read).
// With no history, idle is called once: watch says what it waits for.
func followBoard(ctx context.Context, msgs <-chan boardMsg, history uint64, caughtUp func(ctx context.Context, read uint64) bool, bw *boardWriter, idle func()) error {
	b := newBoard()
	replaying, dirty := history > 0, false
	var read uint64
	if !replaying {
		idle()
	}
	take := func(m boardMsg) {
		dirty = b.apply(m.subject, m.data, m.at) || dirty
		read = max(read, m.seq)
		if m.pending == 0 {
			replaying = false
		}
	}
	tick := time.NewTicker(time.Second) // a running rollout's clock, on a terminal
	defer tick.Stop()
	for {
		select {
		case m := <-msgs:
			take(m)
			// Draw once the burst is read, not per message.
			for more := true; more; {
				select {
				case m := <-msgs:
					take(m)
				default:
					more = false
				}
			}
		case <-tick.C:
			if replaying && caughtUp(ctx, read) {
				replaying = false
				if len(b.order) == 0 {
					idle()
				}
			}
			dirty = dirty || bw.tty
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil
			}
			return ctx.Err()
		}
		if dirty && !replaying {
			bw.draw(b)
			dirty = false
		}
	}
}

// lastSeq is the stream sequence of the last message stream holds on
// filter, 0 when it holds none, read from the stream's leader.
func lastSeq(ctx context.Context, nc *nats.Conn, stream, filter string) (uint64, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": filter})
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	reply, err := nc.RequestWithContext(rctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return 0, err
	}
	var resp struct {
		Error *struct {
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Seq uint64 `json:"seq"`
		} `json:"message"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return 0, err
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == 10037: // no message
		return 0, nil
	case resp.Error != nil:
		return 0, errors.New(resp.Error.Description)
	case resp.Message == nil:
		return 0, errors.New("no message in the answer")
	}
	return resp.Message.Seq, nil
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
