package plannergateway

import (
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/schema"
)

// RenderPrompt is the plan_act planner's first-turn prompt: the task, the
// tools, the plan format and how to answer (mode.PlanAct.PlannerPrompt; a
// rollout's mode renders its own). Later turns append observations to the
// token trajectory instead of re-rendering.
func RenderPrompt(task schema.Task, cfg schema.Config) string {
	return mode.PlanAct{}.PlannerPrompt(task, cfg)
}
