package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/fail"
)

// Provisioning sets the retention of what planact keeps in JetStream.
// The zero value gives DefaultProvisioning.
type Provisioning struct {
	Replicas int // 1 embedded, 3 on a cluster
	// History is how long planact keeps a rollout: its messages in the
	// streams, and its session key, the record that says how it ended and
	// keeps its id from being taken for a new rollout.
	History time.Duration
	// ResultRetention is how long a finished rollout's results stay in the
	// object stores (both trainers have fetched theirs long before).
	ResultRetention time.Duration
	// DupeWindow is how long a Nats-Msg-Id is remembered.
	DupeWindow time.Duration
}

// DefaultProvisioning keeps a day of history and results for six hours.
func DefaultProvisioning() Provisioning {
	return Provisioning{
		Replicas:        1,
		History:         24 * time.Hour,
		ResultRetention: 6 * time.Hour,
		DupeWindow:      30 * time.Minute,
	}
}

func (p Provisioning) withDefaults() Provisioning {
	d := DefaultProvisioning()
	if p.Replicas == 0 {
		p.Replicas = d.Replicas
	}
	if p.History == 0 {
		p.History = d.History
	}
	if p.ResultRetention == 0 {
		p.ResultRetention = min(d.ResultRetention, p.History)
	}
	if p.DupeWindow == 0 {
		p.DupeWindow = min(d.DupeWindow, p.History)
	}
	return p
}

// Validate reports settings that cannot work together.
func (p Provisioning) Validate() error {
	switch {
	case p.Replicas < 1 || p.Replicas > 5:
		return fmt.Errorf("replicas %d: want 1 to 5", p.Replicas)
	case p.History < time.Second:
		return fmt.Errorf("history %v: want at least 1s", p.History)
	case p.ResultRetention <= 0 || p.ResultRetention > p.History:
		return fmt.Errorf("result retention %v: want more than 0 and at most the history (%v)", p.ResultRetention, p.History)
	case p.DupeWindow <= 0 || p.DupeWindow > p.History:
		return fmt.Errorf("duplicate window %v: want more than 0 and at most the history (%v)", p.DupeWindow, p.History)
	}
	return nil
}

// StreamConfigs are the streams planact uses.
func (p Provisioning) StreamConfigs() []jetstream.StreamConfig {
	p = p.withDefaults()
	mk := func(name, subj, desc string) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name:        name,
			Description: desc,
			Subjects:    []string{subj},
			Storage:     jetstream.FileStorage,
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      p.History,
			Duplicates:  p.DupeWindow,
			Replicas:    p.Replicas,
			Discard:     jetstream.DiscardOld,
		}
	}
	rollout := mk(StreamRollout, "rollout.>", "planact rollouts: arrivals, starts, episode ends, results, time-outs")
	// Time-outs are scheduled messages, so they fire even if the
	// session-store that scheduled them is gone.
	rollout.AllowMsgSchedules = true
	rollout.AllowMsgTTL = true
	// Trainers read their results by subject with direct gets, which the
	// server's permissions can restrict to a role's own subjects.
	rollout.AllowDirect = true
	control := mk(StreamControl, "control.>", "planact control: trainers pausing and resuming their roles around weight swaps")
	control.AllowDirect = true // trainers read the answer to their pause by subject
	// On a single node the services' reads by subject are direct gets (see
	// Bus.LastMsg); on a cluster they stay reads from the leader.
	plans := mk(StreamPlan, "plan.>", "planact plans: requests, planner outputs, parsed DAGs, answers, parse errors")
	plans.AllowDirect = true
	acts := mk(StreamAct, "act.>", "planact acts: outcomes")
	acts.AllowDirect = true
	return []jetstream.StreamConfig{rollout, plans, acts, control}
}

// provisionPatience bounds how long provisioning retries: on a fresh
// cluster, services starting together race to create the same replicated
// streams, and a cluster still electing leaders answers with time-outs.
const provisionPatience = time.Minute

// provision creates or updates what planact needs, retrying with back-off
// while the cluster is not ready or another process provisions at once.
// What the server cannot do (a setting it does not support) is permanent
// and returned at once.
func (b *Bus) provision(ctx context.Context, p Provisioning) error {
	deadline := time.Now().Add(provisionPatience)
	wait := 100 * time.Millisecond
	for {
		err := b.provisionOnce(ctx, p)
		if unsupported(err) {
			return fail.E(fail.Permanent, fmt.Errorf("%w (planact needs nats-server %s or later)", err, MinServerVersion))
		}
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		b.Log.Warn().Err(err).Dur("retry_in", wait).Msg("provisioning failed, retrying")
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return err
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// unsupported says whether err is the server refusing a setting it does
// not have: no retry will change its mind.
func unsupported(err error) bool {
	for _, e := range []error{
		jetstream.ErrLimitMarkerTTLNotSupported, jetstream.ErrStreamSubjectTransformNotSupported, jetstream.ErrStreamSourceNotSupported,
		jetstream.ErrStreamSourceMultipleFilterSubjectsNotSupported, jetstream.ErrConsumerMultipleFilterSubjectsNotSupported,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (b *Bus) provisionOnce(ctx context.Context, p Provisioning) error {
	p = p.withDefaults()
	b.single = map[string]bool{}
	for _, cfg := range p.StreamConfigs() {
		// Updating a stream that is already as wanted is not a no-op on the
		// server (it rewrites the store's config, racing with consumers
		// being created by other replicas), so only a difference is applied.
		if st, err := b.JS.Stream(ctx, cfg.Name); err == nil {
			cfg.Replicas = b.keepReplicas(cfg.Name, st.CachedInfo().Config.Replicas, cfg.Replicas)
			if sameStream(st.CachedInfo().Config, cfg) {
				b.single[cfg.Name] = cfg.Replicas <= 1
				continue
			}
		}
		if _, err := b.JS.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("provision stream %s: %w", cfg.Name, err)
		}
		b.single[cfg.Name] = cfg.Replicas <= 1
	}
	var err error
	b.Sessions, err = b.keyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         BucketSession,
		Description:    "planact rollout sessions: barrier and lifecycle, one key per rollout",
		History:        1,
		TTL:            p.History,
		LimitMarkerTTL: time.Minute,
		Storage:        jetstream.FileStorage,
		Replicas:       p.Replicas,
	})
	if err != nil {
		return fmt.Errorf("provision kv %s: %w", BucketSession, err)
	}
	b.Runs, err = b.keyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         BucketRuns,
		Description:    "planact run state, one key per episode turn, removed when the rollout ends",
		History:        1,
		TTL:            p.History,
		LimitMarkerTTL: time.Minute,
		Storage:        jetstream.FileStorage,
		Replicas:       p.Replicas,
	})
	if err != nil {
		return fmt.Errorf("provision kv %s: %w", BucketRuns, err)
	}
	if b.Tasks, err = b.objectStore(ctx, ObjectTasks, "planact task lists too large for an arrival, removed when the rollout ends", p); err != nil {
		return err
	}
	b.Results = map[string]jetstream.ObjectStore{}
	for _, role := range []string{"planner", "actor"} {
		name := ObjectResults(role)
		if b.Results[role], err = b.objectStore(ctx, name, "planact "+role+" samples too large for a result message, kept for the result retention", p); err != nil {
			return err
		}
	}
	return nil
}

// objectStore opens the object store, creating or updating it only when it
// is missing or differs from what is wanted.
//
// Objects are read from the stream's leader: a direct get (nats.go's
// default for object stores) may be answered by a follower that has not
// got an object just written, and "not found" would be taken for true. So
// the store's stream is created with direct gets off from the start, never
// created with them on and switched off after: a client that opened the
// store in between keeps asking for direct gets that nobody answers any
// more ("no responders" on its first put).
func (b *Bus) objectStore(ctx context.Context, name, desc string, p Provisioning) (jetstream.ObjectStore, error) {
	scfg := objectStreamConfig(name, desc, p)
	if os, err := b.JS.ObjectStore(ctx, name); err == nil {
		if st, err := os.Status(ctx); err == nil {
			scfg.Replicas = b.keepReplicas(name, st.Replicas(), scfg.Replicas)
			direct := st.(*jetstream.ObjectBucketStatus).StreamInfo().Config.AllowDirect
			if st.Description() == scfg.Description && st.TTL() == scfg.MaxAge && st.Storage() == scfg.Storage && max(st.Replicas(), 1) == max(scfg.Replicas, 1) && !direct {
				return os, nil
			}
		}
	}
	if _, err := b.JS.CreateOrUpdateStream(ctx, scfg); err != nil {
		return nil, fmt.Errorf("provision object store %s: %w", name, err)
	}
	os, err := b.JS.ObjectStore(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("provision object store %s: %w", name, err)
	}
	return os, nil
}

// objectStreamConfig is the stream behind object store name: what nats.go's
// CreateObjectStore makes of an ObjectStoreConfig, with direct gets off.
func objectStreamConfig(name, desc string, p Provisioning) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        "OBJ_" + name,
		Description: desc,
		Subjects:    []string{"$O." + name + ".C.>", "$O." + name + ".M.>"},
		MaxAge:      p.History,
		MaxBytes:    -1,
		Storage:     jetstream.FileStorage,
		Replicas:    p.Replicas,
		Discard:     jetstream.DiscardNew,
		AllowRollup: true,
		AllowDirect: false,
	}
}

// sameStream reports whether the stream's config already holds every field
// provisioning sets.
func sameStream(have, want jetstream.StreamConfig) bool {
	return have.Description == want.Description && slices.Equal(have.Subjects, want.Subjects) &&
		have.Storage == want.Storage && have.Retention == want.Retention && have.MaxAge == want.MaxAge &&
		have.Duplicates == want.Duplicates && max(have.Replicas, 1) == max(want.Replicas, 1) &&
		have.Discard == want.Discard && have.AllowMsgSchedules == want.AllowMsgSchedules &&
		have.AllowMsgTTL == want.AllowMsgTTL && have.AllowDirect == want.AllowDirect
}

// keepReplicas never lowers the replicas of what exists: one process
// started without --replicas 3 must not shrink a cluster's streams.
func (b *Bus) keepReplicas(name string, have, want int) int {
	if have > want {
		b.Log.Warn().Str("stream", name).Int("replicas", have).Int("asked", want).Msg("keeping the existing replicas")
		return have
	}
	return want
}

// keyValue opens the bucket, creating or updating it only when it is missing
// or differs from cfg (see sameStream for why).
func (b *Bus) keyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (*Bucket, error) {
	js := b.JS
	if kv, err := js.KeyValue(ctx, cfg.Bucket); err == nil {
		if st, err := kv.Status(ctx); err == nil {
			if kvs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
				c := kvs.StreamInfo().Config
				cfg.Replicas = b.keepReplicas(cfg.Bucket, c.Replicas, cfg.Replicas)
				if c.Description == cfg.Description && c.MaxMsgsPerSubject == int64(cfg.History) && c.MaxAge == cfg.TTL &&
					c.SubjectDeleteMarkerTTL == cfg.LimitMarkerTTL && c.Storage == cfg.Storage && max(c.Replicas, 1) == max(cfg.Replicas, 1) {
					return &Bucket{KeyValue: kv, bus: b, replicated: c.Replicas > 1}, nil
				}
			}
		}
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Bucket{KeyValue: kv, bus: b, replicated: cfg.Replicas > 1}, nil
}
