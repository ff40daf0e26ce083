package view

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// ErrNotFound says that the view knows no such rollout or episode.
var ErrNotFound = errors.New("not found")

// followed are the subjects the view reads, by stream: every fact of a
// rollout except the live chunks of plans, time-out schedules and groups.
var followed = map[string][]string{
	bus.StreamRollout: {"rollout.*.arrive.*", "rollout.*.start", "rollout.*.end.*", "rollout.*.result.*", "rollout.*.result.*.rejected"},
	bus.StreamPlan:    {"plan.*.req.*", "plan.*.out.*", "plan.*.dag.*", "plan.*.answer.*", "plan.*.error.*"},
	bus.StreamAct:     {"act.*.done.>"},
}

// Reader follows planact's streams and the runs bucket with ordered
// consumers (ephemeral: the server removes them when the Reader closes or
// goes away) and answers questions about rollouts from what it has read.
// It is safe for concurrent use.
type Reader struct {
	mu    sync.Mutex
	st    state
	seqs  map[string]uint64 // last stream sequence read, by stream
	until map[string]uint64 // what each stream held when the Reader opened
	runs  bool              // the runs bucket's initial values are read

	subs map[chan struct{}]bool

	js       jetstream.JetStream
	reloaded *episodeCache // episodes of compacted rollouts, read again

	stop []func()
	now  func() time.Time
}

// Options tune a Reader.
type Options struct {
	// KeepFull is how many finished rollouts keep their episodes' texts
	// in memory (0: DefaultKeepFull); older ones are read again from the
	// streams when an episode of theirs is asked for.
	KeepFull int
}

// Open starts reading planact's history and live traffic over nc, from the
// first message the streams hold. The streams and the runs bucket must
// exist (planact has run on the server once). Close stops the reading.
func Open(ctx context.Context, nc *nats.Conn) (*Reader, error) {
	return OpenWith(ctx, nc, Options{})
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, nc *nats.Conn, o Options) (*Reader, error) {
	if o.KeepFull < 0 {
		return nil, fmt.Errorf("view: KeepFull %d: want 0 (the default, %d) or more", o.KeepFull, DefaultKeepFull)
	}
	if o.KeepFull == 0 {
		o.KeepFull = DefaultKeepFull
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("view: jetstream: %w", err)
	}
	r := &Reader{
		st:       state{rollouts: map[int64]*rolloutState{}, keepFull: o.KeepFull},
		seqs:     map[string]uint64{},
		until:    map[string]uint64{},
		subs:     map[chan struct{}]bool{},
		js:       js,
		reloaded: newEpisodeCache(64),
		now:      time.Now,
	}
	if tasks, err := js.ObjectStore(ctx, bus.ObjectTasks); err == nil {
		r.st.loadTasks = func(object string) []schema.Task { return loadTasks(tasks, object) }
	}
	for _, name := range []string{bus.StreamRollout, bus.StreamPlan, bus.StreamAct} {
		if err := r.follow(ctx, js, name); err != nil {
			r.Close()
			return nil, err
		}
	}
	if err := r.watchRuns(ctx, js); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// follow reads stream name from its first message, for ever.
func (r *Reader) follow(ctx context.Context, js jetstream.JetStream, name string) error {
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("view: stream %s does not exist on this server: has planact run here (planact up, or planact serve)?", name)
	}
	if err != nil {
		return fmt.Errorf("view: stream %s: %w", name, err)
	}
	// What "read up to now" means: the last message the stream holds on
	// the subjects the view reads (others it never sees).
	var last uint64
	for _, subj := range followed[name] {
		m, err := s.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("view: stream %s: %w", name, err)
		}
		last = max(last, m.Sequence)
	}
	r.mu.Lock()
	r.until[name] = last
	r.mu.Unlock()
	// The server removes the consumer InactiveThreshold after this process
	// goes away without closing the Reader; Close removes it at once.
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: followed[name], InactiveThreshold: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("view: follow %s: %w", name, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			return
		}
		r.mu.Lock()
		_, changed := r.st.apply(m.Subject(), m.Data(), md.Timestamp)
		r.seqs[name] = md.Sequence.Stream
		r.mu.Unlock()
		if changed {
			r.notify()
		}
	})
	if err != nil {
		return fmt.Errorf("view: follow %s: %w", name, err)
	}
	r.stop = append(r.stop, func() {
		cc.Stop()
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = s.DeleteConsumer(dctx, info.Name) // gone already is as good
		}
	})
	return nil
}

// watchRuns follows the runs bucket: which acts are released and not done.
func (r *Reader) watchRuns(ctx context.Context, js jetstream.JetStream) error {
	kv, err := js.KeyValue(ctx, bus.BucketRuns)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("view: KV bucket %s does not exist on this server: has planact run here (planact up, or planact serve)?", bus.BucketRuns)
	}
	if err != nil {
		return fmt.Errorf("view: KV bucket %s: %w", bus.BucketRuns, err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	w, err := kv.WatchAll(wctx)
	if err != nil {
		cancel()
		return fmt.Errorf("view: watch %s: %w", bus.BucketRuns, err)
	}
	done := make(chan struct{})
	r.stop = append(r.stop, func() { _ = w.Stop(); cancel(); <-done })
	go func() {
		defer close(done)
		for e := range w.Updates() {
			if e == nil { // the initial values are all read
				r.mu.Lock()
				r.runs = true
				r.mu.Unlock()
				continue
			}
			n, ep, turn, ok := parseRunKey(e.Key())
			if !ok {
				continue
			}
			var run *schema.Run
			if e.Operation() == jetstream.KeyValuePut {
				run = new(schema.Run)
				if schema.Unmarshal(e.Value(), run) != nil {
					continue
				}
			}
			r.mu.Lock()
			r.st.applyRun(n, ep, turn, run, e.Created())
			r.mu.Unlock()
			r.notify()
		}
	}()
	return nil
}

// parseRunKey reads a runs key "<N>.<E>.<turn>".
func parseRunKey(key string) (n int64, e, turn int, ok bool) {
	parts := strings.Split(key, ".")
	if len(parts) != 3 {
		return 0, 0, 0, false
	}
	n, err1 := strconv.ParseInt(parts[0], 10, 64)
	e, err2 := strconv.Atoi(parts[1])
	turn, err3 := strconv.Atoi(parts[2])
	return n, e, turn, err1 == nil && err2 == nil && err3 == nil
}

// loadTasks reads a task list kept in the object store; nil when it is
// gone (the rollout's results were cleaned up): its episodes then have no
// question, label or reward in the view.
func loadTasks(store jetstream.ObjectStore, object string) []schema.Task {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	data, err := store.GetBytes(ctx, object)
	if err != nil {
		return nil
	}
	var tl schema.TaskList
	if schema.Unmarshal(data, &tl) != nil {
		return nil
	}
	return tl.Tasks
}

// Close stops reading; the view keeps what it has read.
func (r *Reader) Close() {
	for _, stop := range r.stop {
		stop()
	}
	r.stop = nil
}

// Synced waits until the Reader has read everything the streams and the
// runs bucket held when it opened.
func (r *Reader) Synced(ctx context.Context) error {
	for {
		r.mu.Lock()
		done := r.runs
		for name, last := range r.until {
			done = done && r.seqs[name] >= last
		}
		r.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("view: history not read yet: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Subscribe returns a channel that receives a signal after the view
// changed (signals coalesce: one may stand for many changes), and a
// function that ends the subscription.
func (r *Reader) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	r.mu.Lock()
	r.subs[ch] = true
	r.mu.Unlock()
	return ch, func() {
		r.mu.Lock()
		delete(r.subs, ch)
		r.mu.Unlock()
	}
}

func (r *Reader) notify() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ch := range r.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Rollouts lists the rollouts, newest (highest id) first.
func (r *Reader) Rollouts() []RolloutSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	out := make([]RolloutSummary, 0, len(r.st.rollouts))
	for _, ro := range r.st.rollouts {
		if len(ro.arrivals) == 0 && ro.start == nil && len(ro.rejected) == 0 {
			continue // only traces of a rollout whose arrivals are gone
		}
		out = append(out, ro.summary(now))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rollout > out[j].Rollout })
	return out
}

// Rollout returns rollout n with the episodes that pass f.
func (r *Reader) Rollout(n int64, f Filter) (*Rollout, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ro := r.st.rollouts[n]
	if ro == nil {
		return nil, fmt.Errorf("rollout %d: %w", n, ErrNotFound)
	}
	now := r.now()
	out := &Rollout{RolloutSummary: ro.summary(now), Filter: f}
	if ro.config != nil {
		cfg := ro.config.WithDefaults()
		out.PlanFormat, out.MaxTurns, out.Reward = cfg.PlanFormat, cfg.MaxTurns, cfg.Reward
	}
	out.EpisodeList = f.apply(ro.episodeSummaries(now))
	return out, nil
}

// Episode returns episode e of rollout n in full. An episode of a rollout
// whose texts were dropped from memory (see DefaultKeepFull) is read again
// from the streams, and remembered: a finished rollout does not change.
func (r *Reader) Episode(n int64, e int) (*Episode, error) {
	r.mu.Lock()
	ro := r.st.rollouts[n]
	if ro == nil {
		r.mu.Unlock()
		return nil, fmt.Errorf("rollout %d: %w", n, ErrNotFound)
	}
	ep := ro.episodes[e]
	if ep == nil {
		if ro.start == nil || e < 0 || e >= ro.start.Episodes {
			r.mu.Unlock()
			return nil, fmt.Errorf("rollout %d episode %d: %w", n, e, ErrNotFound)
		}
		ep = &episodeState{e: e}
	}
	if !ro.compacted {
		defer r.mu.Unlock()
		return ro.fullEpisode(ep, r.now()), nil
	}
	head := *ro // what the reload needs of the rollout, copied under the lock
	now := r.now()
	r.mu.Unlock()

	key := epKey{n, e}
	if out, ok := r.reloaded.get(key); ok {
		return out, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	full, err := r.reload(ctx, &head, e)
	if err != nil {
		return nil, err
	}
	out := full.fullEpisode(full.episode(e), now)
	r.reloaded.put(key, out)
	return out, nil
}
