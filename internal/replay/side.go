package replay

import (
	"context"
	"fmt"
	"strings"

	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/reward"
	"github.com/planact/planact/pkg/schema"
	planparser "github.com/planact/planact/services/plan-parser"
)

// Side is one planner's first turn of an episode, parsed.
type Side struct {
	Text          string `json:"text"`
	FinishReason  string `json:"finish_reason"`
	WeightVersion string `json:"weight_version,omitempty"`
	Tokens        int    `json:"tokens"`
	// Parsed is what today's plan-parser makes of it: "plan", "answer" or
	// "error"; Nodes the plan's nodes (id tool(args) <- deps), Answers the
	// answer, Error the parse error.
	Parsed  string   `json:"parsed"`
	Nodes   []string `json:"nodes,omitempty"`
	Answers []string `json:"answers,omitempty"`
	Error   string   `json:"error,omitempty"`
	// Reward of an answer against the task's label, by the rollout's
	// reward function (nil for a plan, or when a reward server scores).
	Reward *float64 `json:"reward,omitempty"`
}

// Comparison is an episode's first prompt, as the recorded planner and
// another one answered it.
type Comparison struct {
	Episode  int    `json:"episode"`
	Question string `json:"question"`
	Label    string `json:"label,omitempty"`
	Prompt   string `json:"prompt"`
	Recorded Side   `json:"recorded"`
	Other    Side   `json:"other"`
}

// SideBySide asks other (the planner engine at url, speaking protocol)
// the first prompt of each episode (all when nil) as the recording holds
// it, rendered by the planner-gateway then, with the recording's planner
// sampling, and parses both answers with today's plan-parser
// (planparser.Parse, the function the service runs).
func SideBySide(ctx context.Context, rec *Recording, episodes []int, other engine.Client, protocol string) ([]Comparison, error) {
	cfg := rec.config()
	if episodes == nil {
		for _, ep := range rec.Episodes {
			episodes = append(episodes, ep.Episode)
		}
	}
	var out []Comparison
	for _, e := range episodes {
		ep := rec.Episode(e)
		if ep == nil || e >= len(rec.Tasks) {
			return nil, fmt.Errorf("rollout %d has no episode %d", rec.Rollout, e)
		}
		if len(ep.Trajectory) == 0 || ep.Trajectory[0].Kind != schema.SegPrompt {
			return nil, fmt.Errorf("episode %d: the recording holds no first prompt (the episode never asked its planner)", e)
		}
		task := rec.Tasks[e]
		c := Comparison{Episode: e, Question: task.Prompt, Label: task.Label, Prompt: ep.Trajectory[0].Text}
		for _, seg := range ep.Trajectory {
			if seg.Kind == schema.SegGenerated && seg.Turn == 1 {
				c.Recorded = side(cfg, task, seg.Text, firstFinish(ep), seg.Version, len(seg.IDs))
				break
			}
		}
		g, err := ask(ctx, other, protocol, c.Prompt, cfg)
		if err != nil {
			return nil, fmt.Errorf("episode %d: the other planner: %w", e, err)
		}
		c.Other = side(cfg, task, g.Text, g.FinishReason, g.WeightVersion, len(g.OutputIDs))
		out = append(out, c)
	}
	return out, nil
}

func firstFinish(ep *Episode) string {
	if len(ep.Turns) > 0 {
		return ep.Turns[0].FinishReason
	}
	return ""
}

// ask generates the planner's first turn from prompt with the rollout's
// planner sampling, tokenized by the other engine itself (its tokenizer
// may not be the recorded one's), or as one user message to a chat engine.
func ask(ctx context.Context, c engine.Client, protocol, prompt string, cfg schema.Config) (engine.Generation, error) {
	t, p := cfg.PlannerSampling.Values()
	r := engine.Request{Text: prompt, Sampling: engine.Sampling{Temperature: t, TopP: p, MaxNewTokens: cfg.PlannerSampling.MaxNewTokens, Stop: cfg.PlannerSampling.Stop}}
	if protocol == engine.ProtocolOpenAIChat {
		r.Messages = []engine.Message{{Role: engine.RoleUser, Text: prompt}}
		return c.Generate(ctx, r)
	}
	ids, err := c.Tokenize(ctx, prompt)
	if err != nil {
		return engine.Generation{}, err
	}
	r.InputIDs = ids
	return c.Generate(ctx, r)
}

func side(cfg schema.Config, task schema.Task, text, finish, version string, tokens int) Side {
	s := Side{Text: text, FinishReason: finish, WeightVersion: version, Tokens: tokens}
	switch m := planparser.Parse(&schema.PlanOutput{Text: text, FinishReason: finish}, cfg).(type) {
	case *schema.PlanDAG:
		s.Parsed = "plan"
		for _, n := range m.Plan.Nodes {
			node := fmt.Sprintf("%s %s(%s)", n.ID, n.Tool, args(n.Args))
			if len(n.Deps) > 0 {
				node += " <- " + strings.Join(n.Deps, ", ")
			}
			s.Nodes = append(s.Nodes, node)
		}
	case *schema.PlanAnswer:
		s.Parsed, s.Answers = "answer", m.Answers
		answer := strings.Join(m.Answers, " | ")
		switch cfg.Reward {
		case "f1":
			v := reward.F1(answer, task.Label)
			s.Reward = &v
		case "em":
			v := reward.ExactMatch(answer, task.Label)
			s.Reward = &v
		}
	case *schema.PlanError:
		s.Parsed, s.Error = "error", m.ErrorKind+": "+m.Message
	}
	return s
}

func args(a map[string]any) string {
	if len(a) == 1 {
		for _, v := range a {
			return fmt.Sprintf("%q", fmt.Sprint(v))
		}
	}
	return jsonOf(a)
}
