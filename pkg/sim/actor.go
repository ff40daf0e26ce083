package sim

import (
	"regexp"
	"strings"
)

// The simulated actor's prompt contract: lines "Tool: <tool>" and
// "Input: <text>". It answers with the fact World.Lookup finds for the input,
// or "unknown", followed by EOS.
var (
	inputLineRe = regexp.MustCompile(`(?m)^[ \t]*Input:[ \t]*(.*?)[ \t]*$`)
)

// actorOutput answers a lookup, wrongly when the error rate or a
// FaultActorWrong marker says so. The roll depends on how many times the
// same prompt was seen before (occurrence), as sampling would: the copies of
// a task in a group do not all make the same mistakes, so a group's rewards
// spread, and a run with the same seed and order makes the same ones.
func (e *Engine) actorOutput(prompt, occurrence string, fires func(string) bool) string {
	input := ""
	if m := inputLineRe.FindStringSubmatch(prompt); m != nil {
		input = m[1]
	} else {
		// No Input line: take the last non-empty line of the prompt.
		lines := strings.Split(strings.TrimSpace(prompt), "\n")
		input = lines[len(lines)-1]
	}
	q := stripMarkers(input)
	if _, lookup := e.world.Lookup(q); !lookup {
		if _, question := parseQuestion(q); question {
			// A whole question (peer_review's solver).
			wrong := fires("actor-wrong") || roll(e.cfg.ActorErrorRate, e.cfg.Seed, "actor-wrong", normQuery(q), prompt, occurrence)
			a, _ := e.world.answerQuestion(q, wrong, hash64(e.cfg.Seed, "wrong", prompt))
			return a
		}
	}
	if fires("actor-wrong") || roll(e.cfg.ActorErrorRate, e.cfg.Seed, "actor-wrong", normQuery(q), occurrence) {
		return e.world.wrongLookup(q, hash64(e.cfg.Seed, "wrong", normQuery(q)))
	}
	if v, ok := e.world.Lookup(q); ok {
		return v
	}
	return "unknown"
}
