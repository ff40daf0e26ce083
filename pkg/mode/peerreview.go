package mode

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
)

// PeerReview is the peer_review mode: the actor answers the task (turn 1,
// no planner call); from turn 2 on the planner reviews the latest answer,
// and either accepts it (<accept/>: the episode ends with that answer) or
// critiques it (<revise>critique</revise>: the actor revises in the same
// turn, and the revision is the next turn's observation). A review that
// asks for a revision at max_turns ends the episode with the answer it
// reviewed, unaccepted. An attempt whose answer is empty is shown as such
// and is no answer, as a failed one is none: there is nothing to accept or
// to end with. An empty review is a parse error naming its turn.
//
// Every attempt is an actor sample, rewarded with the final answer's score;
// the planner's sample holds every review and is rewarded with the
// agreement of its last verdict with the final answer's correctness: 1 for
// accepting a correct answer or rejecting a wrong one, 0 otherwise.
//
// It is the smallest mode: read it first when writing a new one.
type PeerReview struct{}

// ReviewTool is the tool of the actor's attempts.
const ReviewTool = "answer"

// FormatReview is the plan format of the attempts' one-node plans.
const FormatReview plan.Format = "review"

// Name is peer_review.
func (PeerReview) Name() string { return schema.ModePeerReview }

// Open is the actor's first attempt: a plan of one node, turn 1.
func (PeerReview) Open(n int64, e int, task schema.Task, _ schema.Config, _ string) schema.Message {
	return &schema.PlanDAG{Rollout: n, Episode: e, Turn: 1, Plan: plan.Plan{Format: FormatReview, Nodes: []plan.Node{{
		ID: "attempt", Tool: ReviewTool, Args: map[string]any{"question": task.Prompt}, Deps: []string{},
		Description: "answer the question",
	}}}}
}

// FirstPlannerTurn is 2: the planner's first request carries the first
// attempt as its observation.
func (PeerReview) FirstPlannerTurn() int { return 2 }

// PlannerPrompt asks for a review.
func (PeerReview) PlannerPrompt(task schema.Task, _ schema.Config) string {
	var b strings.Builder
	b.WriteString("You are the reviewer. A solver answers the question below; each <observation> shows its latest answer. ")
	b.WriteString("If the answer is right, reply with <accept/> and nothing else. If it is wrong, reply with <revise>what is wrong and how to fix it</revise>, and the solver will try again.\n")
	fmt.Fprintf(&b, "Question: %s\n", task.Prompt)
	return b.String()
}

// ParseNeedsObservation is true: an accepted answer is the one observed.
func (PeerReview) ParseNeedsObservation(schema.Config) bool { return true }

var (
	acceptRe  = regexp.MustCompile(`<accept\s*/?>`)
	reviseRe  = regexp.MustCompile(`(?s)<revise>(.*?)</revise>`)
	thinkRe   = regexp.MustCompile(`(?i)<think>`)
	unthinkRe = regexp.MustCompile(`(?i)</think>`)
	answerRe  = regexp.MustCompile(`(?m)^Answer: (.*)$`)
	attemptRe = regexp.MustCompile(`(?m)^The attempt (failed|is empty)`)
)

// emptyAttempt is how Observation shows an attempt whose answer is empty
// (the actor generated nothing, or only white space): no answer, as a
// failed attempt is none.
const emptyAttempt = "The attempt is empty: the solver gave no answer"

// outsideThink is text without what the model thought, as pkg/plan reads
// an output: closed <think> blocks, everything before a lone </think> (the
// chat template opened the block in the prompt), and a <think> never
// closed, to the end (the length limit cut it off).
func outsideThink(text string) string {
	if c, o := unthinkRe.FindStringIndex(text), thinkRe.FindStringIndex(text); c != nil && (o == nil || c[0] < o[0]) {
		text = text[c[1]:]
	}
	var b strings.Builder
	for {
		o := thinkRe.FindStringIndex(text)
		if o == nil {
			b.WriteString(text)
			return b.String()
		}
		b.WriteString(text[:o[0]])
		c := unthinkRe.FindStringIndex(text[o[1]:])
		if c == nil {
			return b.String()
		}
		text = text[o[1]+c[1]:]
	}
}

// Verdict reads a review: accept, or the critique of a revision; ok is
// false when the text holds neither. The last verdict written wins; what
// is in <think> does not count, nor an <accept/> inside a <revise> (quoted
// in the critique, or after a <revise> never closed).
func Verdict(text string) (accept bool, critique string, ok bool) {
	text = outsideThink(text)
	r := reviseRe.FindAllStringSubmatchIndex(text, -1)
	open := len(text) // where a <revise> never closed starts
	from := 0
	if len(r) > 0 {
		from = r[len(r)-1][1]
	}
	if i := strings.Index(text[from:], "<revise>"); i >= 0 {
		open = from + i
	}
	var a [][]int
	k := 0 // the first <revise> that does not end before the accept
	for _, at := range acceptRe.FindAllStringIndex(text, -1) {
		for k < len(r) && r[k][1] <= at[0] {
			k++
		}
		if at[0] < open && (k == len(r) || at[0] < r[k][0]) {
			a = append(a, at)
		}
	}
	switch {
	case len(a) == 0 && len(r) == 0:
		return false, "", false
	case len(r) == 0 || len(a) > 0 && a[len(a)-1][0] > r[len(r)-1][0]:
		return true, "", true
	}
	last := r[len(r)-1]
	return false, strings.TrimSpace(text[last[2]:last[3]]), true
}

// Parse reads the review: accept ends the episode with the observed
// answer; a critique is a revision for the actor, or, at max_turns, the end
// with the answer reviewed.
func (PeerReview) Parse(_ context.Context, out *schema.PlanOutput, observation string, cfg schema.Config) (schema.Message, error) {
	perr := func(kind, msg string) schema.Message {
		return &schema.PlanError{Rollout: out.Rollout, Episode: out.Episode, Turn: out.Turn, ErrorKind: kind, Message: msg, FinishReason: out.FinishReason}
	}
	if out.FinishReason == "length" && out.Text == "" {
		msg := "the episode ran out of context before the reviewer could answer"
		if out.Truncated != "" {
			msg += ": " + out.Truncated
		}
		return perr(schema.PlanErrContextFull, msg), nil
	}
	if strings.TrimSpace(outsideThink(out.Text)) == "" {
		return perr(string(plan.ErrEmpty), fmt.Sprintf("turn %d: the review is empty; reply with <accept/> or <revise>what is wrong</revise>", out.Turn)), nil
	}
	text := out.Text
	if out.FinishReason == engine.FinishStop && stopsOn(cfg.PlannerSampling.Stop, "</revise>") && unclosedRevise(text) {
		// The engine stopped on "</revise>" and stripped it: the
		// critique ends there.
		text += "</revise>"
	}
	accept, critique, ok := Verdict(text)
	if !ok {
		return perr("syntax", "a review is <accept/> or <revise>what is wrong</revise>; found neither"), nil
	}
	answer, answered, empty := observedAnswer(observation)
	end := func() schema.Message {
		return &schema.PlanAnswer{Rollout: out.Rollout, Episode: out.Episode, Turn: out.Turn, Answers: []string{answer}, FinishReason: out.FinishReason}
	}
	switch {
	case accept && empty:
		return perr("syntax", fmt.Sprintf("turn %d: there is no answer to accept: the attempt reviewed is empty; ask for a revision", out.Turn)), nil
	case accept && !answered:
		return perr("syntax", "there is no answer to accept: the last attempt failed; ask for a revision"), nil
	case accept:
		return end(), nil
	case critique == "":
		return perr("syntax", "<revise> holds no critique: say what is wrong"), nil
	case out.Turn >= cfg.MaxTurns && answered:
		return end(), nil // max_turns: the answer reviewed stands, unaccepted
	}
	// The turn makes each revision a call of its own: the act-dispatcher
	// answers a call the episode made before from its result, and a
	// critique repeated of an answer repeated would replay the last
	// revision instead of asking the actor again.
	args := map[string]any{"critique": critique, "turn": out.Turn}
	if answered {
		args["previous"] = answer
	}
	return &schema.PlanDAG{Rollout: out.Rollout, Episode: out.Episode, Turn: out.Turn, FinishReason: out.FinishReason,
		Plan: plan.Plan{Format: FormatReview, Nodes: []plan.Node{{ID: "revision", Tool: ReviewTool, Args: args, Deps: []string{}, Description: "revise the answer"}}}}, nil
}

// stopsOn says whether tag is one of the stop strings stop.
func stopsOn(stop []string, tag string) bool {
	for _, s := range stop {
		if strings.EqualFold(strings.TrimSpace(s), tag) {
			return true
		}
	}
	return false
}

// unclosedRevise says whether a review (outside <think>) ends inside a
// <revise> never closed.
func unclosedRevise(text string) bool {
	text = outsideThink(text)
	from := 0
	if r := reviseRe.FindAllStringIndex(text, -1); len(r) > 0 {
		from = r[len(r)-1][1]
	}
	return strings.Contains(text[from:], "<revise>")
}

// reads: a review is of the last attempt shown (Observation's), which a
// parse error's observation (ErrorObservation) does not repeat.
func (PeerReview) reads(observation string) bool {
	return answerRe.MatchString(observation) || attemptRe.MatchString(observation)
}

// observedAnswer reads the answer an observation (Observation's) shows;
// answered is false when it shows none, and empty says why: the attempt's
// answer was empty (an "Answer: " with nothing after it, as Observation
// showed one before it said so, is empty too), not failed.
func observedAnswer(observation string) (answer string, answered, empty bool) {
	if m := attemptRe.FindStringSubmatch(observation); m != nil {
		return "", false, m[1] == "is empty"
	}
	m := answerRe.FindAllStringSubmatch(observation, -1)
	if len(m) == 0 {
		return "", false, false
	}
	answer = strings.TrimSpace(m[len(m)-1][1])
	return answer, answer != "", answer == ""
}

// Tool adds the attempts' tool, the actor model, to the rollout's.
func (PeerReview) Tool(cfg schema.Config, name string) (schema.Tool, bool) {
	if name == ReviewTool {
		return schema.Tool{Name: ReviewTool, Description: "answer the question", Kind: schema.ToolActor}, true
	}
	return cfg.Tool(name)
}

// RunLocal: peer_review adds no local tool.
func (m PeerReview) RunLocal(tool schema.Tool, _ Node) (string, error) {
	return "", errNoLocal(m, tool.Name)
}

// ActorPrompt asks for an answer, or a revision of the previous one.
func (PeerReview) ActorPrompt(task schema.Task, _ schema.Tool, node Node, _ string) string {
	var b strings.Builder
	b.WriteString("You are the solver. Answer the question; reply with the answer only, as short as possible.\n")
	if prev, ok := node.Args["previous"].(string); ok {
		fmt.Fprintf(&b, "Your previous answer: %s\n", oneLine(prev))
	}
	if c, ok := node.Args["critique"].(string); ok {
		fmt.Fprintf(&b, "A reviewer asked for a revision: %s\n", oneLine(c))
	}
	fmt.Fprintf(&b, "Input: %s\nAnswer:", oneLine(task.Prompt))
	return b.String()
}

// Observation shows the reviewer the turn's attempt.
func (PeerReview) Observation(r *schema.Run, _ schema.Config) string {
	var b strings.Builder
	b.WriteString("\n<observation>\n")
	for _, n := range r.Nodes {
		switch n.Status {
		case schema.NodeDone, schema.NodeCached:
			if a := oneLine(n.Output); a != "" {
				b.WriteString("Answer: " + a)
			} else {
				b.WriteString(emptyAttempt)
			}
		case schema.NodeFailed:
			b.WriteString("The attempt failed: " + oneLine(n.Error))
		default:
			b.WriteString("The attempt failed: skipped: " + oneLine(n.Error))
		}
		b.WriteByte('\n')
	}
	b.WriteString("</observation>\n")
	return b.String()
}

// Rewards: attempts get the final answer's score; the reviews, whether the
// last verdict agrees with the final answer's correctness.
func (PeerReview) Rewards(ep *Episode) {
	if ep.Planner == nil {
		return
	}
	// A verdict counts only in an episode that completed on it: an
	// <accept/> refused (of a failed or empty attempt) accepted nothing.
	completed := ep.End != nil && ep.End.Status == schema.EpisodeCompleted
	accepted := false
	if ep.Last != nil && completed {
		accepted, _, _ = Verdict(ep.Last.Text)
	}
	agree := 0.0
	if completed && accepted == ep.Correct {
		agree = 1
	}
	ep.Planner.Reward = agree
	if ep.Planner.Metadata == nil {
		ep.Planner.Metadata = map[string]any{}
	}
	ep.Planner.Metadata["accepted"] = accepted
	ep.Planner.Metadata["answer_score"] = ep.Score
}
