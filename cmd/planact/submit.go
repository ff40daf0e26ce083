package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
)

// runSubmit plays one or both trainers for one rollout from the command
// line: the quickest way to try a deployment or an engine by hand.
func runSubmit(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("submit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var conn bus.ConnOptions
	conn.AddFlags(fs, "")
	rollout := fs.Int64("rollout", -1, "rollout id (required)")
	role := fs.String("role", "both", "arrive as planner, actor, or both")
	plannerURL := fs.String("planner-engine", "", "planner engine URL (for --role planner or both)")
	actorURL := fs.String("actor-engine", "", "actor engine URL (for --role actor or both)")
	protocol := fs.String("protocol", "sglang", "engine protocol: "+strings.Join(engine.Protocols, ", "))
	tasksFile := fs.String("tasks", "", "JSON Lines file of tasks ({\"prompt\":…,\"label\":…,\"group_index\":…,\"index\":…}); '-' for stdin; the planner brings them (with --role actor, the actor)")
	simTasks := fs.Int("sim-tasks", 0, "instead of --tasks: this many questions of the simulated world")
	configFile := fs.String("config", "", "JSON file with the rollout configuration (see README)")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up waiting after this long")
	asJSON := fs.Bool("json", false, "print the results as JSON (samples included) instead of a summary")
	// Flags after a stray word are parsed too: the flag package alone
	// stops there, and left them unread (--planner-engine "required").
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("submit: unexpected arguments %q: every input is a flag (--tasks FILE, --rollout N, …)", pos)
	}
	if *rollout < 0 {
		if flagSet(fs, "rollout") {
			return fmt.Errorf("submit: --rollout %d: want a rollout id (a number ≥ 0)", *rollout)
		}
		return fmt.Errorf("submit: --rollout is required")
	}
	if *timeout <= 0 {
		return fmt.Errorf("submit: --timeout %v: want a positive duration", *timeout)
	}
	roles := map[string]bool{}
	switch *role {
	case "both":
		roles[schema.RolePlanner], roles[schema.RoleActor] = true, true
	case schema.RolePlanner, schema.RoleActor:
		roles[*role] = true
	default:
		return fmt.Errorf("submit: --role %q: want planner, actor or both", *role)
	}
	// The engines are checked before anything is sent: a role refused
	// for its engine left the other's arrival waiting for it.
	if !slices.Contains(engine.Protocols, *protocol) {
		return fmt.Errorf("submit: --protocol %q: want one of %s", *protocol, strings.Join(engine.Protocols, ", "))
	}
	for _, e := range []struct{ role, flag, url string }{{schema.RolePlanner, "--planner-engine", *plannerURL}, {schema.RoleActor, "--actor-engine", *actorURL}} {
		switch {
		case !roles[e.role]:
		case e.url == "":
			return fmt.Errorf("submit: %s is required for the %s", e.flag, e.role)
		default:
			if err := checkEngineURL(e.flag, e.url); err != nil {
				return fmt.Errorf("submit: %w", err)
			}
		}
	}
	var tasks []schema.Task
	switch {
	case *simTasks < 0 || flagSet(fs, "sim-tasks") && *simTasks == 0:
		return fmt.Errorf("submit: --sim-tasks %d: want 1 or more", *simTasks)
	case *tasksFile != "" && *simTasks > 0:
		return fmt.Errorf("submit: --tasks %s and --sim-tasks %d: give one of them", *tasksFile, *simTasks)
	case *tasksFile != "":
		tasks, err = readTasks(*tasksFile, os.Stdin)
	case *simTasks > 0:
		tasks = demo.Tasks(sim.DefaultWorld(), *simTasks, 1, *rollout, "")
	}
	if err != nil {
		return err
	}
	if roles[schema.RolePlanner] && len(tasks) == 0 {
		return fmt.Errorf("submit: the planner brings the tasks: give --tasks or --sim-tasks")
	}
	var cfg *schema.Config
	if *configFile != "" {
		data, err := os.ReadFile(*configFile)
		if err != nil {
			return err
		}
		cfg = &schema.Config{}
		if err := decodeOne(data, cfg); err != nil {
			return fmt.Errorf("submit: %s: %w", *configFile, err)
		}
	}
	conn, err = conn.Resolve(getenv)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	arrivals := map[string]*schema.Arrive{}
	if roles[schema.RolePlanner] {
		if *plannerURL == "" {
			return fmt.Errorf("submit: --planner-engine is required for the planner")
		}
		arrivals[schema.RolePlanner] = &schema.Arrive{Rollout: *rollout, Role: schema.RolePlanner,
			Engine: schema.Engine{URL: *plannerURL, Protocol: *protocol}, Tasks: tasks, Config: cfg}
	}
	if roles[schema.RoleActor] {
		if *actorURL == "" {
			return fmt.Errorf("submit: --actor-engine is required for the actor")
		}
		arrivals[schema.RoleActor] = &schema.Arrive{Rollout: *rollout, Role: schema.RoleActor,
			Engine: schema.Engine{URL: *actorURL, Protocol: *protocol}, Config: cfg}
		if !roles[schema.RolePlanner] {
			// Either role may bring the batch: tasks given are sent.
			arrivals[schema.RoleActor].Tasks = tasks
		}
	}
	// Every connection is made and checked before anything is sent: a
	// role that cannot connect must not leave the other's arrival waiting.
	clients := map[string]*client.Client{}
	var progress *progressWatch
	for _, r := range []string{schema.RolePlanner, schema.RoleActor} {
		if arrivals[r] == nil {
			continue
		}
		nc, err := conn.Dial("planact-submit-" + r)
		if err != nil {
			return fmt.Errorf("submit: %w", err)
		}
		defer nc.Close()
		if err := planactThere(ctx, nc, *rollout, r); err != nil {
			return fmt.Errorf("submit: %s: %w", bus.Redact(conn.Servers()), err)
		}
		if progress == nil {
			w := stderr
			if *asJSON {
				w = io.Discard // followed all the same: an interrupted submit needs to know what planact recorded
			}
			progress = watchProgress(nc, *rollout, w)
			defer progress.stop()
		}
		if clients[r], err = client.New(nc); err != nil {
			return err
		}
	}
	results := map[string]*schema.Result{}
	errs := map[string]error{}
	sent := map[string]bool{} // roles whose arrival may have reached planact
	var mu sync.Mutex
	var wg sync.WaitGroup
	// A role refused ends the wait of the other: its partner never comes,
	// and it waited for it until the barrier's time-out (half an hour).
	wctx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	refused := ""
	for r, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Arrive(wctx, arrivals[r])
			mu.Lock()
			sent[r] = err == nil || wctx.Err() != nil // an interrupted publish may have been stored
			mu.Unlock()
			var res *schema.Result
			if err == nil {
				res, err = c.Result(wctx, *rollout, r)
			}
			mu.Lock()
			results[r], errs[r] = res, err
			if errors.Is(err, client.ErrRejected) && refused == "" {
				refused = r
				stopWaiting()
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if refused != "" && ctx.Err() == nil {
		for r := range clients {
			if r == refused || results[r] != nil {
				continue
			}
			errs[r] = cancelPartnerless(ctx, *rollout, r, refused, clients[r], sent[r], progress.known)
		}
	}
	// What answers this submit's arrivals: not the result of a rollout of
	// the number that ended before them, which Result returns with its
	// refusal (shown as this submit's, it said "ok — N samples").
	shown := map[string]*schema.Result{}
	for r, res := range results {
		if res != nil && (res.Rejected || !errors.Is(errs[r], client.ErrRejected)) {
			shown[r] = res
		}
	}
	if ctx.Err() == nil {
		// planact says "finished" after the results: the results say it first.
		for _, r := range []string{schema.RolePlanner, schema.RoleActor} {
			if res := shown[r]; res != nil && !res.Rejected {
				progress.finish(res.Status)
				break
			}
		}
	}
	if ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled) {
		progress.stop()
		cancelInterrupted(*rollout, clients, sent, results, progress.known, stderr)
		return errInterrupted
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(shown); err != nil {
			return err
		}
	}
	var first error
	if refused != "" {
		// What the other role's end comes from, then that end.
		first = fmt.Errorf("%s: %w", refused, errs[refused])
		for _, r := range []string{schema.RolePlanner, schema.RoleActor} {
			if r != refused && roles[r] && results[r] == nil && errs[r] != nil {
				first = errors.Join(first, fmt.Errorf("%s: %w", r, errs[r]))
			}
		}
	}
	for _, r := range []string{schema.RolePlanner, schema.RoleActor} {
		if !roles[r] {
			continue
		}
		if errs[r] != nil && first == nil {
			first = fmt.Errorf("%s: %w", r, errs[r])
		}
		if res := shown[r]; res != nil && !*asJSON {
			st := res.Stats
			reason := ""
			if res.Reason != "" {
				reason = " (" + res.Reason + ")"
			}
			fmt.Fprintf(stdout, "%s: %s%s — %d samples; %d episodes (%s), accuracy %.2f, mean reward %.3f, %.2f turns, %.2f acts per episode; failures: %s\n",
				r, res.Status, reason, len(res.Samples), st.Episodes, counts(st.EpisodeStatus), st.Accuracy, st.MeanReward, st.MeanTurns, st.ActsPerEpisode, counts(st.Failures))
		}
	}
	return first
}

// readTasks reads JSON Lines of tasks; a missing index takes the line number.
func readTasks(path string, stdin io.Reader) ([]schema.Task, error) {
	in := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		in = f
	}
	var tasks []schema.Task
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		t := schema.Task{Index: len(tasks), GroupIndex: len(tasks)}
		if err := decodeOne(sc.Bytes(), &t); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		if t.Prompt == "" {
			return nil, fmt.Errorf("%s:%d: task has no prompt", path, line)
		}
		tasks = append(tasks, t)
	}
	return tasks, sc.Err()
}

// decodeOne reads data, one JSON value, into v: a field v does not have
// (a misspelt "lable", "max_turn") is a mistake, not a default, and so is
// anything after the value (a second task on one line, a second config),
// which would be dropped without a word.
func decodeOne(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	end := dec.InputOffset()
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("more after the JSON value that ends at byte %d: want one value", end)
	}
	return nil
}

// planactThere checks at once that the server has planact's streams (a
// direct read of role's result subject, which a trainer may do): against a
// NATS without planact the arrival would wait for its whole time-out.
func planactThere(ctx context.Context, nc *nats.Conn, n int64, role string) error {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := nc.RequestWithContext(rctx, "$JS.API.DIRECT.GET."+bus.StreamRollout+"."+subject.Result(n, role), nil)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("no planact here: the server has no %s stream with direct reads (start planact: planact up, or planact serve …)", bus.StreamRollout)
	case err != nil:
		return fmt.Errorf("is planact there? %w", err)
	}
	return nil
}

// isTerminal says whether w is a terminal (progress is redrawn in place
// there, printed as plain lines elsewhere).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isatty.IsTerminal(f.Fd())
}

// progressWatch follows a rollout's status events for submit.
type progressWatch struct {
	mu    sync.Mutex
	p     *submitProgress
	w     io.Writer
	tty   bool
	shown bool
	done  bool
	// known is closed once planact has recorded the rollout (a role
	// arrived, it started or ended): a cancel sent from then on finds it.
	known     chan struct{}
	knownOnce sync.Once
}

// watchProgress shows the rollout's progress as the session-store reports
// it (episodes ended of all, acts): one line kept up to date on a
// terminal, a plain line per change otherwise. What it shows only moves
// forward (see submitProgress). stop ends it.
func watchProgress(nc *nats.Conn, n int64, w io.Writer) *progressWatch {
	pw := &progressWatch{p: &submitProgress{rollout: n}, w: w, tty: isTerminal(w), known: make(chan struct{})}
	pw.show(pw.p.line())
	_, err := nc.Subscribe(subject.Status(n), func(m *nats.Msg) {
		var st schema.Status
		if schema.Unmarshal(m.Data, &st) != nil {
			return
		}
		switch {
		case st.Event == "arrived", st.Event == "started", st.Event == "finished", st.Episodes > 0:
			pw.knownOnce.Do(func() { close(pw.known) })
		}
		pw.mu.Lock()
		defer pw.mu.Unlock()
		if !pw.done {
			pw.show(pw.p.apply(st))
		}
	})
	if err == nil {
		// The subscription is in place before the arrivals go out (on
		// other connections), so that "started" is not missed.
		_ = nc.Flush()
	}
	return pw
}

func (pw *progressWatch) show(line string) {
	if line == "" {
		return
	}
	pw.shown = true
	if pw.tty {
		fmt.Fprintf(pw.w, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(pw.w, line)
	}
}

// finish shows the rollout finished with status, as its result says,
// unless planact's own "finished" came first.
func (pw *progressWatch) finish(status string) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if !pw.done {
		pw.show(pw.p.apply(schema.Status{Event: "finished", Detail: status}))
	}
}

// stop ends what pw shows (its events are still followed, for known); a
// line kept up to date on a terminal is ended. It may be called twice.
func (pw *progressWatch) stop() {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if !pw.done && pw.tty && pw.shown {
		fmt.Fprintln(pw.w)
	}
	pw.done = true
}

// cancelPartnerless cancels role's arrival at rollout n, whose partner
// (the role refused) planact refused: nothing else ends its wait at the
// barrier. It returns what becomes of role.
func cancelPartnerless(ctx context.Context, n int64, role, refused string, c *client.Client, sent bool, known <-chan struct{}) error {
	why := fmt.Errorf("not played: the %s's arrival was refused", refused)
	if !sent {
		return why
	}
	ctx, cancel := context.WithTimeout(ctx, cancelPatience)
	defer cancel()
	// A cancel that planact handled before the arrival it follows would
	// find no rollout to abort.
	select {
	case <-known:
	case <-ctx.Done():
	}
	switch err := c.Cancel(ctx, n, role, "planact submit: the "+refused+"'s arrival was refused"); {
	case err == nil:
		return fmt.Errorf("%w; its arrival is cancelled", why)
	case errors.Is(err, client.ErrNothingToCancel):
		return fmt.Errorf("%w; %v", why, err)
	default:
		return fmt.Errorf("%w; cancelling its arrival: %v (its barrier time-out will end it)", why, err)
	}
}

// cancelPatience bounds what an interrupted submit does before it exits:
// waiting for planact to record its arrival, then for the cancel's answer.
const cancelPatience = 10 * time.Second

// cancelInterrupted cancels rollout n, which submit was interrupted while
// it waited for, so that no arrival of its stays at the barrier and no
// rollout runs on for nobody; it says on w what it did and what came of
// it. Roles whose result came already have nothing left to cancel.
func cancelInterrupted(n int64, clients map[string]*client.Client, sent map[string]bool, results map[string]*schema.Result, known <-chan struct{}, w io.Writer) {
	role := ""
	for _, r := range []string{schema.RolePlanner, schema.RoleActor} {
		if sent[r] && results[r] == nil {
			role = r
			break
		}
	}
	if role == "" {
		fmt.Fprintf(w, "rollout %d: interrupted; nothing of it waits (no arrival sent, or every result came)\n", n)
		return
	}
	fmt.Fprintf(w, "rollout %d: interrupted — cancelling it as the %s (both roles get an aborted result)\n", n, role)
	ctx, cancel := context.WithTimeout(context.Background(), cancelPatience)
	defer cancel()
	// A cancel that planact handled before the arrival it follows would
	// find no rollout to abort.
	select {
	case <-known:
	case <-ctx.Done():
	}
	c := clients[role]
	// Most of Cancel's errors come after the cancel was sent: say what
	// planact answered, not that nothing was sent.
	switch err := c.Cancel(ctx, n, role, "planact submit was interrupted"); {
	case errors.Is(err, client.ErrNothingToCancel):
		fmt.Fprintf(w, "rollout %d: %v\n", n, err)
		return
	case err != nil:
		fmt.Fprintf(w, "rollout %d: %v; its barrier or rollout time-out will end it\n", n, err)
		return
	}
	res, err := c.Result(ctx, n, role)
	switch {
	case res != nil && res.Status == schema.ResultAborted:
		fmt.Fprintf(w, "rollout %d: cancelled: %s\n", n, res.Reason)
	case res != nil:
		fmt.Fprintf(w, "rollout %d: it ended before the cancel: %s %s\n", n, res.Status, res.Reason)
	default:
		fmt.Fprintf(w, "rollout %d: cancel sent, no answer within %s (%v); its barrier or rollout time-out will end it\n", n, cancelPatience, err)
	}
}
