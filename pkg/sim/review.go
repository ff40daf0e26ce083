package sim

import (
	"regexp"
	"strings"

	"github.com/planact/planact/pkg/reward"
)

// The peer_review contract (pkg/mode.PeerReview). The reviewer's prompt
// starts "You are the reviewer" and holds the "Question:" line; each
// <observation> shows the solver's latest answer as "Answer: <answer>" (or
// "The attempt failed: …", or "The attempt is empty: the solver gave no
// answer"). The simulated reviewer knows the world: it accepts a right
// answer (<accept/>) and asks for a revision of a wrong or missing one
// (<revise>…</revise>), deterministically. The solver's prompt
// has "Input: <question>": the simulated actor answers a question of the
// world whole, wrongly at the actor's error rate, rolled on the whole prompt
// (a revision, with its critique, is a new roll).

var reviewAnswerRe = regexp.MustCompile(`(?m)^[ \t]*Answer:[ \t]*(.*?)[ \t]*$`)

// isReviewPrompt reports whether the planner is asked for a review.
func isReviewPrompt(prompt string) bool {
	return strings.HasPrefix(strings.TrimSpace(prompt), "You are the reviewer")
}

// reviewOutput reviews the latest answer the prompt shows.
func (w *World) reviewOutput(p plannerPrompt, prompt string) string {
	blocks := observationRe.FindAllStringSubmatch(prompt, -1)
	answer, answered := "", false
	if len(blocks) > 0 {
		if m := reviewAnswerRe.FindStringSubmatch(blocks[len(blocks)-1][1]); m != nil {
			answer, answered = m[1], true
		}
	}
	if !answered {
		return "<think>There is no answer to review yet.</think>\n<revise>There is no answer yet: answer the question.</revise>"
	}
	truth, ok := w.Answer(stripMarkers(p.question))
	if ok && reward.ExactMatch(answer, w.label(truth)) == 1 {
		return "<think>" + answer + " is right.</think>\n<accept/>"
	}
	return "<think>" + answer + " does not fit the facts.</think>\n<revise>" + answer + " is not the answer to this question; look up each fact again.</revise>"
}

// answerQuestion answers a question of the world whole; wrong gives a
// plausible wrong answer (the last lookup of the chain answered wrongly),
// picked by h. ok is false for a text that is no question of the world.
func (w *World) answerQuestion(q string, wrong bool, h uint64) (string, bool) {
	p, ok := parseQuestion(q)
	if !ok {
		return "", false
	}
	truth, ok := w.truth(p)
	if !ok || !wrong {
		return truth, ok
	}
	outs := make([]string, len(p.steps))
	for i := range p.steps {
		query := fill(p.steps[i], outs, func(k int) string { return outs[k] })
		v, ok := w.Lookup(query)
		if !ok {
			return "unknown", true
		}
		if i == len(p.steps)-1 {
			v = w.wrongLookup(query, h)
		}
		outs[i] = v
	}
	if a := p.answer(outs); reward.Normalize(a) != reward.Normalize(truth) {
		return a, true
	}
	return "unknown", true
}
