package sessionstore

import (
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/telemetry"
)

// A rollout and its episodes begin and end in different messages, often in
// different processes, so their spans are recorded where they end, from the
// facts the session holds (telemetry.RecordSpan): the rollout's from its
// first arrival (the session's creation: the barrier wait is part of it) to
// its end, an episode's from the rollout's start (when its first plan
// request went out) to its end. Each is recorded after the write that
// records its end (for the rollout: the write that settles its results,
// whoever completes that), which happens once, so a span is exported once;
// a process that stops between the two loses that span.

// recordRollout exports the span of a rollout that ended.
func recordRollout(sess *schema.Session) {
	if !telemetry.TracingOn() {
		return
	}
	telemetry.RecordSpan("rollout", sess.Trace, sess.Rollout, -1, 0, time.UnixMilli(sess.CreatedMs), time.UnixMilli(sess.FinishedMs),
		telemetry.KeyRollout.Int64(sess.Rollout), telemetry.KeyStatus.String(sess.Status), attribute.String("planact.reason", sess.Reason),
		attribute.Int("planact.episodes", sess.Episodes), attribute.Int("planact.acts", sess.Acts),
		attribute.String("planact.planner.weight_version", sess.Roles[schema.RolePlanner].WeightVersion),
		attribute.String("planact.actor.weight_version", sess.Roles[schema.RoleActor].WeightVersion),
		telemetry.KeyService.String(Name))
}

// recordEpisode exports the span of an episode of sess that ended.
func recordEpisode(sess *schema.Session, e *schema.EpisodeEnd) {
	if !telemetry.TracingOn() || sess.StartedMs == 0 {
		return
	}
	telemetry.RecordSpan("episode", sess.Trace, e.Rollout, e.Episode, 0, time.UnixMilli(sess.StartedMs), time.UnixMilli(e.AtMs),
		telemetry.KeyRollout.Int64(e.Rollout), telemetry.KeyEpisode.Int(e.Episode), telemetry.KeyStatus.String(e.Status),
		attribute.Int("planact.turns", e.Turns), attribute.Int("planact.acts", len(e.Acts)), attribute.String("planact.reason", e.Reason),
		telemetry.KeyService.String(Name))
}
