package session

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/telemetry"
)

// ErrRolloutOver is the cause of the context of work on a rollout that
// ended (cancelled, timed out, enough groups): the work is abandoned.
var ErrRolloutOver = errors.New("rollout is over")

// ErrPaused is the cause of the context of a generation aborted because its
// role was paused in abort mode: it is sent again after the resume.
var ErrPaused = errors.New("role paused: the generation is sent again after the resume")

// Follower follows the sessions bucket for a service: which rollouts run
// (and cancels the work registered for one that ends), and the state of
// each role (holding the generations of a paused role). A watch that ends
// (a NATS restart) starts again.
type Follower struct {
	bus *bus.Bus
	log zerolog.Logger
	// OnEnd, when set, is called (outside the follower's lock) when a
	// rollout's session becomes final.
	OnEnd func(n int64)

	mu      sync.Mutex
	running map[int64]schema.Session
	// over holds the rollouts whose session is final, as long as the
	// session is in the bucket: work registered for one of them later (a
	// request that was on its way) is cancelled at once.
	over  map[int64]bool
	work  map[int64]map[*int]context.CancelCauseFunc
	gates map[string]*Gate
	// seen is the highest bucket revision the watch delivered: every key
	// a replay leaves out was gone at it.
	seen uint64
}

// NewFollower returns a follower of b's sessions bucket; Run follows it.
func NewFollower(b *bus.Bus, log zerolog.Logger) *Follower {
	return &Follower{bus: b, log: log, running: map[int64]schema.Session{}, over: map[int64]bool{}, work: map[int64]map[*int]context.CancelCauseFunc{}, gates: map[string]*Gate{}}
}

// Run follows the bucket until ctx ends. A session gone while the watch
// was down is forgotten once the watch has replayed what the bucket holds.
func (f *Follower) Run(ctx context.Context) error {
	f.bus.Sessions.Follow(ctx, f.log, f.update, f.keepOnly)
	return nil
}

// keepOnly forgets the rollouts whose session keys are not in keys, and
// opens the gates of the roles whose keys are not: their state went while
// the watch was down, and no update will say so.
func (f *Follower) keepOnly(keys map[string]bool) {
	f.mu.Lock()
	for n := range f.running {
		if !keys[schema.SessionKey(n)] {
			delete(f.running, n)
		}
	}
	for n := range f.over {
		if !keys[schema.SessionKey(n)] {
			delete(f.over, n)
		}
	}
	var gone []*Gate
	for role, g := range f.gates {
		if !keys[schema.RoleKey(role)] {
			gone = append(gone, g)
		}
	}
	rev := f.seen
	f.mu.Unlock()
	for _, g := range gone {
		g.gone(rev)
	}
}

func (f *Follower) update(e jetstream.KeyValueEntry) {
	f.mu.Lock()
	f.seen = max(f.seen, e.Revision())
	f.mu.Unlock()
	key := e.Key()
	if role, ok := strings.CutPrefix(key, "role."); ok {
		if e.Operation() != jetstream.KeyValuePut {
			// Deleted or purged (by hand, or at the bucket's TTL): no
			// pause is in force any more.
			f.Gate(role).gone(e.Revision())
			return
		}
		var st schema.RoleState
		if err := schema.Unmarshal(e.Value(), &st); err != nil {
			f.log.Warn().Err(err).Str("role", role).Uint64("revision", e.Revision()).Msg("the role's state cannot be read; the gate keeps the last it could")
			return
		}
		f.Gate(role).set(st, e.Revision())
		return
	}
	if strings.Contains(key, ".") {
		return // a task list
	}
	n, err := strconv.ParseInt(key, 10, 64)
	if err != nil {
		return
	}
	var sess schema.Session
	if e.Operation() != jetstream.KeyValuePut || schema.Unmarshal(e.Value(), &sess) != nil {
		f.mu.Lock()
		delete(f.running, n)
		delete(f.over, n) // expired or removed: its number may be used again
		f.mu.Unlock()
		return
	}
	f.mu.Lock()
	if sess.State == schema.SessionRunning {
		f.running[n] = sess
		delete(f.over, n)
		f.mu.Unlock()
		return
	}
	delete(f.running, n)
	if !sess.Final() {
		delete(f.over, n)
		f.mu.Unlock()
		return
	}
	f.over[n] = true
	if k := len(f.work[n]); k > 0 {
		f.log.Info().Int64("rollout", n).Str("state", sess.State).Int("work", k).Msg("rollout over; work in flight abandoned")
	}
	for _, cancel := range f.work[n] {
		cancel(ErrRolloutOver)
	}
	delete(f.work, n)
	f.mu.Unlock()
	if f.OnEnd != nil {
		f.OnEnd(n)
	}
}

// Running lists the rollouts in the running state.
func (f *Follower) Running() []schema.Session {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]schema.Session, 0, len(f.running))
	for _, s := range f.running {
		out = append(out, s)
	}
	return out
}

// Rollout returns a context for work on rollout n, cancelled with
// ErrRolloutOver when the rollout ends, or at once when it has ended
// already (a request that was on its way when it ended); done releases it.
func (f *Follower) Rollout(ctx context.Context, n int64) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	tok := new(int)
	f.mu.Lock()
	if f.over[n] {
		f.mu.Unlock()
		cancel(ErrRolloutOver)
		return ctx, func() { cancel(nil) }
	}
	if f.work[n] == nil {
		f.work[n] = map[*int]context.CancelCauseFunc{}
	}
	f.work[n][tok] = cancel
	f.mu.Unlock()
	return ctx, func() {
		f.mu.Lock()
		delete(f.work[n], tok)
		if len(f.work[n]) == 0 {
			delete(f.work, n)
		}
		f.mu.Unlock()
		cancel(nil)
	}
}

// SyncRole reads role's state from the bucket's leader and gives it to the
// role's gate (a key deleted or purged: not paused), unless the watch gave
// it a newer one already. A gateway calls it after it recorded its
// presence and before it serves: a pause answered without waiting for it
// was recorded before its presence, so this read sees that pause however
// late the watch delivers it, and no generation starts under it. It tries
// again until ctx ends.
func (f *Follower) SyncRole(ctx context.Context, role string) error {
	for {
		st, rev, found, err := f.readRole(ctx, role)
		if err == nil {
			if found {
				f.Gate(role).set(st, rev)
			} else {
				f.Gate(role).gone(rev)
			}
			return nil
		}
		f.log.Warn().Err(err).Str("role", role).Msg("reading the role's state; trying again")
		select {
		case <-ctx.Done():
			return fmt.Errorf("read the %s role's state: %w (%w)", role, err, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// readRole reads role's state from the bucket's leader with its revision.
// When the key is gone (deleted, purged, expired, or never written), rev is
// one at which it was gone: no put of it at or below rev is the role's
// state any more, so a put the watch delivers late does not bring it back.
func (f *Follower) readRole(ctx context.Context, role string) (st schema.RoleState, rev uint64, found bool, err error) {
	bucket, key := f.bus.Sessions.Bucket(), schema.RoleKey(role)
	stream := "KV_" + bucket
	// The bucket's last revision, read before the key: every put at or
	// below it came before the read that finds the key gone.
	info, err := f.bus.JS.Stream(ctx, stream)
	if err != nil {
		return st, 0, false, fail.Transientf("read the %s bucket's last revision: %w", bucket, err)
	}
	rev = info.CachedInfo().State.LastSeq
	m, err := f.bus.LastMsg(ctx, stream, "$KV."+bucket+"."+key)
	switch {
	case err != nil:
		return st, 0, false, err
	case m == nil:
		return st, rev, false, nil
	case bus.KVDeleted(m.Header):
		return st, max(rev, m.Seq), false, nil
	}
	if err := schema.Unmarshal(m.Data, &st); err != nil {
		return st, 0, false, fail.E(fail.Permanent, fmt.Errorf("kv %s/%s revision %d: %w", bucket, key, m.Seq, err))
	}
	return st, m.Seq, true, nil
}

// Gate returns the gate of role.
func (f *Follower) Gate(role string) *Gate {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := f.gates[role]
	if g == nil {
		g = newGate(role)
		f.gates[role] = g
	}
	return g
}

// Gate holds the generations of a paused role. A gateway enters it before
// a generation (Enter: the wait and the registration are one step) and
// leaves it when the generation ended, so that a pause in abort mode aborts
// them and a pause can be answered once none runs, and none can start.
type Gate struct {
	role string

	mu       sync.Mutex
	state    schema.RoleState
	rev      uint64        // the bucket revision of state (0: given by a test)
	changed  chan struct{} // closed and replaced at every change
	pause    *pauseWait    // the pause in force; nil when the role is not paused
	waiting  int           // waits held by the pause in force
	inflight map[*int]context.CancelCauseFunc
	aborted  int       // generations aborted by the current pause
	ended    time.Time // when the last pause this gate held ended, as seen here
}

// pauseWait is one pause as the work waiting for it sees it: over is closed
// when the pause ends, and err says why that work fails (set, before over
// is closed, when the pause ended at its time-out; nil when it was resumed
// or replaced by another pause, and the work goes on).
type pauseWait struct {
	epoch int64
	over  chan struct{}
	err   error
}

func newGate(role string) *Gate {
	return &Gate{role: role, changed: make(chan struct{}), inflight: map[*int]context.CancelCauseFunc{}}
}

// set gives the gate the role's state at bucket revision rev. A state no
// newer than the one it holds is ignored: the watch may deliver one older
// than what SyncRole read.
func (g *Gate) set(st schema.RoleState, rev uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if rev != 0 {
		if rev <= g.rev {
			return
		}
		g.rev = rev
	}
	g.apply(st)
}

// gone gives the gate the absence of the role's key at bucket revision rev
// (deleted, purged, or expired at the bucket's TTL): no pause is in force,
// the role runs, and the work a pause held goes on. A put at rev itself
// came before the absence; rev 0 says nothing (the bucket held nothing, or
// the watch delivered nothing), and what the gate holds is no older.
func (g *Gate) gone(rev uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if rev == 0 || rev < g.rev {
		return
	}
	g.rev = rev
	g.apply(schema.RoleState{Role: g.role})
}

// apply makes st the gate's state; g.mu is held.
func (g *Gate) apply(st schema.RoleState) {
	newPause := st.Paused && (!g.state.Paused || st.Epoch != g.state.Epoch)
	if p := g.pause; p != nil && (!st.Paused || st.Epoch != p.epoch) {
		// The pause in force ended. If at its time-out, the work that
		// waited for it fails; work that comes after goes through.
		if x := st.Expiry; x != nil && x.Epoch == p.epoch {
			p.err = fail.Permanentf("the %s role was paused at %s and not resumed in time: %s", g.role,
				time.UnixMilli(x.SinceMs).UTC().Format(time.RFC3339), x.Reason)
		}
		close(p.over)
		g.pause = nil
		g.ended = time.Now()
	}
	if st.Paused && g.pause == nil {
		g.pause = &pauseWait{epoch: st.Epoch, over: make(chan struct{})}
	}
	g.state = st
	if newPause {
		g.aborted = 0
		if st.Mode == schema.PauseAbort {
			for _, cancel := range g.inflight {
				cancel(ErrPaused)
				g.aborted++
			}
		}
	}
	close(g.changed)
	g.changed = make(chan struct{})
}

// State is the role's state as last seen.
func (g *Gate) State() schema.RoleState {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state
}

// Wait returns when the role may generate: at once unless it is paused,
// else when the pause ends. A pause that ended at its time-out fails the
// waits that waited for it, saying so; the waits that begin after it go
// through (the role works again).
func (g *Gate) Wait(ctx context.Context) error {
	for {
		g.mu.Lock()
		p := g.pause
		if p != nil {
			g.waiting++
			telemetry.PauseWaits.WithLabelValues(g.role).Inc()
		}
		g.mu.Unlock()
		if p == nil {
			return nil
		}
		var err error
		select {
		case <-p.over:
			err = p.err
		case <-ctx.Done():
			err = ctx.Err()
		}
		g.mu.Lock()
		g.waiting--
		telemetry.PauseWaits.WithLabelValues(g.role).Dec()
		g.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// Held says whether the role is paused now, and when the last pause this
// gate held ended (zero when none did since it started): time the role's
// work spent held, which is no stall of that work (the pause's time-out
// bounds it).
func (g *Gate) Held() (paused bool, ended time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pause != nil, g.ended
}

// Waiting is how many waits the role's pause holds now.
func (g *Gate) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting
}

// Enter waits until the role may generate (as Wait) and registers a
// generation in the same step as it finds the gate open: once a pause has
// been answered (Drained), no generation passes the gate until the resume
// or the pause's expiry. Everything from the gate to the end of the
// generation — tokenizing its prompt included — runs between Enter and
// done; a pause in abort mode cancels the returned context with ErrPaused.
func (g *Gate) Enter(ctx context.Context) (context.Context, func(), error) {
	for {
		if err := g.Wait(ctx); err != nil {
			return nil, nil, err
		}
		if gctx, done, _, ok := g.TryEnter(ctx); ok {
			return gctx, done, nil
		}
		// Paused between the two: waited for again.
	}
}

// TryEnter is Enter without the wait: when the role is paused it registers
// nothing and returns the role's state and false.
func (g *Gate) TryEnter(ctx context.Context) (context.Context, func(), schema.RoleState, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state.Paused {
		return nil, nil, g.state, false
	}
	ctx, cancel := context.WithCancelCause(ctx)
	tok := new(int)
	g.inflight[tok] = cancel
	return ctx, func() {
		g.mu.Lock()
		delete(g.inflight, tok)
		g.mu.Unlock()
		cancel(nil)
	}, g.state, true
}

// Drained waits until no generation runs under the pause of epoch, and
// returns how many the pause aborted; false when the role was resumed (or
// paused again) meanwhile, or ctx ended.
func (g *Gate) Drained(ctx context.Context, epoch int64) (aborted int, ok bool) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		g.mu.Lock()
		st, n, aborted := g.state, len(g.inflight), g.aborted
		g.mu.Unlock()
		if !st.Paused || st.Epoch != epoch {
			return 0, false
		}
		if n == 0 {
			return aborted, true
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return 0, false
		}
	}
}

// AnswerPauses publishes, for every pause of the gate's role, that this
// gateway runs no generation of it any more (in abort mode once it has
// aborted them, in wait mode once they finished), until ctx ends.
func (f *Follower) AnswerPauses(ctx context.Context, role, gateway string) {
	g := f.Gate(role)
	var answered int64
	for ctx.Err() == nil {
		g.mu.Lock()
		st, changed := g.state, g.changed
		g.mu.Unlock()
		if st.Paused && st.Epoch != answered {
			if aborted, ok := g.Drained(ctx, st.Epoch); ok {
				d := &schema.Drained{Role: role, Epoch: st.Epoch, Gateway: gateway, Aborted: aborted, AtMs: time.Now().UnixMilli()}
				if err := f.bus.Publish(ctx, d); err != nil {
					f.log.Warn().Err(err).Str("role", role).Int64("epoch", st.Epoch).Msg("drained not said; trying again")
					select {
					case <-ctx.Done():
					case <-time.After(time.Second):
					}
					continue
				}
				answered = st.Epoch
			}
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
		}
	}
}

// String is for logs.
func (g *Gate) String() string {
	st := g.State()
	return fmt.Sprintf("%s paused=%v epoch=%d", g.role, st.Paused, st.Epoch)
}
