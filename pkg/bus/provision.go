package bus

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Provisioning sets the retention of what planact keeps in JetStream.
// The zero value gives DefaultProvisioning.
type Provisioning struct {
	Replicas      int           // 1 embedded, 3 on a cluster
	HistoryMaxAge time.Duration // how long streams keep a rollout's messages
	SessionTTL    time.Duration // how long a session key lives without writes
	RunTTL        time.Duration // how long a run key lives without writes
	ResultTTL     time.Duration // how long results stay in the object store
	DupeWindow    time.Duration // how long a Nats-Msg-Id is remembered
}

// DefaultProvisioning keeps a day of history.
func DefaultProvisioning() Provisioning {
	return Provisioning{
		Replicas:      1,
		HistoryMaxAge: 24 * time.Hour,
		SessionTTL:    24 * time.Hour,
		RunTTL:        24 * time.Hour,
		ResultTTL:     24 * time.Hour,
		DupeWindow:    30 * time.Minute,
	}
}

func (p Provisioning) withDefaults() Provisioning {
	d := DefaultProvisioning()
	if p.Replicas == 0 {
		p.Replicas = d.Replicas
	}
	if p.HistoryMaxAge == 0 {
		p.HistoryMaxAge = d.HistoryMaxAge
	}
	if p.SessionTTL == 0 {
		p.SessionTTL = d.SessionTTL
	}
	if p.RunTTL == 0 {
		p.RunTTL = d.RunTTL
	}
	if p.ResultTTL == 0 {
		p.ResultTTL = d.ResultTTL
	}
	if p.DupeWindow == 0 {
		p.DupeWindow = d.DupeWindow
	}
	return p
}

// StreamConfigs are the three streams planact uses.
func (p Provisioning) StreamConfigs() []jetstream.StreamConfig {
	p = p.withDefaults()
	mk := func(name, subj, desc string) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name:        name,
			Description: desc,
			Subjects:    []string{subj},
			Storage:     jetstream.FileStorage,
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      p.HistoryMaxAge,
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
	return []jetstream.StreamConfig{
		rollout,
		mk(StreamPlan, "plan.>", "planact plans: requests, planner outputs, parsed DAGs, answers, parse errors"),
		mk(StreamAct, "act.>", "planact acts: work items and outcomes"),
	}
}

// provisionPatience bounds how long provisioning retries: on a fresh
// cluster, services starting together race to create the same replicated
// streams, and a cluster still electing leaders answers with time-outs.
const provisionPatience = time.Minute

// provision creates or updates what planact needs, retrying with back-off
// while the cluster is not ready or another process provisions at once.
func (b *Bus) provision(ctx context.Context, p Provisioning) error {
	deadline := time.Now().Add(provisionPatience)
	wait := 100 * time.Millisecond
	for {
		err := b.provisionOnce(ctx, p)
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

func (b *Bus) provisionOnce(ctx context.Context, p Provisioning) error {
	p = p.withDefaults()
	for _, cfg := range p.StreamConfigs() {
		// Updating a stream that is already as wanted is not a no-op on the
		// server (it rewrites the store's config, racing with consumers
		// being created by other replicas), so only a difference is applied.
		if st, err := b.JS.Stream(ctx, cfg.Name); err == nil {
			cfg.Replicas = b.keepReplicas(cfg.Name, st.CachedInfo().Config.Replicas, cfg.Replicas)
			if sameStream(st.CachedInfo().Config, cfg) {
				continue
			}
		}
		if _, err := b.JS.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("provision stream %s: %w", cfg.Name, err)
		}
	}
	var err error
	b.Sessions, err = b.keyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         BucketSession,
		Description:    "planact rollout sessions: barrier and lifecycle, one key per rollout",
		History:        1,
		TTL:            p.SessionTTL,
		LimitMarkerTTL: time.Minute,
		Storage:        jetstream.FileStorage,
		Replicas:       p.Replicas,
	})
	if err != nil {
		return fmt.Errorf("provision kv %s: %w", BucketSession, err)
	}
	b.Runs, err = b.keyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         BucketRuns,
		Description:    "planact run state, one key per episode turn",
		History:        1,
		TTL:            p.RunTTL,
		LimitMarkerTTL: time.Minute,
		Storage:        jetstream.FileStorage,
		Replicas:       p.Replicas,
	})
	if err != nil {
		return fmt.Errorf("provision kv %s: %w", BucketRuns, err)
	}
	ocfg := jetstream.ObjectStoreConfig{
		Bucket:      ObjectResults,
		Description: "planact large payloads: results with many samples, large task lists",
		TTL:         p.ResultTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    p.Replicas,
	}
	if os, err := b.JS.ObjectStore(ctx, ObjectResults); err == nil {
		if st, err := os.Status(ctx); err == nil {
			ocfg.Replicas = b.keepReplicas(ObjectResults, st.Replicas(), ocfg.Replicas)
			if st.Description() == ocfg.Description && st.TTL() == ocfg.TTL && st.Storage() == ocfg.Storage && max(st.Replicas(), 1) == max(ocfg.Replicas, 1) {
				b.Objects = os
				return nil
			}
		}
	}
	b.Objects, err = b.JS.CreateOrUpdateObjectStore(ctx, ocfg)
	if err != nil {
		return fmt.Errorf("provision object store %s: %w", ObjectResults, err)
	}
	return nil
}

// sameStream reports whether the stream's config already holds every field
// provisioning sets.
func sameStream(have, want jetstream.StreamConfig) bool {
	return have.Description == want.Description && slices.Equal(have.Subjects, want.Subjects) &&
		have.Storage == want.Storage && have.Retention == want.Retention && have.MaxAge == want.MaxAge &&
		have.Duplicates == want.Duplicates && max(have.Replicas, 1) == max(want.Replicas, 1) &&
		have.Discard == want.Discard && have.AllowMsgSchedules == want.AllowMsgSchedules &&
		have.AllowMsgTTL == want.AllowMsgTTL
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
func (b *Bus) keyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	js := b.JS
	if kv, err := js.KeyValue(ctx, cfg.Bucket); err == nil {
		if st, err := kv.Status(ctx); err == nil {
			if kvs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
				c := kvs.StreamInfo().Config
				cfg.Replicas = b.keepReplicas(cfg.Bucket, c.Replicas, cfg.Replicas)
				if c.Description == cfg.Description && c.MaxMsgsPerSubject == int64(cfg.History) && c.MaxAge == cfg.TTL &&
					c.SubjectDeleteMarkerTTL == cfg.LimitMarkerTTL && c.Storage == cfg.Storage && max(c.Replicas, 1) == max(cfg.Replicas, 1) {
					return kv, nil
				}
			}
		}
	}
	return js.CreateOrUpdateKeyValue(ctx, cfg)
}
