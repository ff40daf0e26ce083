package sim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/reward"
)

// TestPlanParserContract plays whole episodes with pkg/plan parsing the
// simulated planner's output, as the plan-parser service does.
func TestPlanParserContract(t *testing.T) {
	w := DefaultWorld()
	ctx := context.Background()
	for _, stepwise := range []float64{0, 1} {
		planner := New(Config{Role: RolePlanner, Seed: 2, PlannerStepwise: stepwise})
		actor := New(Config{Role: RoleActor, Seed: 2})
		for _, format := range Formats {
			for _, task := range w.Tasks(len(questionKinds), 11) {
				t.Run(fmt.Sprintf("stepwise=%v/%s/%s", stepwise, format, task.Kind), func(t *testing.T) {
					prompt := plannerPromptText(task.Question, format)
					for turn := 1; turn <= 6; turn++ {
						out, err := planner.generate(ctx, promptFromText(prompt), nil)
						if err != nil {
							t.Fatal(err)
						}
						prompt += out.text + "\n"
						for _, opts := range []plan.Options{{Tools: []string{"search"}}, {Format: plan.Format(format), Tools: []string{"search"}}} {
							res, err := plan.Parse(out.text, opts)
							if err != nil {
								t.Fatalf("turn %d: parse (%+v): %v\n%s", turn, opts, err, out.text)
							}
							if res.Plan != nil && res.Plan.Format != plan.Format(format) {
								t.Errorf("detected %q, want %q", res.Plan.Format, format)
							}
						}
						res, _ := plan.Parse(out.text, plan.Options{Tools: []string{"search"}})
						if len(res.Answers) > 0 {
							if reward.ExactMatch(res.Answers[0], task.Label) != 1 {
								t.Fatalf("answer %v, label %q\n%s", res.Answers, task.Label, prompt)
							}
							return
						}
						outputs := map[string]string{}
						var obs strings.Builder
						obs.WriteString("<observation>\n")
						for _, n := range res.Plan.Nodes {
							input := plan.Substitute(n, outputs).Input()
							g, err := actor.generate(ctx, promptFromText("Tool: "+n.Tool+"\nInput: "+input+"\n"), nil)
							if err != nil {
								t.Fatal(err)
							}
							outputs[n.ID] = g.text
							fmt.Fprintf(&obs, "%s %s(%q) -> %s\n", n.ID, n.Tool, input, g.text)
						}
						obs.WriteString("</observation>\n")
						prompt += obs.String()
					}
					t.Fatalf("no answer:\n%s", prompt)
				})
			}
		}
	}
}

// TestPlanFaultsAgainstParser checks that each plan fault is the parse or
// validation error it is meant to be.
func TestPlanFaultsAgainstParser(t *testing.T) {
	ctx := context.Background()
	for _, format := range Formats {
		for _, tc := range []struct {
			marker string
			kinds  []plan.ErrorKind // any of these
		}{
			{FaultMalformedPlan, nil},
			{FaultTruncatedPlan, nil},
			{FaultCyclicPlan, []plan.ErrorKind{plan.ErrCycle}},
			{FaultToolInvalid, []plan.ErrorKind{plan.ErrUnknownTool}},
		} {
			for _, q := range []string{"What is the population of the capital of France? ",
				"Which capital has the smaller population, the capital of Peru or the capital of Chile? "} {
				t.Run(format+"/"+tc.marker+"/"+q[:12], func(t *testing.T) {
					e := New(Config{Role: RolePlanner, Seed: 1})
					out, err := e.generate(ctx, promptFromText(plannerPromptText(q+tc.marker, format)), nil)
					if err != nil {
						t.Fatal(err)
					}
					_, perr := plan.Parse(out.text, plan.Options{Format: plan.Format(format), Tools: []string{"search"}})
					if perr == nil {
						t.Fatalf("parsed without error:\n%s", out.text)
					}
					var pe *plan.Error
					if !errors.As(perr, &pe) {
						t.Fatalf("error %T %v", perr, perr)
					}
					if tc.kinds != nil && !containsKind(tc.kinds, pe.Kind) {
						t.Errorf("error kind %q (%v), want %v\n%s", pe.Kind, perr, tc.kinds, out.text)
					}
				})
			}
		}
	}
}

func containsKind(ks []plan.ErrorKind, k plan.ErrorKind) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}
