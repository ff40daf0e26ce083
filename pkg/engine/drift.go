package engine

import (
	"errors"
	"fmt"

	"github.com/planact/planact/pkg/fail"
)

// ErrTokenDrift is in the chain of the error of a generation whose engine
// says it took another input than the trajectory planact holds: a chat
// template that re-renders the conversation (strips <think>, trims, merges
// tokens across a boundary), a router that sends a turn to a server with
// another tokenizer revision, a server that adds a token. What it generated
// continues a context the model saw and planact does not: a sample built on
// it would not be token-exact, so it is never trained on (the episode is
// quarantined). A *DriftError says where.
var ErrTokenDrift = errors.New("token_drift")

// DriftError says where an engine's input differs from the ids planact
// sent, or holds for the conversation so far, by the engine's own report
// (Evidence): its prompt token ids (vLLM's prompt_token_ids, a chat
// server's rendering) or only their count (SGLang's meta_info.prompt_tokens,
// usage.prompt_tokens).
type DriftError struct {
	// At is the first position where the engine's input differs from
	// planact's; -1 when only counts are known.
	At int
	// Sent is how many ids planact holds for the input (for a chat engine,
	// the trajectory before the newest message); Consumed how many the
	// engine reports it took.
	Sent, Consumed int
	// Evidence names what the engine reported.
	Evidence string
}

func (e *DriftError) Error() string { return "token_drift: " + e.Where() }

// Where says where and how the input drifted, in a sentence.
func (e *DriftError) Where() string {
	if e.At < 0 {
		return fmt.Sprintf("the engine reports %d prompt tokens (%s) for the %d planact sent: its input is not planact's trajectory",
			e.Consumed, e.Evidence, e.Sent)
	}
	return fmt.Sprintf("the engine's input differs from planact's trajectory at token %d of %d (%s: %d tokens)",
		e.At, e.Sent, e.Evidence, e.Consumed)
}

func (e *DriftError) Unwrap() error { return ErrTokenDrift }

// drift is a permanent error: generated again, the same input drifts the
// same way.
func drift(at, sent, consumed int, evidence string) error {
	return fail.E(fail.Permanent, &DriftError{At: at, Sent: sent, Consumed: consumed, Evidence: evidence})
}

// firstDiff is the first position where a and b differ (the length of the
// shorter when one begins the other).
func firstDiff(a, b []int) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// checkConsumed checks, for a generation from token ids, that the engine
// took exactly the ids it was sent, by what it reports: its prompt ids
// when it returns them (vLLM's prompt_token_ids), else their count
// (SGLang's meta_info.prompt_tokens, usage.prompt_tokens). Fewer, a prefix
// of what was sent, is a cut prompt (ErrPromptCut: the engine truncates
// long prompts); anything else is drift. An engine that reports neither
// is taken at its word: nothing to check.
func checkConsumed(r Request, g Generation) error {
	sent := r.InputIDs
	if len(sent) == 0 {
		return nil
	}
	if g.PromptIDs != nil {
		switch at := firstDiff(sent, g.PromptIDs); {
		case at < len(g.PromptIDs):
			return drift(at, len(sent), len(g.PromptIDs), "prompt_token_ids") // another id, or more of them
		case at < len(sent):
			return promptCut(len(g.PromptIDs), len(sent))
		}
	}
	switch {
	case g.PromptTokens <= 0 || g.PromptTokens == len(sent):
		return nil
	case g.PromptTokens < len(sent):
		return promptCut(g.PromptTokens, len(sent))
	}
	return drift(-1, len(sent), g.PromptTokens, "prompt_tokens")
}

// checkPrefix checks that a chat engine's rendering of the conversation
// (its prompt_token_ids, or its /tokenize's tokens: evidence) begins with
// the ids the trajectory holds for every message but the newest.
func checkPrefix(prefix, rendered []int, evidence string) error {
	if at := firstDiff(prefix, rendered); at < len(prefix) {
		return drift(at, len(prefix), len(rendered), evidence)
	}
	return nil
}
