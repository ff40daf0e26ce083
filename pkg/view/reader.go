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
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
)

// ErrNotFound says that the view knows no such rollout or episode.
var ErrNotFound = errors.New("not found")

// followed are what the view reads, by stream: one subject filter each
// (read in stream order), and the subjects under it the view skips (live
// chunks of plans, statuses, groups, cancels, pauses; time-outs are in a
// stream it does not read).
var followed = func() map[string]follow {
	m := map[string]follow{
		bus.StreamRollout: {filter: "rollout.>", skip: []string{"rollout.*.status", "rollout.*.result.*.group.*", "rollout.*.result.*.cancel.*", "rollout.*.arrive", "rollout.*.cancel"}},
		bus.StreamPlan:    {filter: "plan.>", skip: []string{"plan.*.partial.*"}},
		bus.StreamAct:     {filter: "act.*.done.>"},
	}
	for _, role := range bus.Roles {
		m[bus.StreamTrainer(role)] = follow{filter: subject.ArriveOf(role)}
	}
	return m
}()

type follow struct {
	filter string
	skip   []string
}

// PollEvery is how often the view reads what is new when nothing was.
var PollEvery = 200 * time.Millisecond

// Reader follows planact's streams and the runs bucket and answers
// questions about rollouts from what it has read. It reads with direct
// gets, in batches, from the first message on: it creates no consumer, so
// its user needs no right to create one (a right that would let it create
// any consumer, durable or pushing to any subject, on the streams it reads).
// It is safe for concurrent use.
type Reader struct {
	mu    sync.Mutex
	st    state
	seqs  map[string]uint64 // last stream sequence read, by stream
	until map[string]uint64 // what each stream held when the Reader opened
	runs  bool              // the runs bucket's values at open are read

	subs map[chan struct{}]bool

	nc *nats.Conn
	// What was read again of compacted rollouts: episodes, episode lists,
	// task lists.
	reloaded  *cache[*Episode]
	lists     *cache[[]EpisodeSummary]
	taskLists *cache[[]schema.Task]

	stop []func()
	now  func() time.Time
}

// Options tune a Reader.
type Options struct {
	// KeepFull is how many finished rollouts keep their episodes' texts
	// in memory (0: DefaultKeepFull); older ones are read again from the
	// streams when an episode of theirs is asked for.
	KeepFull int
	// MaxRollouts is how many rollouts the view keeps at most (0:
	// DefaultMaxRollouts); beyond it the oldest finished ones are let go
	// of first. Rollouts the streams no longer hold are let go of anyway.
	MaxRollouts int

	// patience bounds one of Open's requests (0: the bus's own time-out of
	// a request); a test shortens it to wait out a silent server quickly.
	patience time.Duration
	// unanswered, if set, is told of each of Open's requests that went
	// unanswered within its time-out and is asked again (tests).
	unanswered func(error)
	// fetchTasks, if set, reads a task list from the object store in
	// place of loadTasks (tests: a slow object store).
	fetchTasks func(ctx context.Context, role, object, sha string) ([]schema.Task, error)
}

// Open starts reading planact's history and live traffic over nc, from the
// first message the streams hold. The streams and the runs bucket must
// exist (planact has been provisioned on the server). Close stops the
// reading. What the reading has to say (a stream made anew, read again
// from its start) goes to ctx's logger (zerolog.Ctx).
func Open(ctx context.Context, nc *nats.Conn) (*Reader, error) {
	return OpenWith(ctx, nc, Options{})
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, nc *nats.Conn, o Options) (*Reader, error) {
	if o.KeepFull < 0 {
		return nil, fmt.Errorf("view: KeepFull %d: want 0 (the default, %d) or more", o.KeepFull, DefaultKeepFull)
	}
	if o.MaxRollouts < 0 {
		return nil, fmt.Errorf("view: MaxRollouts %d: want 0 (the default, %d) or more", o.MaxRollouts, DefaultMaxRollouts)
	}
	if o.KeepFull == 0 {
		o.KeepFull = DefaultKeepFull
	}
	if o.MaxRollouts == 0 {
		o.MaxRollouts = DefaultMaxRollouts
	}
	r := &Reader{
		st: state{rollouts: map[int64]*rolloutState{}, keepFull: o.KeepFull, maxRollouts: o.MaxRollouts,
			marks: map[string]time.Time{}, gone: map[int64]time.Time{}},
		seqs:      map[string]uint64{},
		until:     map[string]uint64{},
		subs:      map[chan struct{}]bool{},
		nc:        nc,
		reloaded:  newCache[*Episode](64),
		lists:     newCache[[]EpisodeSummary](8),
		taskLists: newCache[[]schema.Task](8),
		now:       time.Now,
	}
	r.st.now = func() time.Time { return r.now() }
	fetch := o.fetchTasks
	if fetch == nil {
		fetch = func(ctx context.Context, role, object, sha string) ([]schema.Task, error) {
			return loadTasks(ctx, nc, role, object, sha)
		}
	}
	r.st.loadTasks = func(ctx context.Context, role, object, sha string) []schema.Task {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		tasks, _ := fetch(ctx, role, object, sha)
		return tasks
	}
	// What "read up to now" means: the last message each stream holds on
	// what the view reads.
	for name, f := range followed {
		var last uint64
		err := o.untilAnswered(ctx, func(ctx context.Context) (err error) {
			last, err = bus.LastSeq(ctx, nc, name, f.filter)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("view: stream %s: %w", name, hint(err))
		}
		r.until[name] = last
		r.st.marks[name] = time.Time{} // nothing read of it yet
	}
	var runsLast uint64
	err := o.untilAnswered(ctx, func(ctx context.Context) (err error) {
		runsLast, err = bus.LastSeq(ctx, nc, "KV_"+bus.BucketRuns, "$KV."+bus.BucketRuns+".>")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("view: KV bucket %s: %w", bus.BucketRuns, hint(err))
	}
	// Rollouts older than the streams' history are let go of: the view
	// learns how long that is as watch does.
	err = o.untilAnswered(ctx, func(ctx context.Context) (err error) {
		r.st.maxAge, err = historyKept(ctx, nc)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("view: stream %s: how long the history is kept: %w", bus.StreamRollout, hint(err))
	}
	// The follows outlive ctx, and log to its logger (a stream made anew).
	fctx, cancel := context.WithCancel(zerolog.Ctx(ctx).WithContext(context.Background()))
	var wg sync.WaitGroup
	r.stop = append(r.stop, func() { cancel(); wg.Wait() })
	for name, f := range followed {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = bus.Follow(fctx, nc, name, f.filter, 1, PollEvery, func(m bus.StoredMsg) {
				changed := false
				r.mu.Lock()
				r.st.mark(name, m.Time)
				if !skipped(m.Subject, f.skip) {
					_, changed = r.st.apply(m)
				}
				// Read once its task lists are, which are read without
				// the lock: Synced means they show.
				fetches := r.st.takeFetches()
				if len(fetches) > 0 {
					r.mu.Unlock()
					r.fetch(fctx, fetches)
					changed = true
					r.mu.Lock()
				}
				r.seqs[name] = m.Seq
				r.mu.Unlock()
				if changed {
					r.notify()
				}
			}, func() {
				// Read to its end: what it holds was stored before now.
				r.mu.Lock()
				r.st.mark(name, r.now())
				r.st.maintain()
				r.mu.Unlock()
			})
		}()
	}
	// Run states are removed when their rollout ends, so the last one
	// there at open may be gone before it is read: the bucket is read once
	// the reader has read it to its end, or past what was last at open.
	runsRead := func() {
		r.mu.Lock()
		r.runs = true
		r.mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = bus.Follow(fctx, nc, "KV_"+bus.BucketRuns, "$KV."+bus.BucketRuns+".>", 1, PollEvery, func(m bus.StoredMsg) {
			r.applyRun(m)
			if m.Seq >= runsLast {
				runsRead()
			}
		}, runsRead)
	}()
	return r, nil
}

// fetch reads the task lists fs from the object store without the lock,
// one after the other, so that the stream that asked for them is read on
// in order, and hands each to the state under the lock.
func (r *Reader) fetch(ctx context.Context, fs []fetch) {
	for _, f := range fs {
		tasks := r.st.loadTasks(ctx, f.a.role, f.a.object, f.a.sha)
		r.mu.Lock()
		r.st.fetched(f, tasks)
		r.mu.Unlock()
	}
}

// skipped says whether subj matches one of the filters.
func skipped(subj string, filters []string) bool {
	for _, f := range filters {
		if subject.Matches(f, subj) {
			return true
		}
	}
	return false
}

// applyRun folds one message of the runs bucket: which acts are released
// and not done. The bucket holds the latest value of each key, or a marker
// that it is gone.
func (r *Reader) applyRun(m bus.StoredMsg) {
	key := strings.TrimPrefix(m.Subject, "$KV."+bus.BucketRuns+".")
	n, ep, turn, ok := parseRunKey(key)
	if !ok {
		return
	}
	var run *schema.Run
	if !bus.KVDeleted(m.Header) && len(m.Data) > 0 {
		run = new(schema.Run)
		if schema.Unmarshal(m.Data, run) != nil {
			return
		}
	}
	r.mu.Lock()
	r.st.applyRun(n, ep, turn, run, m.Time)
	r.mu.Unlock()
	r.notify()
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

// loadTasks reads the task list an arrival of role names in the role's
// object store, checked against the SHA-256 the arrival named; nil when it
// is gone (the rollout's results were cleaned up) or does not match: its
// episodes then have no question, label or reward in the view.
func loadTasks(ctx context.Context, nc *nats.Conn, role, object, sha string) ([]schema.Task, error) {
	return session.ReadTaskList(ctx, nc, schema.TaskList{Object: object, From: role, Digest: schema.DigestSHA256 + sha})
}

// untilAnswered asks again while the server does not answer ask within
// one request's time-out (a loaded cluster), until ctx ends: the caller's
// deadline (inspect's --timeout), not one request's, bounds Open's wait.
// Open gave up after one unanswered request once (a flake hunt: inspect
// failed with 25 s of its 30 left). Any other answer, an error too (no
// responders: no such stream), is returned at once.
func (o Options) untilAnswered(ctx context.Context, ask func(context.Context) error) error {
	for {
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if o.patience > 0 {
			rctx, cancel = context.WithTimeout(ctx, o.patience)
		}
		err := ask(rctx)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) {
			return err
		}
		if o.unanswered != nil {
			o.unanswered(err)
		}
	}
}

// historyKept is how long the streams keep planact's history (the ROLLOUT
// stream's max age; 0: for ever).
func historyKept(ctx context.Context, nc *nats.Conn) (time.Duration, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	// (STREAM.INFO of ROLLOUT: the viewer may read it.)
	s, err := js.Stream(ctx, bus.StreamRollout)
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().Config.MaxAge, nil
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
		done := r.historyRead()
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

// historyRead says whether the Reader has read everything the streams and
// the runs bucket held when it opened. Its lock is held.
func (r *Reader) historyRead() bool {
	done := r.runs
	for name, last := range r.until {
		done = done && r.seqs[name] >= last
	}
	return done
}

// unknown answers a question about what the view does not know (what: a
// rollout or an episode of one): once the view has read the history the
// streams held when it opened (read), it is not found; until then, it may
// be one not read yet (a web view just started, and a page in a browser
// that connects to it again), so unknown waits for that history to be
// read and asks again (ask).
func (r *Reader) unknown(ctx context.Context, read bool, what string, ask func() error) error {
	if read {
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	if err := r.Synced(ctx); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return ask()
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
	r.st.prune() // those the streams no longer hold, even when nothing new comes
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

// Rollout returns rollout n with the episodes that pass f. The episodes of
// a rollout whose episodes were dropped from memory (see DefaultKeepFull)
// are read again from the streams, for at most 30 seconds; RolloutContext
// takes a context instead.
func (r *Reader) Rollout(n int64, f Filter) (*Rollout, error) {
	ctx, cancel := context.WithTimeout(context.Background(), readAgainTimeout)
	defer cancel()
	return r.RolloutContext(ctx, n, f)
}

// RolloutContext is Rollout, reading what it reads again until ctx ends.
// Until the view has read the history the streams held when it opened, a
// rollout it does not know is waited for (until ctx ends), not not found.
func (r *Reader) RolloutContext(ctx context.Context, n int64, f Filter) (*Rollout, error) {
	r.mu.Lock()
	ro := r.st.rollouts[n]
	if ro == nil {
		read := r.historyRead()
		r.mu.Unlock()
		var out *Rollout
		err := r.unknown(ctx, read, fmt.Sprintf("rollout %d", n), func() (err error) {
			out, err = r.RolloutContext(ctx, n, f)
			return err
		})
		return out, err
	}
	now := r.now()
	out := &Rollout{RolloutSummary: ro.summary(now), Filter: f}
	if ro.config != nil {
		cfg := ro.config.WithDefaults()
		out.PlanFormat, out.MaxTurns, out.Reward = cfg.PlanFormat, cfg.MaxTurns, cfg.Reward
	}
	if !ro.compacted {
		defer r.mu.Unlock()
		out.EpisodeList = f.apply(ro.episodeSummaries(now))
		return out, nil
	}
	head := ro.head()
	r.mu.Unlock()

	key := cacheKey{n: n, e: -1, rev: head.rev}
	list, ok := r.lists.get(key)
	if !ok {
		full, err := r.reload(ctx, head, listMessages(n))
		if err != nil {
			return nil, err
		}
		list = full.episodeSummaries(now)
		r.lists.put(key, list)
	}
	out.EpisodeList = f.apply(list)
	return out, nil
}

// Episode returns episode e of rollout n in full. An episode of a rollout
// whose episodes were dropped from memory (see DefaultKeepFull) is read
// again from the streams, for at most 30 seconds, and remembered: a
// finished rollout does not change. EpisodeContext takes a context
// instead.
func (r *Reader) Episode(n int64, e int) (*Episode, error) {
	ctx, cancel := context.WithTimeout(context.Background(), readAgainTimeout)
	defer cancel()
	return r.EpisodeContext(ctx, n, e)
}

// EpisodeContext is Episode, reading what it reads again until ctx ends
// (a command's deadline, an interrupt, an HTTP request that went away).
// Until the view has read the history the streams held when it opened, an
// episode it does not know is waited for (until ctx ends), not not found.
func (r *Reader) EpisodeContext(ctx context.Context, n int64, e int) (*Episode, error) {
	r.mu.Lock()
	ro := r.st.rollouts[n]
	var unknown string
	switch {
	case ro == nil:
		unknown = fmt.Sprintf("rollout %d", n)
	case ro.episodes[e] == nil && (e < 0 || e >= ro.episodeCount()):
		unknown = fmt.Sprintf("rollout %d episode %d", n, e)
	}
	if unknown != "" {
		read := r.historyRead()
		r.mu.Unlock()
		var out *Episode
		err := r.unknown(ctx, read || e < 0, unknown, func() (err error) {
			out, err = r.EpisodeContext(ctx, n, e)
			return err
		})
		return out, err
	}
	ep := ro.episodes[e]
	if ep == nil {
		ep = &episodeState{e: e}
	}
	if !ro.compacted {
		defer r.mu.Unlock()
		return ro.fullEpisode(ep, r.now()), nil
	}
	head := ro.head()
	now := r.now()
	r.mu.Unlock()

	key := cacheKey{n: n, e: e, rev: head.rev}
	if out, ok := r.reloaded.get(key); ok {
		return out, nil
	}
	full, err := r.reload(ctx, head, episodeMessages(n, e))
	if err != nil {
		return nil, fmt.Errorf("%w (episode %d)", err, e)
	}
	out := full.fullEpisode(full.episode(e), now)
	r.reloaded.put(key, out)
	return out, nil
}

// hint adds to a failed first read what to check: a stream missing asks
// for provisioning; a read not answered before the caller's deadline, for
// more time.
func hint(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w (not answered before the deadline: a loaded server, or raise --timeout)", err)
	}
	return fmt.Errorf("%w (has planact been provisioned here: planact provision, or planact up?)", err)
}
