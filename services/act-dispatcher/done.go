package actdispatcher

import (
	"context"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
)

// record writes an act's outcome into its turn's run state, releases what
// it unblocks, and finishes the turn when it was the last node. The
// compare-and-set write makes exactly one writer see the turn finish. When
// the outcome was recorded already (a redelivery, a re-issue), it publishes
// again what the run state implies, in case a crash came between that write
// and its publishes; message ids make that idempotent.
func (s *Service) record(ctx context.Context, info *session.Info, d *schema.ActDone) error {
	if d.Status == schema.ActCached {
		return nil // written in the run state before it was published
	}
	policy := info.Session.Config.FailurePolicy
	prior, err := s.priorActs(ctx, d.Rollout, d.Episode, d.Turn)
	if err != nil {
		return err
	}
	var newly, cached []*schema.NodeState
	var finishedNow bool
	key := schema.RunKey(d.Rollout, d.Episode, d.Turn)
	run, wrote, err := bus.Mutate(ctx, s.Bus.Runs, key, func(r *schema.Run, exists bool) (bool, error) {
		newly, cached, finishedNow = nil, nil, false
		n := byKey(r, d.Key)
		if !exists || n == nil || n.Terminal() || r.Finished {
			return false, nil // recorded already, or a turn already over
		}
		n.Status, n.Output, n.Error, n.ErrorKind = d.Status, d.Output, d.Error, d.ErrorKind
		cached = resolveWaiters(r, n)
		if n.Status == schema.NodeFailed && policy != schema.PolicySkip {
			skipPending(r, "not run: the turn stopped after "+n.Node.ID+" failed")
		}
		var more []*schema.NodeState
		newly, more = advance(r, prior)
		cached = append(cached, more...)
		if r.Complete && allTerminal(r) {
			r.Finished, finishedNow = true, true
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	return s.publishOutcome(ctx, info, &run, newly, cached, finishedNow, !wrote)
}

func nowMs() int64 { return time.Now().UnixMilli() }
