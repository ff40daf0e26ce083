// Package planact runs planact's services in a program of your own: a main
// that registers its own tools (pkg/tool), plan formats
// (plan.RegisterFormat) and reward functions (reward.Register), and then
// serves, in one process or as one service per process, exactly as
// `planact up` and `planact serve` do. examples/custom is such a main.
//
// Register before Serve, in every process whose services use what you
// register: the session-store checks a rollout's config at arrival (plan
// formats, rewards) and scores its answers (rewards); the plan-parser and
// the planner-gateway read plan formats; the act-dispatcher calls Go tools.
package planact

import (
	"context"

	"github.com/planact/planact/internal/stack"
)

// Options are how the services connect and run (those of `planact up`).
type Options = stack.Options

// Services names every service, in the order `planact up` starts them.
var Services = stack.Services

// Serve runs the named services (Services for all) until ctx ends or one
// fails. With o.Provision it first creates what planact keeps in JetStream,
// as `planact up` does in process; otherwise `planact provision` must have.
func Serve(ctx context.Context, names []string, o Options) error {
	return stack.Serve(ctx, names, o)
}

// WaitReady returns once every named service answers on the bus.
func WaitReady(ctx context.Context, o Options, names []string) error {
	return stack.WaitReady(ctx, o.Conn, names)
}
