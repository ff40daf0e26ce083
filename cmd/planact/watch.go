package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if !*verbose && flagSet(fs, "acts") {
		return fmt.Errorf("watch: --acts=%v: only with -v (the progress lines count acts whatever it says)", *acts)
	}
	rollout := "*"
	switch len(pos) {
	case 0:
	case 1:
		// A subject token: anything but a rollout id would match nothing
		// (watch would wait for ever) or, with a wildcard, other rollouts.
		n, err := strconv.ParseInt(pos[0], 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("watch: rollout %q: want a rollout id (a number ≥ 0), or none for every rollout", pos[0])
		}
		rollout = strconv.FormatInt(n, 10)
	default:
		fs.Usage()
		return fmt.Errorf("watch: unexpected arguments %q: name one rollout, or none for every rollout", pos[1:])
	}
	conn, err = conn.Resolve(getenv)
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
		return watchBoard(ctx, nc, rollout, kept, stdout)
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
	history, err := hasHistory(ctx, nc, streams)
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	if !history {
		fmt.Fprintln(stdout, nothingYet(rollout, kept))
	}
	lines := make(chan string, 256)
	follow(ctx, nc, streams, func(m bus.StoredMsg) {
		select {
		case lines <- watchLine(m):
		case <-ctx.Done():
		}
	}, nil)
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
	// (STREAM.INFO of ROLLOUT: the viewer may read it.)
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

// watchPoll is how often watch reads what is new when nothing was.
const watchPoll = 200 * time.Millisecond

// follow reads each stream on its filter from its first message, in stream
// order, with direct gets (no consumer: the viewer may run it), handing
// every message to fn until ctx ends. caughtUp, if not nil, is called with
// a stream's name each time a read of it found nothing more.
func follow(ctx context.Context, nc *nats.Conn, streams map[string]string, fn func(bus.StoredMsg), caughtUp func(stream string)) {
	for stream, filter := range streams {
		var idle func()
		if caughtUp != nil {
			idle = func() { caughtUp(stream) }
		}
		go func() { _ = bus.Follow(ctx, nc, stream, filter, 1, watchPoll, fn, idle) }()
	}
}

// hasHistory says whether any of the streams holds a message on its filter.
func hasHistory(ctx context.Context, nc *nats.Conn, streams map[string]string) (bool, error) {
	for stream, filter := range streams {
		last, err := bus.LastSeq(ctx, nc, stream, filter)
		if err != nil {
			return false, fmt.Errorf("stream %s: %w", stream, err)
		}
		if last > 0 {
			return true, nil
		}
	}
	return false, nil
}

// watchBoard follows ROLLOUT and the trainers' arrivals for rollout ("*"
// for all) and draws the progress board until ctx ends.
func watchBoard(ctx context.Context, nc *nats.Conn, rollout string, kept time.Duration, stdout io.Writer) error {
	streams := map[string]string{bus.StreamRollout: "rollout." + rollout + ".>"}
	for _, role := range bus.Roles {
		streams[bus.StreamTrainer(role)] = "rollout." + rollout + ".arrive." + role
	}
	has, err := hasHistory(ctx, nc, streams)
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	var history uint64
	if has {
		history = 1 // read whole, as told by caughtUp, before the first drawing
	}
	// The history is read once every stream was read to its end.
	var mu sync.Mutex
	caught := map[string]bool{}
	msgs := make(chan boardMsg, 256)
	follow(ctx, nc, streams, func(m bus.StoredMsg) {
		// pending 1: from several streams, no message says the history is
		// read; caughtUp does.
		select {
		case msgs <- boardMsg{subject: m.Subject, data: m.Data, at: m.Time, seq: m.Seq, pending: 1}:
		case <-ctx.Done():
		}
	}, func(stream string) {
		mu.Lock()
		caught[stream] = true
		mu.Unlock()
	})
	caughtUp := func(context.Context, uint64) bool {
		mu.Lock()
		defer mu.Unlock()
		return len(caught) == len(streams)
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

// Describe summarises a planact message body, stored with headers h, in
// one line.
func Describe(data []byte, h nats.Header) string {
	kind, err := schema.KindOf(data)
	if err != nil {
		// What a trainer writes may be JSON (Content-Type:
		// application/json, as with nats pub).
		var e schema.Envelope
		if json.Unmarshal(data, &e) != nil || !strings.Contains(e.Schema, "/") {
			return "(not a planact message)"
		}
		kind = e.Schema
	}
	switch strings.SplitN(kind, "/", 2)[0] {
	case "rollout.arrive":
		var v schema.Arrive
		err := schema.Unmarshal(data, &v)
		if err != nil && len(h) > 0 {
			v = schema.Arrive{}
			err = schema.UnmarshalTrainer(data, h, &v)
		}
		if err == nil {
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

// watchLine is what watch -v prints of m: when it was stored, where, and
// what it says.
func watchLine(m bus.StoredMsg) string {
	return printable(fmt.Sprintf("%s %-28s %s", m.Time.Format("15:04:05.000"), m.Subject, Describe(m.Data, m.Header)), "")
}

// printable is s with every control character (an escape sequence's
// ESC, a carriage return, a line break) and bidirectional control but
// those in keep, and every byte that is no UTF-8, written as its Go escape
// (\x1b, \r, \u202e, \xff). What watch and inspect print holds what
// trainers and their engines wrote (a cancel's reason, a weight version, a
// planner's output, a subject's token): a terminal shows it, and obeys
// none of it (erasing lines, moving the cursor, rewriting the board).
func printable(s, keep string) string {
	unsafe := func(r rune) bool {
		return (unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)) && !strings.ContainsRune(keep, r)
	}
	if utf8.ValidString(s) && !strings.ContainsFunc(s, unsafe) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case unsafe(r):
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[:size])
		}
		s = s[size:]
	}
	return b.String()
}

// textWriter writes to w what is written to it, printable but for its
// line breaks and tabs: a report of many lines (planact inspect's).
type textWriter struct{ w io.Writer }

func (t textWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(t.w, printable(string(p), "\n\t")); err != nil {
		return 0, err
	}
	return len(p), nil
}

// clip is s on one line, cut to at most n bytes at a character's start
// (a cut inside one would print an invalid character).
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		return s[:n] + "…"
	}
	return s
}
