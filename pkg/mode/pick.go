package mode

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/planact/planact/pkg/schema"
)

// The planner as ensemble's judge (ensemble_pick planner). A turn's
// candidates finish and no vote runs; the planner's next observation shows
// every candidate as a node (X-c1 search("…") -> …) and ends with what is
// to be picked:
//
//	Pick one candidate of each step: <candidates node="X" turn="2">1 3</candidates> …
//
// (the candidates that answered, an empty answer being none; a step none
// of whose candidates answered is not listed). The planner's reply starts
// with one <pick node="X">N</pick> per step listed (outside <think>), then
// its plan or answer. A reply that picks nothing, picks twice, picks a
// candidate not offered, or picks for a step not listed is a parse error
// (kind pick) under parse_error_policy; a parse error's message repeats
// what is still to be picked, so a reprompt shows it again. The picks are the planner's output, recorded in its
// trajectory: Rewards reads them back from it (plannerPicks).

// pickIntro tells the planner that it judges.
const pickIntro = `Each step the actor carries out is answered several times. Your next <observation> shows every candidate answer (<id>-c1, <id>-c2, …) and lists, for each step, the candidates you may pick. Start your next reply with one <pick node="<id>">N</pick> for each step listed, choosing its best candidate, then write your plan or answer. A step cannot use the result of such a step in the same plan: plan it after you picked.
`

var (
	candidatesRe = regexp.MustCompile(`<candidates node="([^"<>]+)" turn="(\d+)">([\d ]*)</candidates>`)
	pickRe       = regexp.MustCompile(`<pick\s+node="([^"<>]*)"\s*>\s*(\d+)\s*</pick>`)
	anyPickRe    = regexp.MustCompile(`(?s)<pick\b[^>]*>.*?</pick>`)
)

// pending is one step whose candidates the planner is to pick from.
type pending struct {
	Node    string
	Turn    int
	Allowed []int // the candidates that answered, by number
}

// PlannerPrompt is plan_act's, with ensemble_pick planner telling the
// planner that it picks.
func (m Ensemble) PlannerPrompt(task schema.Task, cfg schema.Config) string {
	p := m.PlanAct.PlannerPrompt(task, cfg)
	if cfg.EnsemblePick != schema.EnsemblePickPlanner {
		return p
	}
	intro, rest, _ := strings.Cut(p, "\n")
	return intro + "\n" + pickIntro + rest
}

// pickObservation shows every node of the turn, candidates included, and
// what is to be picked.
func (m Ensemble) pickObservation(r *schema.Run, cfg schema.Config) string {
	obs := strings.TrimSuffix(m.PlanAct.Observation(r, cfg), "</observation>\n")
	var todo []pending
	at := map[string]int{}
	for _, n := range r.Nodes {
		if !isCandidate(n.Node) {
			continue
		}
		pick, number, _ := candidateOf(n.Node.ID)
		if n.Status != schema.NodeDone && n.Status != schema.NodeCached || NoAnswer(n.Output) {
			continue // failed, or answered nothing: no answer to pick
		}
		i, seen := at[pick]
		if !seen {
			i = len(todo)
			at[pick] = i
			todo = append(todo, pending{Node: pick, Turn: r.Turn})
		}
		todo[i].Allowed = append(todo[i].Allowed, number)
	}
	if len(todo) > 0 {
		obs += pickLead + renderPending(todo) + "\n"
	}
	return obs + "</observation>\n"
}

// renderPending writes what is to be picked, on one line.
func renderPending(todo []pending) string {
	var b strings.Builder
	for _, p := range todo {
		nums := make([]string, len(p.Allowed))
		for i, n := range p.Allowed {
			nums[i] = strconv.Itoa(n)
		}
		fmt.Fprintf(&b, ` <candidates node=%q turn="%d">%s</candidates>`, p.Node, p.Turn, strings.Join(nums, " "))
	}
	return b.String()
}

// The words before what is to be picked: in an observation
// (pickObservation) and in a parse error's (pickParse).
const (
	pickLead  = "Pick one candidate of each step:"
	againLead = "still to pick, before your plan or answer:"
)

// pendingOf reads what an observation asks to be picked: the last list
// planact wrote, a line that starts with pickLead (pickObservation) or a
// parse error's message that ends with againLead (pickParse), followed by
// nothing but <candidates> tags to the end of its line. Anything else is
// what a node returned, an act's error, or the planner's own text quoted
// (outputs and errors are kept on their line, after the node's call): a
// <candidates> tag there must not decide what the planner may pick.
func pendingOf(observation string) []pending {
	lists := pendingRe.FindAllStringSubmatch(observation, -1)
	if len(lists) == 0 {
		return nil
	}
	var todo []pending
	seen := map[string]bool{}
	for _, m := range candidatesRe.FindAllStringSubmatch(lists[len(lists)-1][1], -1) {
		turn, _ := strconv.Atoi(m[2])
		if seen[m[2]+"/"+m[1]] {
			continue
		}
		seen[m[2]+"/"+m[1]] = true
		p := pending{Node: m[1], Turn: turn}
		for f := range strings.FieldsSeq(m[3]) {
			if n, err := strconv.Atoi(f); err == nil {
				p.Allowed = append(p.Allowed, n)
			}
		}
		todo = append(todo, p)
	}
	return todo
}

// pendingRe is a list of candidates planact wrote (pendingOf).
var pendingRe = regexp.MustCompile(`(?m)(?:^` + regexp.QuoteMeta(pickLead) + `|; ` + regexp.QuoteMeta(againLead) + `)((?: ` + candidatesRe.String() + `)+)\r?$`)

// Picks reads a reply's picks: node -> every number written for it, in
// order. What is in <think> does not count (a <think> never closed, to the
// end; before a lone </think>, everything).
func Picks(text string) map[string][]int {
	text = outsideThink(text)
	picks := map[string][]int{}
	for _, m := range pickRe.FindAllStringSubmatch(text, -1) {
		n, err := strconv.Atoi(m[2])
		if err != nil {
			continue
		}
		picks[m[1]] = append(picks[m[1]], n)
	}
	return picks
}

// badPicks lists the <pick> tags of a reply (outside <think>) that are not
// <pick node="X">N</pick> with N a number Picks reads: a pick the planner
// wrote and Picks cannot read is a mistake to tell it of, not a pick to
// drop unsaid.
func badPicks(text string) []string {
	var bad []string
	for _, tag := range anyPickRe.FindAllString(outsideThink(text), -1) {
		m := pickRe.FindStringSubmatch(tag)
		if m != nil && m[0] == tag {
			if _, err := strconv.Atoi(m[2]); err == nil {
				continue
			}
		}
		bad = append(bad, tag)
	}
	return bad
}

// stripPicks takes a reply's <pick> tags out of what it wrote outside
// <think>, leaving what it thought as it was: a tag the planner opened in
// its thoughts must not run on to a pick after them and swallow the
// </think> in between (the plan or answer would then be thought, not
// written).
func stripPicks(text string) string {
	var b strings.Builder
	if c, o := unthinkRe.FindStringIndex(text), thinkRe.FindStringIndex(text); c != nil && (o == nil || c[0] < o[0]) {
		b.WriteString(text[:c[1]]) // thought in a block the chat template opened
		text = text[c[1]:]
	}
	for {
		o := thinkRe.FindStringIndex(text)
		if o == nil {
			b.WriteString(anyPickRe.ReplaceAllString(text, ""))
			return b.String()
		}
		b.WriteString(anyPickRe.ReplaceAllString(text[:o[0]], ""))
		c := unthinkRe.FindStringIndex(text[o[1]:])
		if c == nil {
			b.WriteString(text[o[0]:])
			return b.String()
		}
		b.WriteString(text[o[0] : o[1]+c[1]])
		text = text[o[1]+c[1]:]
	}
}

// validPick is the one candidate a reply picks for p, if it picks one
// that was offered and only that one.
func validPick(p pending, written []int) (int, bool) {
	if len(written) == 0 {
		return 0, false
	}
	for _, n := range written[1:] {
		if n != written[0] {
			return 0, false
		}
	}
	return written[0], slices.Contains(p.Allowed, written[0])
}

// pickProblems says what is wrong with a reply's picks, "" when nothing.
func pickProblems(todo []pending, text string) string {
	picks := Picks(text)
	var problems []string
	want := map[string]bool{}
	for _, p := range todo {
		want[p.Node] = true
		written := picks[p.Node]
		if _, ok := validPick(p, written); ok {
			continue
		}
		allowed := strings.Trim(fmt.Sprint(p.Allowed), "[]")
		switch {
		case len(written) == 0:
			problems = append(problems, fmt.Sprintf("no <pick node=%q>N</pick> for step %s (candidates %s)", p.Node, p.Node, allowed))
		case len(slices.Compact(slices.Sorted(slices.Values(written)))) > 1:
			problems = append(problems, fmt.Sprintf("step %s picked %d times (%s): pick one candidate", p.Node, len(written), strings.Trim(fmt.Sprint(written), "[]")))
		default:
			problems = append(problems, fmt.Sprintf("pick %d for step %s: no such candidate answered (want one of %s)", written[0], p.Node, allowed))
		}
	}
	var extra []string
	for node := range picks {
		if !want[node] {
			extra = append(extra, node)
		}
	}
	slices.Sort(extra)
	for _, node := range extra {
		problems = append(problems, fmt.Sprintf("pick for %q: it has no candidates to pick from now", node))
	}
	for _, tag := range badPicks(text) {
		problems = append(problems, fmt.Sprintf(`%.100s is not a pick: write <pick node="X">N</pick>, N the number of one candidate`, tag))
	}
	return strings.Join(problems, "; ")
}

// pickParse reads the picks a reply owes, then parses the rest as
// plan_act does; a plan's nodes of the actor model become candidates (no
// vote), and none may feed another node of the same plan.
func (m Ensemble) pickParse(ctx context.Context, out *schema.PlanOutput, observation string, cfg schema.Config) (schema.Message, error) {
	if out.FinishReason == "length" && out.Text == "" {
		return m.PlanAct.Parse(ctx, out, observation, cfg) // out of context: plan_act's error says so
	}
	todo := pendingOf(observation)
	again := ""
	if len(todo) > 0 {
		again = "; " + againLead + renderPending(todo)
	}
	perr := func(kind, msg string) schema.Message {
		return &schema.PlanError{Rollout: out.Rollout, Episode: out.Episode, Turn: out.Turn, ErrorKind: kind, Message: msg + again, FinishReason: out.FinishReason}
	}
	if problem := pickProblems(todo, out.Text); problem != "" {
		return perr(PickError, problem), nil
	}
	rest := *out
	rest.Text = strings.TrimSpace(stripPicks(out.Text))
	msg, err := m.PlanAct.Parse(ctx, &rest, observation, cfg)
	if err != nil {
		return nil, err
	}
	switch v := msg.(type) {
	case *schema.PlanError:
		if v.ErrorKind != schema.PlanErrContextFull {
			v.Message += again
		}
	case *schema.PlanDAG:
		if pe := reserved(out, v.Plan.Nodes); pe != nil {
			pe.Message += again
			return pe, nil
		}
		actor := map[string]bool{}
		for _, n := range v.Plan.Nodes {
			if multiplied(cfg, n.Tool) {
				actor[n.ID] = true
			}
		}
		for _, n := range v.Plan.Nodes {
			for _, d := range n.Deps {
				if actor[d] {
					return perr(PickError, fmt.Sprintf("node %s uses the result of %s, a step of the actor model: with ensemble_pick planner you pick among %s's candidates in your next reply, so plan %s after that", n.ID, d, d, n.ID)), nil
				}
			}
		}
		v.Plan.Nodes = Expand(v.Plan.Nodes, cfg)
	}
	return msg, nil
}

// PickError is the kind of a parse error about the planner's picks.
const PickError = "pick"

// plannerPicks reads back, from the planner's trajectory, the candidate it
// picked for each step (turn/step -> the candidate's outcome): each
// observation that lists candidates to pick is answered by the replies
// after it, and the last reply that picks a step validly decides (a reply
// rejected for its plan is asked again, and its retry's picks stand).
func plannerPicks(ep *Episode) map[string]*schema.ActDone {
	picked := map[string]*schema.ActDone{}
	if ep.Last == nil {
		return picked
	}
	cands := map[string]*schema.ActDone{} // turn/step/number -> the candidate's outcome
	for _, d := range ep.Outcomes {
		if !ofActor(ep.Config, d) {
			continue
		}
		if pick, number, ok := candidateOf(d.NodeID); ok && (d.Status == schema.ActDoneOK || d.Status == schema.ActCached) && !NoAnswer(d.Output) {
			cands[fmt.Sprintf("%d/%s/%d", d.Turn, pick, number)] = d
		}
	}
	var todo []pending
	for _, s := range ep.Last.Segments {
		switch s.Kind {
		case schema.SegObservation:
			todo = pendingOf(s.Text)
		case schema.SegGenerated:
			picks := Picks(s.Text)
			for _, p := range todo {
				if n, ok := validPick(p, picks[p.Node]); ok {
					if d := cands[fmt.Sprintf("%d/%s/%d", p.Turn, p.Node, n)]; d != nil {
						picked[strconv.Itoa(p.Turn)+"/"+p.Node] = d
					}
				}
			}
		}
	}
	return picked
}
