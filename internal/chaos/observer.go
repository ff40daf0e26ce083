package chaos

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// Observer reads what the services publish, independently of them and of
// the trainers: every act outcome (the last one of each act decides whether
// it was executed), every planner output, episode end and result, each
// with the time JetStream stored it. It reads with ordered consumers, which
// recreate themselves after a node or the whole cluster restarts and
// resume after the last message they delivered.
type Observer struct {
	js jetstream.JetStream

	mu       sync.Mutex
	acts     map[string]ActOutcome         // act.N.done.E.K -> its last outcome
	events   map[int64][]Event             // rollout -> progress events
	results  map[int64]map[string][]Event  // rollout -> role -> result messages
	handled  map[string]uint64             // stream -> last stream sequence handled
	consumer map[string]jetstream.Consumer // stream -> its ordered consumer
	keep     bool                          // keep events (for recovery times)
	last     time.Time                     // stored time of the newest event
	errs     []string
	unread   []string // messages that could not be read: the ledger misses them
	stops    []jetstream.ConsumeContext
}

// ActOutcome is the last outcome published for one act.
type ActOutcome struct {
	Rollout    int64
	Episode    int
	Turn       int
	Node       string
	Key        string // the node's key, as its subject and engine.ActGeneration name it
	Status     string
	Generation bool // the actor model ran: it yields an actor sample when Status is done
	Attempts   int
	Retries    int // generations sent again beyond the attempts, each recorded with why
}

// Executed reports whether the act yields an actor sample.
func (a ActOutcome) Executed() bool { return a.Status == schema.ActDoneOK && a.Generation }

// Event is one message that shows a rollout moving.
type Event struct {
	At      time.Time // when JetStream stored it
	Episode int       // -1 for a result
	What    string    // act, plan, end, result
	Role    string    // whose result (What is result)
}

// NewObserver starts reading. keepEvents keeps every progress event (for
// recovery times); a soak run leaves it off.
func NewObserver(ctx context.Context, js jetstream.JetStream, keepEvents bool) (*Observer, error) {
	o := &Observer{
		js: js, keep: keepEvents,
		acts: map[string]ActOutcome{}, events: map[int64][]Event{}, results: map[int64]map[string][]Event{},
		handled: map[string]uint64{}, consumer: map[string]jetstream.Consumer{},
	}
	for _, c := range []struct {
		stream      string
		filters     []string
		headersOnly bool
	}{
		{bus.StreamAct, []string{subject.AllActDone}, false},
		{bus.StreamPlan, []string{subject.AllPlanOut}, true},
		{bus.StreamRollout, []string{subject.AllEpisodeEnd, "rollout.*.result.*"}, true},
	} {
		var cons jetstream.Consumer
		err := retry(ctx, func(ctx context.Context) error {
			var err error
			cons, err = js.OrderedConsumer(ctx, c.stream, jetstream.OrderedConsumerConfig{
				FilterSubjects: c.filters, HeadersOnly: c.headersOnly, NamePrefix: "planact-chaos",
			})
			return err
		})
		if err != nil {
			o.Stop()
			return nil, fmt.Errorf("observe %s: %w", c.stream, err)
		}
		stream := c.stream
		cc, err := cons.Consume(func(m jetstream.Msg) { o.handle(stream, m) },
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { o.noteErr(stream, err) }))
		if err != nil {
			o.Stop()
			return nil, fmt.Errorf("observe %s: %w", c.stream, err)
		}
		o.mu.Lock()
		o.consumer[stream] = cons
		o.stops = append(o.stops, cc)
		o.mu.Unlock()
	}
	return o, nil
}

// Stop stops reading.
func (o *Observer) Stop() {
	o.mu.Lock()
	stops := o.stops
	o.stops = nil
	o.mu.Unlock()
	for _, cc := range stops {
		cc.Stop()
	}
}

func (o *Observer) noteErr(stream string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.errs) < 100 {
		o.errs = append(o.errs, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), stream, err))
	}
}

// noteUnread records a message the observer could not read.
func (o *Observer) noteUnread(stream string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.unread) < 100 {
		o.unread = append(o.unread, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), stream, err))
	}
}

func (o *Observer) handle(stream string, m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		o.noteUnread(stream, err)
		return
	}
	p, err := subject.Parse(m.Subject())
	if err != nil {
		o.noteUnread(stream, err)
		return
	}
	ev := Event{At: md.Timestamp, Episode: p.Episode}
	var act *ActOutcome
	switch p.Verb {
	case "done":
		var d schema.ActDone
		if err := schema.Unmarshal(m.Data(), &d); err != nil {
			o.noteUnread(stream, fmt.Errorf("%s: %w", m.Subject(), err))
			return
		}
		ev.What = "act"
		act = &ActOutcome{Rollout: d.Rollout, Episode: d.Episode, Turn: d.Turn, Node: d.NodeID, Key: d.Key, Status: d.Status,
			Generation: d.Generation != nil, Attempts: d.Attempts, Retries: len(d.Retries)}
	case "out":
		ev.What = "plan"
	case "end":
		ev.What = "end"
	case "result":
		ev.What, ev.Episode, ev.Role = "result", -1, p.Role
	default:
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.handled[stream] = md.Sequence.Stream
	if ev.At.After(o.last) {
		o.last = ev.At
	}
	if act != nil {
		o.acts[m.Subject()] = *act
	}
	if ev.What == "result" {
		if o.results[p.Rollout] == nil {
			o.results[p.Rollout] = map[string][]Event{}
		}
		o.results[p.Rollout][p.Role] = append(o.results[p.Rollout][p.Role], ev)
	}
	if o.keep {
		o.events[p.Rollout] = append(o.events[p.Rollout], ev)
	}
}

// CaughtUp waits until every consumer has handled everything its stream
// holds now, polling until ctx ends.
func (o *Observer) CaughtUp(ctx context.Context) error {
	for {
		pending, err := o.pending(ctx)
		if err == nil && pending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("observer not caught up (%d pending, %v): %w", pending, err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (o *Observer) pending(ctx context.Context) (uint64, error) {
	o.mu.Lock()
	cons := make(map[string]jetstream.Consumer, len(o.consumer))
	for k, v := range o.consumer {
		cons[k] = v
	}
	o.mu.Unlock()
	var total uint64
	for stream, c := range cons {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := c.Info(ictx)
		cancel()
		if err != nil {
			return 0, err
		}
		o.mu.Lock()
		handled := o.handled[stream]
		o.mu.Unlock()
		total += info.NumPending
		if info.Delivered.Stream > handled {
			total += info.Delivered.Stream - handled
		}
	}
	return total, nil
}

// Executed returns, per rollout, the acts whose last outcome yields an
// actor sample, as "episode/turn/node".
func (o *Observer) Executed() map[int64]map[string]bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[int64]map[string]bool{}
	for _, a := range o.acts {
		if !a.Executed() {
			continue
		}
		if out[a.Rollout] == nil {
			out[a.Rollout] = map[string]bool{}
		}
		out[a.Rollout][ActID(a.Episode, a.Turn, a.Node)] = true
	}
	return out
}

// Outcomes returns, per rollout, the last outcome of each act, by
// episode and node key (ActKey).
func (o *Observer) Outcomes() map[int64]map[string]ActOutcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[int64]map[string]ActOutcome{}
	for _, a := range o.acts {
		if out[a.Rollout] == nil {
			out[a.Rollout] = map[string]ActOutcome{}
		}
		out[a.Rollout][ActKey(a.Episode, a.Key)] = a
	}
	return out
}

// ActKey names one act of a rollout by its episode and node key, as its
// engine calls do.
func ActKey(episode int, key string) string { return fmt.Sprintf("%d/%s", episode, key) }

// ActID names one act of a rollout.
func ActID(episode, turn int, node string) string {
	return fmt.Sprintf("%d/%d/%s", episode, turn, node)
}

// Results returns how many result messages each role of rollout n got.
func (o *Observer) Results(n int64) map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]int{}
	for role, evs := range o.results[n] {
		out[role] = len(evs)
	}
	return out
}

// AllResults returns, per rollout the bus holds results of, how many
// result messages each role got.
func (o *Observer) AllResults() map[int64]map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[int64]map[string]int{}
	for n, roles := range o.results {
		out[n] = map[string]int{}
		for role, evs := range roles {
			out[n][role] = len(evs)
		}
	}
	return out
}

// ResultAt returns when the last of rollout n's two results was stored, and
// whether both were.
func (o *Observer) ResultAt(n int64) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var at time.Time
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		evs := o.results[n][role]
		if len(evs) == 0 {
			return time.Time{}, false
		}
		if evs[0].At.After(at) {
			at = evs[0].At
		}
	}
	return at, true
}

// Events returns rollout n's progress events in stored order.
func (o *Observer) Events(n int64) []Event {
	o.mu.Lock()
	evs := append([]Event(nil), o.events[n]...)
	o.mu.Unlock()
	sort.Slice(evs, func(i, j int) bool { return evs[i].At.Before(evs[j].At) })
	return evs
}

// Last returns the stored time of the newest event seen.
func (o *Observer) Last() time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.last
}

// Unread returns the messages the observer could not read (at most 100):
// what they said is missing from the ledger.
func (o *Observer) Unread() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.unread...)
}

// Errors returns the consumer errors seen (resets after restarts show here).
func (o *Observer) Errors() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.errs...)
}

// retry calls op until it succeeds or ctx ends, each attempt bounded.
func retry(ctx context.Context, op func(ctx context.Context) error) error {
	wait := 100 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := op(actx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}
