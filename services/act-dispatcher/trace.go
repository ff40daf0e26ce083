package actdispatcher

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// recordTurn exports the span of a turn that is over, decided by how
// (plan, answer, error). A turn begins when its plan request is stored and
// ends here, in whichever replica decides it, so its span is recorded from
// those facts (telemetry.RecordSpan): the request's stored time is read back
// only when tracing is on. A turn decided again (its message redelivered)
// finds the next turn's request stored, or the episode over, and records
// nothing more; only an answer or error handled twice before anything
// follows it records its turn twice, with the same span id.
func (s *Service) recordTurn(ctx context.Context, info *session.Info, n int64, e, turn int, outcome string, attrs ...attribute.KeyValue) {
	if !telemetry.TracingOn() {
		return
	}
	m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanReq(n, e))
	if err != nil || m == nil {
		return
	}
	var req schema.PlanRequest
	if schema.Unmarshal(m.Data, &req) != nil || req.Turn != turn {
		return
	}
	attrs = append(attrs, telemetry.KeyRollout.Int64(n), telemetry.KeyEpisode.Int(e), telemetry.KeyTurn.Int(turn),
		telemetry.KeyRole.String(schema.RolePlanner), attribute.String("planact.outcome", outcome),
		telemetry.KeyWeightVersion.String(req.WeightVersion), telemetry.KeyReplica.String(s.replicaName()),
		telemetry.KeyService.String(Name))
	telemetry.RecordSpan("turn", info.Session.Trace, n, e, turn, m.Time, time.Now(), attrs...)
}
