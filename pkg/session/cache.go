// Package session reads a rollout's session and tasks from the sessions
// bucket, with a short-lived cache, for the services that act on a rollout
// but do not own its lifecycle.
package session

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

// ErrNoSession is the cause of Get's error for a rollout planact does not
// know (never arrived, or expired): its messages belong to nothing.
var ErrNoSession = errors.New("no session")

// Info is what a service needs to know of a rollout. Tasks are loaded only
// while it runs (Active).
type Info struct {
	Session schema.Session
	Tasks   []schema.Task
}

// Active reports whether the rollout is still running.
func (i *Info) Active() bool { return i.Session.State == schema.SessionRunning }

// Task returns episode e's task.
func (i *Info) Task(e int) (schema.Task, error) {
	if e < 0 || e >= len(i.Tasks) {
		return schema.Task{}, fail.Invalidf("rollout %d has no episode %d (%d tasks)", i.Session.Rollout, e, len(i.Tasks))
	}
	return i.Tasks[e], nil
}

// Engine returns the engine a role arrived with.
func (i *Info) Engine(role string) (schema.Engine, string, error) {
	r, ok := i.Session.Roles[role]
	if !ok || r.Engine.URL == "" {
		return schema.Engine{}, "", fail.Permanentf("rollout %d: role %s brought no engine", i.Session.Rollout, role)
	}
	return r.Engine, r.WeightVersion, nil
}

// Cache loads Infos, refreshing the session (its state may change) after
// Fresh and keeping the tasks (they never change) until the entry idles out.
type Cache struct {
	KV    *bus.Bucket
	NC    *nats.Conn    // reads large task lists from their object store
	Fresh time.Duration // default 1s
	Idle  time.Duration // default 1m: a rollout not used for that long is read again if needed

	mu      sync.Mutex
	entries map[int64]*entry
	sweep   time.Time
}

type entry struct {
	mu       sync.Mutex
	info     *Info
	loaded   time.Time
	lastUsed time.Time
}

// NewCache returns a cache over the bus's sessions bucket and object store.
func NewCache(b *bus.Bus) *Cache { return &Cache{KV: b.Sessions, NC: b.NC} }

// LoadTasks reads rollout n's tasks, from the object store when the KV
// value names an object. found is false when no arrival brought tasks.
func LoadTasks(ctx context.Context, kv *bus.Bucket, nc *nats.Conn, n int64) ([]schema.Task, bool, error) {
	tl, found, err := LoadTaskList(ctx, kv, nc, n)
	return tl.Tasks, found, err
}

// LoadTaskList reads rollout n's task list as its arrival recorded it (who
// brought it, its digest), with its tasks, from the object store when the
// KV value names an object: an object whose content is not what that
// arrival named (another put under its name) is refused, not read as the
// list.
func LoadTaskList(ctx context.Context, kv *bus.Bucket, nc *nats.Conn, n int64) (schema.TaskList, bool, error) {
	tl, _, found, err := bus.GetFresh[schema.TaskList](ctx, kv, schema.TasksKey(n))
	if err != nil || !found || tl.Object == "" {
		return tl, found, err
	}
	tasks, err := ReadTaskList(ctx, nc, tl)
	if err != nil {
		return tl, true, fmt.Errorf("rollout %d: %w", n, err)
	}
	tl.Tasks = tasks
	return tl, true, nil
}

// ReadTaskList reads the task list object tl names, from the store of the
// role that brought it (tasks_<role>), chunk by chunk (no consumer), and
// refuses it unless its bytes have the SHA-256 the arrival named
// (tl.Digest, "sha256:<hex>"): a trainer may write its own store, so a list
// changed after the arrival must not be run.
func ReadTaskList(ctx context.Context, nc *nats.Conn, tl schema.TaskList) ([]schema.Task, error) {
	if tl.From == "" || !strings.HasPrefix(tl.Digest, schema.DigestSHA256) {
		return nil, fail.Permanentf("task object %s: no role or SHA-256 recorded for it (%q, %q): an arrival of an older planact", tl.Object, tl.From, tl.Digest)
	}
	bucket := bus.ObjectTasks(tl.From)
	data, err := bus.ReadObject(ctx, nc, bucket, tl.Object, maxObjectBytes)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fail.Permanentf("task object %s/%s is gone (%w)", bucket, tl.Object, jetstream.ErrObjectNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("task object %s/%s: %w", bucket, tl.Object, err)
	}
	if got := schema.DigestSHA256 + bus.SHA256(data); got != tl.Digest {
		return nil, fail.Permanentf("task object %s/%s changed after the %s arrival that brought it: its SHA-256 is %s, the arrival named %s (a list is put once, under a name of its own)",
			bucket, tl.Object, tl.From, strings.TrimPrefix(got, schema.DigestSHA256), strings.TrimPrefix(tl.Digest, schema.DigestSHA256))
	}
	var inner taskList
	if err := schema.UnmarshalValueStrict(data, &inner, "task list "+tl.Object); err != nil {
		return nil, fmt.Errorf("task object %s/%s: %w", bucket, tl.Object, err)
	}
	tasks := make([]schema.Task, len(inner.Tasks))
	for i, t := range inner.Tasks {
		tasks[i] = schema.Task{GroupIndex: t.GroupIndex, Index: t.Index, Prompt: t.Prompt, Label: t.Label, Dataset: t.Dataset}
	}
	inner.Tasks = nil
	// What an inline list is held to on arrival, an object's is too.
	if err := schema.ValidateTasks(tasks); err != nil {
		return nil, fail.Permanentf("task object %s/%s: %w", bucket, tl.Object, err)
	}
	if len(data) >= collectAfterBytes {
		// The object's bytes and its decoded tasks were live together, and
		// the collector sizes the heap it lets grow from what was live at
		// its last run: twice both, four times the list. Collected now that
		// the bytes are dropped, it lets the heap grow to twice the tasks.
		data = nil
		runtime.GC()
	}
	return tasks, nil
}

// taskList is schema.TaskList as LoadTasks reads it from the object store:
// the tasks' metadata is checked to be a map and skipped, not decoded. It
// is the trainer's (what its dataset keeps with a task) and no service
// reads it; decoded, a few keys per task cost more memory than the
// prompts. Its fields are schema.Task's (a test holds them equal).
type taskList struct {
	Tasks  []listedTask `json:"tasks,omitempty"`
	Object string       `json:"object,omitempty"`
	From   string       `json:"from,omitempty"`   // read past: what the KV value records, not the object
	Digest string       `json:"digest,omitempty"` // likewise
}

type listedTask struct {
	GroupIndex int             `json:"group_index"`
	Index      int             `json:"index"`
	Prompt     string          `json:"prompt"`
	Label      string          `json:"label,omitempty"`
	Dataset    string          `json:"dataset,omitempty"`
	Metadata   skippedMetadata `json:"metadata,omitempty"`
}

// skippedMetadata is a task's metadata, read past without being decoded.
type skippedMetadata map[string]any

// DecodeMsgpack skips the value after checking that it is a map (or nil),
// as schema.Task's map[string]any would.
func (*skippedMetadata) DecodeMsgpack(d *msgpack.Decoder) error {
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	if c != msgpcode.Nil && !msgpcode.IsFixedMap(c) && c != msgpcode.Map16 && c != msgpcode.Map32 {
		return fmt.Errorf("a task's metadata: want a map, not msgpack code 0x%x", c)
	}
	return d.Skip()
}

// collectAfterBytes is the size of a task list after whose reading the
// heap is collected at once (see LoadTasks).
const collectAfterBytes = 8 << 20

// maxObjectBytes bounds the task list read from the object store.
const maxObjectBytes = 1 << 30

// Get returns rollout n's Info. Whatever would make a service drop work —
// no session (its messages belong to nothing: a permanent error), or a
// session that is not running — is decided on a read from the leader: a
// direct get may be answered by a follower that has not yet seen the start,
// and would show a running rollout as still waiting. A cached running
// state may be up to Fresh old, which can only make a rollout that just
// ended look running (its work is then dropped a moment later), never the
// reverse: a state that is not running is never served from the cache
// (the number may have been used again since by a rollout that runs).
func (c *Cache) Get(ctx context.Context, n int64) (*Info, error) {
	now := time.Now()
	fresh, idle := c.Fresh, c.Idle
	if fresh == 0 {
		fresh = time.Second
	}
	if idle == 0 {
		idle = time.Minute
	}
	c.mu.Lock()
	if c.entries == nil {
		c.entries = map[int64]*entry{}
	}
	if now.Sub(c.sweep) > idle {
		for k, e := range c.entries {
			if now.Sub(e.lastUsed) > idle {
				delete(c.entries, k)
			}
		}
		c.sweep = now
	}
	e := c.entries[n]
	if e == nil {
		e = &entry{}
		c.entries[n] = e
	}
	e.lastUsed = now
	c.mu.Unlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	if e.info != nil && e.info.Active() && now.Sub(e.loaded) < fresh {
		return e.info, nil
	}
	s, _, found, err := readSession(ctx, c.KV, schema.SessionKey(n))
	if err == nil && (!found || s.State != schema.SessionRunning) {
		s, _, found, err = readSessionFresh(ctx, c.KV, schema.SessionKey(n))
	}
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fail.E(fail.Permanent, fmt.Errorf("rollout %d: %w", n, ErrNoSession))
	}
	info := &Info{Session: s}
	// Tasks read before are this rollout's only if the session is the
	// same: rollout numbers start again when a training run does, and the
	// entry may be an earlier rollout's of the number.
	same := e.info != nil && e.info.Session.CreatedMs == s.CreatedMs
	if s.State != schema.SessionRunning {
		// Its work is dropped: no task is needed (those read before are
		// kept), and a rollout that ended may have had its task list
		// removed already.
		if same {
			info.Tasks = e.info.Tasks
		}
		e.info, e.loaded = info, now
		return info, nil
	}
	if same && len(e.info.Tasks) > 0 {
		info.Tasks = e.info.Tasks
	} else {
		tasks, found, err := LoadTasks(ctx, c.KV, c.NC, n)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, fail.Permanentf("rollout %d has no tasks", n)
		}
		info.Tasks = tasks
	}
	e.info, e.loaded = info, now
	return info, nil
}

// The session's reads: any replica's answer, and the leader's. Variables so
// that a test can play a follower that lags.
var (
	readSession      = bus.Get[schema.Session]
	readSessionFresh = bus.GetFresh[schema.Session]
)

// Forget drops rollout n from the cache.
func (c *Cache) Forget(n int64) {
	c.mu.Lock()
	delete(c.entries, n)
	c.mu.Unlock()
}

// String is for logs.
func (i *Info) String() string {
	return fmt.Sprintf("rollout %d (%s, %d episodes)", i.Session.Rollout, i.Session.State, i.Session.Episodes)
}
