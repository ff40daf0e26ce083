package client

import (
	"context"
	"fmt"
	"time"

	"github.com/planact/planact/pkg/schema"
)

// Evaluate runs an evaluation rollout: a rollout that yields metrics, not
// samples. The arrival that brings the config or the tasks (inline, or as
// a tasks_object) has its config's evaluation set; the other role's
// arrival brings none and gets the same result. The result carries the
// stats (Stats.Datasets per dataset, when the tasks name theirs with
// Task.Dataset) and every episode's outcome (Result.Episodes), no samples. A result that is not an
// evaluation's (the config that won did not ask for one) is an error.
// Statuses and errors are Rollout's.
func (c *Client) Evaluate(ctx context.Context, a *schema.Arrive, timeout time.Duration) (*schema.Result, error) {
	if a.Config != nil || len(a.Tasks) > 0 || a.TasksObject != "" {
		cp := *a
		cfg := schema.Config{}
		if a.Config != nil {
			cfg = *a.Config
		}
		cfg.Evaluation = true
		cp.Config = &cfg
		a = &cp
	}
	res, err := c.Rollout(ctx, a, timeout)
	if err != nil {
		return res, err
	}
	if !res.Evaluation {
		return res, fmt.Errorf("%w: rollout %d is not an evaluation (the config that won, the planner's, did not set evaluation): it delivered %d samples",
			ErrRejected, a.Rollout, len(res.Samples))
	}
	return res, nil
}
