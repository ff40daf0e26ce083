package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/fail"
)

// Provisioning sets the retention and the limits of what planact keeps in
// JetStream. The zero value gives DefaultProvisioning.
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
	// Storage is the JetStream file storage planact may fill on each
	// server, shared out among its streams, buckets and stores by Shares;
	// 0 = DefaultStorage. Every one of them refuses new messages when full
	// (nothing planact wrote is dropped to make room): size it from a
	// rollout (docs/security.md, "Limits").
	Storage int64
	// Shrink lets provisioning lower the history (max age) and the storage
	// of what exists to the defaults: the messages past the new limits are
	// removed at once. Without it a run that leaves History or Storage at
	// their defaults keeps the larger limits it finds (one run with the
	// defaults must not cut a longer history set before); one that states
	// them sets them.
	Shrink bool

	// defaulted: WithDefaults filled what was zero; historyGiven and
	// storageGiven say whether History and Storage were stated then.
	defaulted, historyGiven, storageGiven bool
}

// DefaultStorage is the JetStream storage planact fills on each server
// unless told otherwise: what compose/nats gives one server (20 GB) less
// room for the server's own use.
const DefaultStorage int64 = 16 << 30

// DefaultProvisioning keeps a day of history and results for six hours.
func DefaultProvisioning() Provisioning {
	return Provisioning{
		Replicas:        1,
		History:         24 * time.Hour,
		ResultRetention: 6 * time.Hour,
		DupeWindow:      30 * time.Minute,
		Storage:         DefaultStorage,
	}
}

// WithDefaults fills what p leaves zero, as provisioning does.
func (p Provisioning) WithDefaults() Provisioning {
	if p.defaulted {
		return p
	}
	p.defaulted, p.historyGiven, p.storageGiven = true, p.History != 0, p.Storage != 0
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
	if p.Storage == 0 {
		p.Storage = d.Storage
	}
	return p
}

// MinStorage is the least Storage that gives every stream room for its
// largest message.
const MinStorage int64 = 256 << 20

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
	case p.Storage < MinStorage:
		return fmt.Errorf("storage %s: want at least %s", FormatBytes(p.Storage), FormatBytes(MinStorage))
	}
	return nil
}

// Shares are the parts of Provisioning.Storage each stream, bucket and
// object store may fill, by stream name (a bucket's stream is KV_<bucket>,
// an object store's OBJ_<store>). They follow what a rollout writes where
// (docs/security.md, "Limits"): the planner's outputs with their token ids
// and log-probs are the most, then the acts' outcomes, then the results.
var Shares = map[string]float64{
	StreamPlan:                        0.30,
	StreamAct:                         0.20,
	StreamRollout:                     0.15,
	"OBJ_" + ObjectResults("planner"): 0.075,
	"OBJ_" + ObjectResults("actor"):   0.075,
	"KV_" + BucketRuns:                0.08,
	"KV_" + BucketSession:             0.03,
	"OBJ_" + ObjectTasks("planner"):   0.025,
	"OBJ_" + ObjectTasks("actor"):     0.025,
	StreamTrainer("planner"):          0.01,
	StreamTrainer("actor"):            0.01,
	StreamControl:                     0.005,
	StreamTimeout:                     0.005,
	StreamPresence:                    0.001,
}

// Message sizes: a trainer's arrival carries its tasks inline up to the
// client's inline limit (256 KiB) and refers to the object store above it;
// a control message or a time-out is a few hundred bytes.
const (
	MaxTrainerMsg = 1 << 20
	MaxSmallMsg   = 64 << 10
)

// ControlPerSubject is how many messages CONTROL keeps of each subject
// (the answers to a role's pauses, its refusals, a gateway's drains, ...).
const ControlPerSubject = 24

// Bytes returns what the stream (or bucket or store) name may hold.
func (p Provisioning) Bytes(name string) int64 {
	p = p.WithDefaults()
	return max(int64(Shares[name]*float64(p.Storage)), 1<<20)
}

// StreamConfigs are the streams planact uses. What trainers write (their
// streams) and what planact writes never share a stream; only TIMEOUT,
// which the session-store alone writes, allows message schedules (and so
// roll-ups and purges); the others refuse roll-ups, message deletes and
// purges, and refuse a message when full instead of dropping old ones.
func (p Provisioning) StreamConfigs() []jetstream.StreamConfig {
	p = p.WithDefaults()
	mk := func(name, desc string, subjects ...string) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name:        name,
			Description: desc,
			Subjects:    subjects,
			Storage:     jetstream.FileStorage,
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      p.History,
			MaxBytes:    p.Bytes(name),
			Duplicates:  p.DupeWindow,
			Replicas:    p.Replicas,
			Discard:     jetstream.DiscardNew,
			DenyDelete:  true,
			DenyPurge:   true,
			// Reads by subject are direct gets: trainers read their results
			// and the answers to their pauses (the server's permissions can
			// allow a role's own subjects only), the viewer reads history,
			// and on a single node the services read this way (see
			// Bus.LastMsg); on a cluster they stay reads from the leader.
			AllowDirect: true,
		}
	}
	rollout := mk(StreamRollout, "planact rollouts: starts, statuses, episode ends, results (planact writes it)",
		"rollout.*.start", "rollout.*.status", "rollout.*.end.*", "rollout.*.result.>",
		// Before roles were in these subjects; only an admin may publish
		// them, to be told where arrivals and cancels go.
		"rollout.*.arrive", "rollout.*.cancel")
	plans := mk(StreamPlan, "planact plans: requests, planner outputs, parsed DAGs, answers, parse errors", "plan.>")
	acts := mk(StreamAct, "planact acts: outcomes", "act.>")
	control := mk(StreamControl, "planact control: answers to pauses and resumes (and refusals), gateways that drained, pauses that expired, rollbacks",
		"control.*.paused", "control.*.resumed", "control.*.refused", "control.*.drained.*", "control.*.expired", "control.*.rollback")
	control.MaxMsgSize = MaxSmallMsg
	// Both roles' answers share CONTROL, which refuses new messages when
	// full; a trainer provokes as many as it sends pauses and resumes
	// (valid or refused). Each subject keeps its last few only, so that a
	// trainer's flood pushes out its own older answers, each small
	// (schema.MaxControlID), and never leaves the other role's pauses
	// unanswered. Every reader of CONTROL reads a subject's last message.
	control.MaxMsgsPerSubject = ControlPerSubject
	// Time-outs are scheduled messages, so they fire even if the
	// session-store that scheduled them is gone. A schedule's target must be
	// in its own stream, so the time-outs live here with their schedules.
	// NATS makes a stream that allows schedules allow roll-ups and purges
	// and drop old messages when full: a time-out lost that way is found
	// by the session-store's sweep, which ends rollouts past their deadline.
	timeout := mk(StreamTimeout, "planact time-outs: the session-store's schedules and their firings (only it writes here)",
		"rollout.*.schedule.*", "rollout.*.timeout.*")
	timeout.AllowMsgSchedules, timeout.AllowMsgTTL, timeout.AllowRollup = true, true, true
	timeout.DenyPurge, timeout.Discard = false, jetstream.DiscardOld
	timeout.MaxMsgSize = MaxSmallMsg
	// A gateway's presence is its last notice, kept for PresenceLease by the
	// server's clock (the leader's), so a crashed gateway drops out without
	// anyone comparing clocks across hosts.
	presence := mk(StreamPresence, "planact presence: the gateways that run, each renewing its notice (only they write here)",
		"presence.*.*")
	presence.MaxMsgsPerSubject, presence.MaxAge, presence.Duplicates = 1, PresenceLease, PresenceLease
	presence.MaxMsgSize = MaxSmallMsg
	out := []jetstream.StreamConfig{rollout, plans, acts, control, timeout, presence}
	for _, role := range Roles {
		tr := mk(StreamTrainer(role), "planact "+role+" trainer: its arrivals, cancels, pauses and resumes (only it writes here)",
			"rollout.*.arrive."+role, "rollout.*.cancel."+role, "control."+role+".pause", "control."+role+".resume")
		tr.MaxMsgSize = MaxTrainerMsg
		out = append(out, tr)
	}
	return out
}

// KeyValueConfigs are planact's buckets. NATS makes a bucket with limit
// markers allow roll-ups and purges; only planact's services write them.
func (p Provisioning) KeyValueConfigs() []jetstream.KeyValueConfig {
	p = p.WithDefaults()
	return []jetstream.KeyValueConfig{{
		Bucket:         BucketSession,
		Description:    "planact rollout sessions: barrier and lifecycle, one key per rollout",
		History:        1,
		TTL:            p.History,
		LimitMarkerTTL: time.Minute,
		MaxBytes:       p.Bytes("KV_" + BucketSession),
		Storage:        jetstream.FileStorage,
		Replicas:       p.Replicas,
	}, {
		Bucket:         BucketRuns,
		Description:    "planact run state, one key per episode turn, removed when the rollout ends",
		History:        1,
		TTL:            p.History,
		LimitMarkerTTL: time.Minute,
		MaxBytes:       p.Bytes("KV_" + BucketRuns),
		Storage:        jetstream.FileStorage,
		Replicas:       p.Replicas,
	}}
}

// ObjectStoreConfigs are planact's object stores: each role's task lists
// (written by its trainer) and results (written by the session-store).
func (p Provisioning) ObjectStoreConfigs() []jetstream.ObjectStoreConfig {
	p = p.WithDefaults()
	var out []jetstream.ObjectStoreConfig
	for _, role := range Roles {
		out = append(out, jetstream.ObjectStoreConfig{
			Bucket:      ObjectTasks(role),
			Description: "planact " + role + " task lists too large for an arrival, written by its trainer, removed when the rollout ends",
			TTL:         p.History,
			MaxBytes:    p.Bytes("OBJ_" + ObjectTasks(role)),
			Storage:     jetstream.FileStorage,
			Replicas:    p.Replicas,
		}, jetstream.ObjectStoreConfig{
			Bucket:      ObjectResults(role),
			Description: "planact " + role + " samples too large for a result message, kept for the result retention",
			TTL:         p.History,
			MaxBytes:    p.Bytes("OBJ_" + ObjectResults(role)),
			Storage:     jetstream.FileStorage,
			Replicas:    p.Replicas,
		})
	}
	return out
}

// provisionPatience bounds how long provisioning retries, and how long a
// service waits for what it needs to be provisioned: on a fresh cluster,
// processes starting together race to create the same replicated streams,
// and a cluster still electing leaders answers with time-outs.
const provisionPatience = time.Minute

// Provision creates what planact keeps in JetStream, or updates it to p:
// streams, buckets and object stores. It is the admin's step (`planact
// provision`, which `planact up` runs in process); the services only open
// what it made. It retries with back-off while the cluster is not ready or
// another process provisions at once.
func Provision(ctx context.Context, nc *nats.Conn, log zerolog.Logger, p Provisioning) error {
	p = p.WithDefaults()
	if err := p.Validate(); err != nil {
		return err
	}
	if err := CheckServerVersion(nc); err != nil {
		return err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(PublishTimeout))
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	b := &Bus{NC: nc, JS: js, Log: log, Provisioning: p}
	return b.provision(ctx, p)
}

// provision creates or updates what planact needs, retrying with back-off
// while the cluster is not ready or another process provisions at once.
// What the server cannot do (a setting it does not support) is permanent
// and returned at once.
func (b *Bus) provision(ctx context.Context, p Provisioning) error {
	return b.retry(ctx, "provisioning", func() error { return b.provisionOnce(ctx, p) })
}

// retry runs op until it succeeds, ctx ends or provisionPatience passes;
// an error that waiting cannot mend (ErrOldLayout, a setting the server
// does not support, a fail.Permanent one) ends it at once.
func (b *Bus) retry(ctx context.Context, what string, op func() error) error {
	return b.retryFor(ctx, what, provisionPatience, op)
}

// retryFor is retry with its own patience; 0 tries until ctx ends.
func (b *Bus) retryFor(ctx context.Context, what string, patience time.Duration, op func() error) error {
	deadline := time.Now().Add(patience)
	wait := 100 * time.Millisecond
	for {
		err := op()
		if unsupported(err) {
			return fail.E(fail.Permanent, fmt.Errorf("%w (planact needs nats-server %s or later)", err, MinServerVersion))
		}
		if err == nil || ctx.Err() != nil || patience > 0 && time.Now().After(deadline) || errors.Is(err, ErrOldLayout) || !fail.IsRetryable(err) {
			return err
		}
		b.Log.Warn().Err(err).Dur("retry_in", wait).Msg(what + " failed, retrying")
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

// ErrOldLayout is in the error of provisioning that finds a stream made by
// an older planact whose settings NATS cannot change in place.
var ErrOldLayout = errors.New("made by an older planact")

func (b *Bus) provisionOnce(ctx context.Context, p Provisioning) error {
	for _, cfg := range p.StreamConfigs() {
		// Updating a stream that is already as wanted is not a no-op on the
		// server (it rewrites the store's config, racing with consumers
		// being created by other replicas), so only a difference is applied.
		// A stream that could not be read is not taken for missing: made
		// anew with cfg as it is, it would lose the longer history, larger
		// storage and replicas it has (read again at the next try).
		st, err := b.JS.Stream(ctx, cfg.Name)
		if err != nil {
			if !errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("provision stream %s: %w", cfg.Name, err)
			}
			// Missing: created, never updated (another process may have
			// made it since, with settings this one would lower).
			if _, err := b.JS.CreateStream(ctx, cfg); err != nil {
				return fmt.Errorf("provision stream %s: %w", cfg.Name, explainCreate(err, p))
			}
			continue
		}
		have := st.CachedInfo().Config
		cfg.Replicas = b.keepReplicas(cfg.Name, have.Replicas, cfg.Replicas)
		cfg.MaxAge, cfg.MaxBytes = b.keepLimits(cfg.Name, p, have.MaxAge, cfg.MaxAge, have.MaxBytes, cfg.MaxBytes)
		if sameStream(have, cfg) {
			continue
		}
		if err := canUpdate(have, cfg); err != nil {
			return err
		}
		if _, err := b.JS.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("provision stream %s: %w", cfg.Name, explainCreate(err, p))
		}
	}
	for _, cfg := range p.KeyValueConfigs() {
		if _, err := b.keyValue(ctx, cfg); err != nil {
			return fmt.Errorf("provision kv %s: %w", cfg.Bucket, explainCreate(err, p))
		}
	}
	for _, cfg := range p.ObjectStoreConfigs() {
		if _, err := b.objectStore(ctx, cfg); err != nil {
			return err
		}
	}
	return nil
}

// canUpdate refuses, with what to do, the updates NATS does not allow: a
// stream of the layout before trainers and planact had their own streams
// (ROLLOUT held rollout.> and allowed message schedules, which cannot be
// turned off).
func canUpdate(have, want jetstream.StreamConfig) error {
	switch {
	case have.AllowMsgSchedules && !want.AllowMsgSchedules,
		have.AllowMsgTTL && !want.AllowMsgTTL,
		have.DenyDelete && !want.DenyDelete,
		have.DenyPurge && !want.DenyPurge:
		return fmt.Errorf("stream %s was %w (subjects %s, message schedules %v): NATS cannot change it to this planact's layout in place; "+
			"once no rollout runs, remove it (nats stream rm %s, as the admin; its history goes with it) and run planact provision again",
			have.Name, ErrOldLayout, strings.Join(have.Subjects, " "), have.AllowMsgSchedules, have.Name)
	}
	return nil
}

// explainCreate says what to do when the servers refuse the storage
// planact asks for.
func explainCreate(err error, p Provisioning) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == 10047 || apiErr.ErrorCode == 10023) {
		return fmt.Errorf("%w: planact asks for %s on each server (--storage) with %d replicas; the servers (max_file_store) or the account (jetstream max_file) have less: give a smaller --storage",
			err, FormatBytes(p.Storage), p.Replicas)
	}
	return err
}

// objectStore creates or updates the object store, only when it is
// missing or differs from what is wanted.
//
// Objects are read from the stream's leader: a direct get (nats.go's
// default for object stores) may be answered by a follower that has not
// got an object just written, and "not found" would be taken for true. So
// the store's stream is created with direct gets off from the start, never
// created with them on and switched off after: a client that opened the
// store in between keeps asking for direct gets that nobody answers any
// more ("no responders" on its first put).
func (b *Bus) objectStore(ctx context.Context, ocfg jetstream.ObjectStoreConfig) (jetstream.ObjectStore, error) {
	name := ocfg.Bucket
	scfg := objectStreamConfig(ocfg)
	// One that could not be read is not taken for missing (see
	// provisionOnce): it is read again at the next try.
	os, err := b.JS.ObjectStore(ctx, name)
	switch {
	case err == nil:
		st, err := os.Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("provision object store %s: %w", name, err)
		}
		scfg.Replicas = b.keepReplicas(name, st.Replicas(), scfg.Replicas)
		c := st.(*jetstream.ObjectBucketStatus).StreamInfo().Config
		scfg.MaxAge, scfg.MaxBytes = b.keepLimits(scfg.Name, b.Provisioning, c.MaxAge, scfg.MaxAge, c.MaxBytes, scfg.MaxBytes)
		if st.Description() == scfg.Description && st.TTL() == scfg.MaxAge && st.Storage() == scfg.Storage &&
			max(st.Replicas(), 1) == max(scfg.Replicas, 1) && !c.AllowDirect && c.MaxBytes == scfg.MaxBytes {
			return os, nil
		}
		if _, err := b.JS.UpdateStream(ctx, scfg); err != nil {
			return nil, fmt.Errorf("provision object store %s: %w", name, explainCreate(err, b.Provisioning))
		}
	case errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
		if _, err := b.JS.CreateStream(ctx, scfg); err != nil {
			return nil, fmt.Errorf("provision object store %s: %w", name, explainCreate(err, b.Provisioning))
		}
	default:
		return nil, fmt.Errorf("provision object store %s: %w", name, err)
	}
	if os, err = b.JS.ObjectStore(ctx, name); err != nil {
		return nil, fmt.Errorf("provision object store %s: %w", name, err)
	}
	return os, nil
}

// objectStreamConfig is the stream behind an object store: what nats.go's
// CreateObjectStore makes of c, with direct gets off.
func objectStreamConfig(c jetstream.ObjectStoreConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        "OBJ_" + c.Bucket,
		Description: c.Description,
		Subjects:    []string{"$O." + c.Bucket + ".C.>", "$O." + c.Bucket + ".M.>"},
		MaxAge:      c.TTL,
		MaxBytes:    c.MaxBytes,
		Storage:     c.Storage,
		Replicas:    c.Replicas,
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
		have.AllowMsgTTL == want.AllowMsgTTL && have.AllowDirect == want.AllowDirect &&
		have.MaxBytes == want.MaxBytes && noLimit(int64(have.MaxMsgSize)) == noLimit(int64(want.MaxMsgSize)) &&
		have.DenyDelete == want.DenyDelete && have.DenyPurge == want.DenyPurge && have.AllowRollup == want.AllowRollup &&
		noLimit(have.MaxMsgsPerSubject) == noLimit(want.MaxMsgsPerSubject)
}

// noLimit reads a stream limit as the server stores it: a config that sets
// none (0) comes back as -1.
func noLimit(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// keepLimits keeps the max age and bytes of what exists where they are
// larger than the defaults asked for, unless p.Shrink: lowering them
// removes the messages past them at once. A history or storage p states
// is set as stated. (0 or less is no limit: the largest.)
func (b *Bus) keepLimits(name string, p Provisioning, haveAge, wantAge time.Duration, haveBytes, wantBytes int64) (time.Duration, int64) {
	longer := func(a, b time.Duration) bool { return (a <= 0 && b > 0) || (b > 0 && a > b) }
	bigger := func(a, b int64) bool { return (a <= 0 && b > 0) || (b > 0 && a > b) }
	if longer(haveAge, wantAge) {
		if p.Shrink || p.historyGiven {
			b.Log.Warn().Str("stream", name).Dur("max_age", haveAge).Dur("new_max_age", wantAge).Msg("shortening the history: older messages are removed")
		} else {
			b.Log.Warn().Str("stream", name).Dur("max_age", haveAge).Dur("default", wantAge).Msg("keeping the existing longer history (--history or --shrink lowers it)")
			wantAge = haveAge
		}
	}
	if bigger(haveBytes, wantBytes) {
		if p.Shrink || p.storageGiven {
			b.Log.Warn().Str("stream", name).Int64("max_bytes", haveBytes).Int64("new_max_bytes", wantBytes).Msg("lowering the storage: messages past it are removed")
		} else {
			b.Log.Warn().Str("stream", name).Int64("max_bytes", haveBytes).Int64("default", wantBytes).Msg("keeping the existing larger storage (--storage or --shrink lowers it)")
			wantBytes = haveBytes
		}
	}
	return wantAge, wantBytes
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

// keyValue creates or updates the bucket, only when it is missing or
// differs from cfg (see sameStream for why).
func (b *Bus) keyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (*Bucket, error) {
	js := b.JS
	// One that could not be read is not taken for missing (see
	// provisionOnce): it is read again at the next try.
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	switch {
	case err == nil:
		st, err := kv.Status(ctx)
		if err != nil {
			return nil, err
		}
		c := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
		cfg.Replicas = b.keepReplicas(cfg.Bucket, c.Replicas, cfg.Replicas)
		cfg.TTL, cfg.MaxBytes = b.keepLimits("KV_"+cfg.Bucket, b.Provisioning, c.MaxAge, cfg.TTL, c.MaxBytes, cfg.MaxBytes)
		if c.Description == cfg.Description && c.MaxMsgsPerSubject == int64(cfg.History) && c.MaxAge == cfg.TTL &&
			c.SubjectDeleteMarkerTTL == cfg.LimitMarkerTTL && c.Storage == cfg.Storage && max(c.Replicas, 1) == max(cfg.Replicas, 1) &&
			c.MaxBytes == cfg.MaxBytes {
			return &Bucket{KeyValue: kv, bus: b, replicated: c.Replicas > 1}, nil
		}
		kv, err = js.UpdateKeyValue(ctx, cfg)
		if err != nil {
			return nil, err
		}
	case errors.Is(err, jetstream.ErrBucketNotFound):
		if kv, err = js.CreateKeyValue(ctx, cfg); err != nil {
			return nil, err
		}
	default:
		return nil, err
	}
	return &Bucket{KeyValue: kv, bus: b, replicated: cfg.Replicas > 1}, nil
}

// ErrNotProvisioned is in the error of a service that finds what it needs
// missing from JetStream.
var ErrNotProvisioned = errors.New("not provisioned")

// open opens what provisioning made, waiting (up to provisionPatience)
// for what is missing: services may start before `planact provision` has
// run. It creates and changes nothing, so a service's user needs no right
// to create or change a stream.
func (b *Bus) open(ctx context.Context, p Provisioning) error {
	return b.retry(ctx, "opening planact's streams", func() error { return b.openOnce(ctx, p) })
}

func (b *Bus) openOnce(ctx context.Context, p Provisioning) error {
	missing := func(what string, err error) error {
		if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("%s: %w: run planact provision first, as a user that may create streams (compose's admin)", what, ErrNotProvisioned)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	// A stream answers every read from the one server that holds it only
	// when it has one replica and the server is in no cluster: on a
	// cluster its replicas may be raised in place (planact provision)
	// while the services run, and a follower's answer is then not
	// authoritative.
	clustered := b.NC.ConnectedClusterName() != ""
	single := map[string]bool{}
	for _, cfg := range p.StreamConfigs() {
		st, err := b.JS.Stream(ctx, cfg.Name)
		if err != nil {
			return missing("stream "+cfg.Name, err)
		}
		have := st.CachedInfo().Config
		if !slices.Equal(have.Subjects, cfg.Subjects) {
			return fmt.Errorf("stream %s holds %s, this planact wants %s: %w: run planact provision (as the admin)",
				cfg.Name, strings.Join(have.Subjects, " "), strings.Join(cfg.Subjects, " "), ErrNotProvisioned)
		}
		single[cfg.Name] = oneServer(have.Replicas, clustered)
	}
	var err error
	for _, cfg := range p.KeyValueConfigs() {
		kv, kerr := b.JS.KeyValue(ctx, cfg.Bucket)
		if kerr != nil {
			return missing("kv "+cfg.Bucket, kerr)
		}
		st, serr := kv.Status(ctx)
		if serr != nil {
			return fmt.Errorf("kv %s: %w", cfg.Bucket, serr)
		}
		bucket := &Bucket{KeyValue: kv, bus: b, replicated: !oneServer(st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas, clustered)}
		switch cfg.Bucket {
		case BucketSession:
			b.Sessions = bucket
		case BucketRuns:
			b.Runs = bucket
		}
	}
	b.Tasks, b.Results = map[string]jetstream.ObjectStore{}, map[string]jetstream.ObjectStore{}
	for _, role := range Roles {
		if b.Tasks[role], err = b.JS.ObjectStore(ctx, ObjectTasks(role)); err != nil {
			return missing("object store "+ObjectTasks(role), err)
		}
		if b.Results[role], err = b.JS.ObjectStore(ctx, ObjectResults(role)); err != nil {
			return missing("object store "+ObjectResults(role), err)
		}
	}
	b.single = single
	return nil
}

// FormatBytes writes n as people read sizes: 16 GiB, 164 MiB.
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	v := float64(n) / float64(div)
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d %ciB", int64(v), "KMGTPE"[exp])
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTPE"[exp])
}

// ParseBytes reads a size as FormatBytes writes it, or with K, M, G, T
// (binary: 16G is 16 GiB), or a number of bytes.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	t = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I"), " ")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			t = strings.TrimSpace(t[:len(t)-1])
		}
	}
	n, err := strconv.ParseFloat(t, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a number of bytes, or one with K, M, G or T (16G)", s)
	}
	return int64(n * float64(mult)), nil
}

// oneServer says whether a stream of the replicas, on a server that is or
// is not in a cluster, is held by one server for good: every read of it
// is then answered by the server that took every acknowledged write.
func oneServer(replicas int, clustered bool) bool { return replicas <= 1 && !clustered }
