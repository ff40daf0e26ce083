package mode

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/reward"
	"github.com/planact/planact/pkg/schema"
)

// Ensemble is the ensemble mode: Plan/Act, but every act of the actor model
// is asked ensemble_k times. The plan's node X becomes K candidate nodes
// X-c1…X-cK (the same call, each its own generation) and a pick node X
// that depends on them: a vote among the candidates that answered (the
// most frequent answer, normalised; a tie goes to the earliest candidate;
// an empty answer has no vote, and a vote among empty answers only fails,
// as the step fails when every candidate did), run by the act-dispatcher
// without an engine once every candidate has ended. Nodes that
// depend on X get the answer picked; the planner sees one line per planned
// node, as in plan_act.
//
// With ensemble_pick planner there is no vote: the planner picks. A turn's
// candidates finish; the planner's next observation shows each of them
// (X-c1 … like any node) and, per planned node, the candidates it may pick
// (<candidates node="X" turn="t">1 2 3</candidates>: those that answered,
// an empty answer being none);
// its next reply starts with one <pick node="X">N</pick> per such node,
// then its plan or answer (pick.go). A node of the actor model
// cannot feed another in the same plan then (its answer is picked only in
// the next turn): such a plan is a parse error.
//
// Every candidate is an actor sample. A candidate whose answer is the one
// picked gets the final answer's score (metadata ensemble: chosen for the
// candidate the vote or the planner took, agreed for the others with the
// same answer); a rejected one (an empty one too) gets 0, as does every
// candidate of a step nothing was picked for. The planner's sample is
// rewarded as in plan_act (with ensemble_pick planner it holds its picks).
type Ensemble struct{ PlanAct }

// VoteTool is the pick nodes' tool: run by the act-dispatcher, no engine.
const VoteTool = "vote"

// CandidateArg is the argument that marks a candidate (Expand's), with its
// number; a plan may not use it.
const CandidateArg = "ensemble_candidate"

// KindLocal is the kind of a tool a mode runs itself (Mode.RunLocal).
const KindLocal = "local"

// Name is ensemble.
func (Ensemble) Name() string { return schema.ModeEnsemble }

// ParseNeedsObservation: the planner's picks are checked against the
// candidates its observation offered.
func (Ensemble) ParseNeedsObservation(cfg schema.Config) bool {
	return cfg.EnsemblePick == schema.EnsemblePickPlanner
}

// Parse parses the plan as plan_act does, and expands each act of the
// actor model into its candidates and their vote. With ensemble_pick
// planner it first reads the planner's picks (pickParse).
func (m Ensemble) Parse(ctx context.Context, out *schema.PlanOutput, observation string, cfg schema.Config) (schema.Message, error) {
	if cfg.EnsemblePick == schema.EnsemblePickPlanner {
		return m.pickParse(ctx, out, observation, cfg)
	}
	msg, err := m.PlanAct.Parse(ctx, out, observation, cfg)
	if d, ok := msg.(*schema.PlanDAG); ok && err == nil {
		if pe := reserved(out, d.Plan.Nodes); pe != nil {
			return pe, nil
		}
		d.Plan.Nodes = Expand(d.Plan.Nodes, cfg)
	}
	return msg, err
}

// reserved is the parse error of a plan that uses the argument marking
// candidates (a candidate is then never taken for a planned node, nor a
// planned node for a candidate), or nil.
func reserved(out *schema.PlanOutput, nodes []plan.Node) *schema.PlanError {
	for _, n := range nodes {
		if _, ok := n.Args[CandidateArg]; ok {
			return &schema.PlanError{Rollout: out.Rollout, Episode: out.Episode, Turn: out.Turn, ErrorKind: string(plan.ErrSyntax), FinishReason: out.FinishReason,
				Message: fmt.Sprintf("node %s has an argument %q, a name planact keeps for ensemble candidates; name the argument otherwise", n.ID, CandidateArg)}
		}
	}
	return nil
}

// isCandidate says whether n is a candidate Expand made: its id is X-cN
// and its CandidateArg is N.
func isCandidate(n plan.Node) bool {
	_, number, ok := candidateOf(n.ID)
	if !ok {
		return false
	}
	// Read back from the wire (JSON, msgpack) the number is of any type.
	switch v := reflect.ValueOf(n.Args[CandidateArg]); v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int() == int64(number)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return v.Uint() == uint64(number)
	case reflect.Float32, reflect.Float64:
		return v.Float() == float64(number)
	}
	return false
}

// Expand turns every node of the actor model into K candidates and a vote
// of the same id (with ensemble_pick planner, no vote: the planner picks
// in its next turn).
func Expand(nodes []plan.Node, cfg schema.Config) []plan.Node {
	k := max(cfg.EnsembleK, 1)
	taken := map[string]bool{}
	for _, n := range nodes {
		taken[n.ID] = true
	}
	var out []plan.Node
	for _, n := range nodes {
		if !multiplied(cfg, n.Tool) {
			out = append(out, n)
			continue
		}
		var refs []any
		var ids []string
		for i := 1; i <= k; i++ {
			id := fmt.Sprintf("%s-c%d", n.ID, i)
			for taken[id] {
				id += "_"
			}
			taken[id] = true
			c := n
			c.ID = id
			c.Args = make(map[string]any, len(n.Args)+1)
			for a, v := range n.Args {
				c.Args[a] = v
			}
			c.Args[CandidateArg] = i // marks it, and makes it a call of its own: the duplicate guard keeps candidates apart
			c.Description = fmt.Sprintf("candidate %d of %d of %s", i, k, n.ID)
			out = append(out, c)
			refs = append(refs, "${"+id+"}") // ${…} names any id: "{1-c1}" would be text
			ids = append(ids, id)
		}
		if cfg.EnsemblePick == schema.EnsemblePickPlanner {
			continue
		}
		out = append(out, plan.Node{
			ID: n.ID, Tool: VoteTool, Deps: ids, Description: "vote among the candidates of " + n.ID,
			Args: map[string]any{"input": n.Input(), "tool": n.Tool, "candidates": refs},
		})
	}
	return out
}

// multiplied says whether an act of tool is asked ensemble_k times: only
// the actor model's are. An HTTP or Go tool answers the same call the same
// way, and a Go tool may act on the world: it runs once, as in plan_act.
func multiplied(cfg schema.Config, tool string) bool {
	t, ok := cfg.Tool(tool)
	return ok && t.Kind == schema.ToolActor
}

// Tool adds the vote to the rollout's tools.
func (m Ensemble) Tool(cfg schema.Config, name string) (schema.Tool, bool) {
	if name == VoteTool {
		return schema.Tool{Name: VoteTool, Description: "the most frequent answer of the candidates", Kind: KindLocal}, true
	}
	return cfg.Tool(name)
}

// RunLocal runs a vote: the most frequent candidate answer (normalised), a
// tie to the earliest. A candidate that failed has no vote (VoteAmong), nor
// has an empty answer: when every answer is empty the vote fails, as the
// step does when every candidate failed.
func (Ensemble) RunLocal(_ schema.Tool, node Node) (string, error) {
	cands, _ := node.Args["candidates"].([]any)
	var answers []string
	for _, c := range cands {
		if s, ok := c.(string); ok {
			answers = append(answers, s)
		}
	}
	if len(answers) == 0 {
		return "", fmt.Errorf("vote %s: no candidate answers", node.ID)
	}
	best := Vote(answers)
	if best < 0 {
		all := fmt.Sprintf("all %d", len(answers))
		if failed := len(cands) - len(answers); failed > 0 {
			all = fmt.Sprintf("all %d that answered; %d failed", len(answers), failed)
		}
		return "", fmt.Errorf("vote %s: the candidates' answers were empty (%s): there is no answer to pick", node.ID, all)
	}
	return answers[best], nil
}

// IsVote says whether n is a vote as Expand writes it: tool vote, its
// candidates' placeholders its dependencies, one each, in order (before
// they are replaced by the candidates' answers).
func IsVote(n plan.Node) bool {
	cands, ok := n.Args["candidates"].([]any)
	if n.Tool != VoteTool || !ok || len(cands) != len(n.Deps) || len(cands) == 0 {
		return false
	}
	for i, c := range cands {
		if c != "${"+n.Deps[i]+"}" {
			return false
		}
	}
	return true
}

// VoteAmong is the vote n (IsVote) among the candidates answered says
// answered: the others' places in its arguments are nil, no answer, where
// their placeholders would otherwise be left as they read (a candidate
// that failed has no output to put there).
func VoteAmong(n plan.Node, answered func(id string) bool) plan.Node {
	cands, _ := n.Args["candidates"].([]any)
	kept := make([]any, len(cands))
	for i, c := range cands {
		if i < len(n.Deps) && answered(n.Deps[i]) {
			kept[i] = c
		}
	}
	out := n
	out.Args = make(map[string]any, len(n.Args))
	for a, v := range n.Args {
		out.Args[a] = v
	}
	out.Args["candidates"] = kept
	return out
}

// StepOf says whether n is a candidate (Expand's X-cN) and of which
// planned step (X).
func StepOf(n plan.Node) (step string, ok bool) {
	if !isCandidate(n) {
		return "", false
	}
	step, _, _ = candidateOf(n.ID)
	return step, true
}

// Vote returns the index of the answer the vote picks: the most frequent
// (normalised), the earliest of a tie. An empty (or white space) answer is
// no answer: it has no vote and is never picked; Vote returns -1 when
// every answer is empty.
func Vote(answers []string) int {
	count := map[string]int{}
	for _, a := range answers {
		if !NoAnswer(a) {
			count[reward.Normalize(a)]++
		}
	}
	best := -1
	for i, a := range answers {
		if NoAnswer(a) {
			continue
		}
		if best < 0 || count[reward.Normalize(a)] > count[reward.Normalize(answers[best])] {
			best = i
		}
	}
	return best
}

// NoAnswer says whether a candidate's answer is empty: nothing, or only
// white space. Normalised, a real answer may be empty too ("."), so an
// empty one must never be taken to agree with it.
func NoAnswer(s string) bool { return strings.TrimSpace(s) == "" }

// Observation shows each planned node once: the votes, as the call
// planned, with the answer picked; candidates are not shown. With
// ensemble_pick planner it shows every candidate and what is to be picked
// (pickObservation).
func (m Ensemble) Observation(r *schema.Run, cfg schema.Config) string {
	if cfg.EnsemblePick == schema.EnsemblePickPlanner {
		return m.pickObservation(r, cfg)
	}
	shown := *r
	shown.Nodes = nil
	for _, n := range r.Nodes {
		if isCandidate(n.Node) {
			continue
		}
		if n.Node.Tool == VoteTool {
			c := *n
			c.Node.Tool, _ = n.Node.Args["tool"].(string)
			c.Input, _ = n.Node.Args["input"].(string)
			n = &c
		}
		shown.Nodes = append(shown.Nodes, n)
	}
	return m.PlanAct.Observation(&shown, cfg)
}

// Rewards: a candidate whose answer is the one picked gets the final
// answer's score, a rejected one 0.
func (Ensemble) Rewards(ep *Episode) {
	picks := map[string]*schema.ActDone{} // turn/pick id -> the vote's outcome, or the candidate the planner picked
	if ep.Config.EnsemblePick == schema.EnsemblePickPlanner {
		picks = plannerPicks(ep)
	}
	for _, d := range ep.Outcomes {
		if d.Tool == VoteTool {
			picks[strconv.Itoa(d.Turn)+"/"+d.NodeID] = d
		}
	}
	first := map[string]int{} // turn/pick id -> the candidate chosen: the earliest agreeing (the one the vote took), or the planner's
	byPlanner := ep.Config.EnsemblePick == schema.EnsemblePickPlanner
	if byPlanner {
		for key, d := range picks {
			if _, number, ok := candidateOf(d.NodeID); ok {
				first[key] = number
			}
		}
	} else {
		// The vote took the earliest candidate agreeing with it among all
		// that answered: one answered from the cache (no sample) too, so
		// that a later one with a sample is not called chosen.
		for _, d := range ep.Outcomes {
			pick, number, ok := candidateOf(d.NodeID)
			if !ok || !ofActor(ep.Config, d) || d.Status != schema.ActDoneOK && d.Status != schema.ActCached || NoAnswer(d.Output) {
				continue
			}
			key := strconv.Itoa(d.Turn) + "/" + pick
			if p := picks[key]; p != nil && reward.Normalize(d.Output) == reward.Normalize(p.Output) {
				if f, seen := first[key]; !seen || number < f {
					first[key] = number
				}
			}
		}
	}
	verdicts := make([]string, len(ep.Actor))
	for i := range ep.Actor {
		d := ep.Acts[i]
		pick, number, ok := candidateOf(d.NodeID)
		if !ok {
			continue
		}
		key := strconv.Itoa(d.Turn) + "/" + pick
		p := picks[key]
		s := &ep.Actor[i]
		switch {
		case p == nil || p.Status != schema.ActDoneOK && p.Status != schema.ActCached || NoAnswer(p.Output):
			// Nothing was picked: every candidate failed or answered
			// nothing (a vote recorded before an empty answer was none
			// may have "picked" ""), or the planner never judged.
			s.Reward, verdicts[i] = 0, "unpicked"
		case NoAnswer(d.Output):
			s.Reward, verdicts[i] = 0, "rejected" // no answer agrees with the one picked
		case reward.Normalize(d.Output) == reward.Normalize(p.Output):
			verdicts[i] = "agreed"
			if f, seen := first[key]; !byPlanner && (!seen || number < f) {
				first[key] = number // Outcomes left it out (a caller that gave none)
			}
		default:
			s.Reward, verdicts[i] = 0, "rejected"
		}
	}
	for i := range ep.Actor {
		if verdicts[i] == "" {
			continue
		}
		d := ep.Acts[i]
		pick, number, _ := candidateOf(d.NodeID)
		if verdicts[i] == "agreed" && first[strconv.Itoa(d.Turn)+"/"+pick] == number {
			verdicts[i] = "chosen"
		}
		s := &ep.Actor[i]
		if s.Metadata == nil {
			s.Metadata = map[string]any{}
		}
		s.Metadata["ensemble"] = verdicts[i]
	}
}

// ofActor says whether outcome d may be a candidate's: an act of the
// actor model. A planned node of another tool may have an id that reads as
// a candidate's (an HTTP tool's "X-c1" beside the candidates X-c1_, X-c2
// …), and so may a vote (of a planned node "X-c1"): outcomes carry no
// arguments to tell them apart (isCandidate).
func ofActor(cfg schema.Config, d *schema.ActDone) bool {
	t, ok := cfg.Tool(d.Tool)
	return d.Tool != VoteTool && (!ok || t.Kind == schema.ToolActor)
}

// candidateOf reads a candidate's node id (Expand's): its pick's id and its
// number.
func candidateOf(id string) (pick string, number int, ok bool) {
	cut := strings.LastIndex(id, "-c")
	if cut < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(strings.TrimRight(id[cut+2:], "_"))
	if err != nil {
		return "", 0, false
	}
	return id[:cut], n, true
}
