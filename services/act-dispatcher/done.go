package actdispatcher

import (
	"context"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// handleDone records an act's outcome in the run state, releases what it
// unblocks, and finishes the turn when it was the last node. The
// compare-and-set write makes exactly one replica see the turn finish.
func (s *Service) handleDone(ctx context.Context, m bus.Msg) error {
	var d schema.ActDone
	if err := m.Decode(&d); err != nil {
		return err
	}
	info, ctx, err := s.info(ctx, d.Rollout)
	if err != nil || info == nil {
		return err
	}
	if d.Status == schema.ActCached {
		return nil // published by the dispatcher itself after it wrote the run
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
			return false, nil // a duplicate outcome, or a turn already over
		}
		n.Status, n.Output, n.Error = d.Status, d.Output, d.Error
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
	return s.publishOutcome(ctx, info, &run, newly, cached, finishedNow, !wrote && m.Delivered > 1)
}

func nowMs() int64 { return time.Now().UnixMilli() }
