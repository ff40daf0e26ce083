package chaos

import (
	"fmt"
	"math"
	"sort"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// Verdict of one rollout, worst first: a rollout that is both hung and
// lost counts as lost.
const (
	VerdictLost      = "lost"           // no result on the bus for a role, even at the end of the run
	VerdictHung      = "hung"           // no result by the trainer's deadline (one came later)
	VerdictWrong     = "wrong_status"   // a result that is not ok, or an error
	VerdictDuplicate = "duplicated"     // a sample or a result delivered twice
	VerdictMismatch  = "mismatch"       // samples that do not match what was executed
	VerdictClient    = "client_gave_up" // pkg/client gave up waiting before the deadline (the trainer asked again)
	VerdictOK        = "ok"
)

// RolloutCheck is the ledger's finding for one rollout.
type RolloutCheck struct {
	Rollout          int64    `json:"rollout"`
	Verdict          string   `json:"verdict"`
	Problems         []string `json:"problems,omitempty"`
	Episodes         int      `json:"episodes"`
	PlannerSamples   int      `json:"planner_samples"`
	ActorSamples     int      `json:"actor_samples"`
	ExecutedActs     int      `json:"executed_acts"`     // from the ACT stream
	DuplicateSamples int      `json:"duplicate_samples"` // planner and actor
	MissingSamples   int      `json:"missing_samples"`   // executed acts (or episodes) without a sample
	ExtraSamples     int      `json:"extra_samples"`     // samples of nothing executed
	BadSamples       int      `json:"bad_samples"`       // samples not token-exact, or not what the engines generated
	ResultMessages   int      `json:"result_messages"`   // both roles; 2 is right
	DuplicateResults int      `json:"duplicate_results"` // result messages beyond one per role
	UnseenResults    int      `json:"unseen_results"`    // ok results a trainer got that the bus does not hold
	ClientErrors     int      `json:"client_errors"`     // times pkg/client gave up before the deadline
	Lost, Hung       bool     `json:"-"`                 // per role, any
	WrongStatus      bool     `json:"-"`
}

// Check holds one rollout against the ledger: both roles got an ok result,
// exactly once, by their deadline; the planner has one sample per episode;
// the actor one sample per executed act (counted from the ACT stream,
// executed = its last outcome is done and carries a generation), none twice.
// results is how many result messages each role got on the bus; executed
// the acts, as ActID, of this rollout.
func Check(rec RolloutRecord, results map[string]int, executed map[string]bool) RolloutCheck {
	c := RolloutCheck{Rollout: rec.Rollout, Episodes: rec.Episodes, ExecutedActs: len(executed)}
	problem := func(format string, a ...any) { c.Problems = append(c.Problems, fmt.Sprintf(format, a...)) }
	var clientProblems []string // after the others: they say less
	for _, r := range []struct {
		role string
		out  RoleOutcome
	}{{schema.RolePlanner, rec.Planner}, {schema.RoleActor, rec.Actor}} {
		c.ResultMessages += results[r.role]
		c.ClientErrors += len(r.out.ClientErrors)
		if len(r.out.ClientErrors) > 0 {
			clientProblems = append(clientProblems, fmt.Sprintf("%s: the client gave up %d times before the deadline (first: %s)", r.role, len(r.out.ClientErrors), r.out.ClientErrors[0]))
		}
		switch {
		case results[r.role] == 0 && r.out.Status == "":
			c.Lost = true
			problem("%s: no result on the bus (%s)", r.role, r.out.Err)
		case r.out.Hung:
			c.Hung = true
			problem("%s: no result by the deadline (%s)", r.role, r.out.Err)
		case r.out.Status != schema.ResultOK:
			c.WrongStatus = true
			problem("%s: status %q (%s) %s", r.role, r.out.Status, r.out.Reason, r.out.Err)
		case r.out.Err != "":
			c.WrongStatus = true
			problem("%s: %s", r.role, r.out.Err)
		}
		if results[r.role] > 1 {
			c.DuplicateResults += results[r.role] - 1
			problem("%s: %d result messages", r.role, results[r.role])
		}
		if results[r.role] == 0 && r.out.Status == schema.ResultOK {
			c.UnseenResults++
			problem("%s: the trainer got an ok result that the bus does not hold", r.role)
		}
		if r.out.Status == schema.ResultOK {
			c.BadSamples += len(r.out.BadSamples)
			for _, b := range first(r.out.BadSamples, 3) {
				problem("%s: %s", r.role, b)
			}
		}
	}

	// Planner: one sample per episode, each episode once.
	c.PlannerSamples = len(rec.Planner.Samples)
	if rec.Planner.Status == schema.ResultOK {
		seen := map[string]int{}
		for _, s := range rec.Planner.Samples {
			seen[s]++
		}
		for e := range rec.Episodes {
			if seen[fmt.Sprint(e)] == 0 {
				c.MissingSamples++
				problem("planner: no sample of episode %d", e)
			}
		}
		for _, k := range sortedKeys(seen) {
			if seen[k] > 1 {
				c.DuplicateSamples += seen[k] - 1
				problem("planner: episode %s delivered %d times", k, seen[k])
			}
		}
		if len(seen) > rec.Episodes {
			c.ExtraSamples += len(seen) - rec.Episodes
			problem("planner: %d samples for %d episodes", len(seen), rec.Episodes)
		}
	}

	// Actor: one sample per executed act, each act once.
	c.ActorSamples = len(rec.Actor.Samples)
	if rec.Actor.Status == schema.ResultOK {
		seen := map[string]int{}
		for _, s := range rec.Actor.Samples {
			seen[s]++
		}
		for _, k := range sortedKeys(seen) {
			if seen[k] > 1 {
				c.DuplicateSamples += seen[k] - 1
				problem("actor: act %s delivered %d times", k, seen[k])
			}
			if !executed[k] {
				c.ExtraSamples++
				problem("actor: sample of act %s, which the ACT stream does not show executed", k)
			}
		}
		for _, k := range sortedKeys(executed) {
			if seen[k] == 0 {
				c.MissingSamples++
				problem("actor: executed act %s has no sample", k)
			}
		}
	}

	c.Problems = append(c.Problems, clientProblems...)
	switch {
	case c.Lost:
		c.Verdict = VerdictLost
	case c.Hung:
		c.Verdict = VerdictHung
	case c.WrongStatus:
		c.Verdict = VerdictWrong
	case c.duplicated():
		c.Verdict = VerdictDuplicate
	case c.mismatched():
		c.Verdict = VerdictMismatch
	case c.ClientErrors > 0:
		c.Verdict = VerdictClient
	default:
		c.Verdict = VerdictOK
	}
	return c
}

// duplicated: a sample or a role's result delivered twice.
func (c RolloutCheck) duplicated() bool { return c.DuplicateSamples > 0 || c.DuplicateResults > 0 }

// mismatched: samples or results that do not match what ran.
func (c RolloutCheck) mismatched() bool {
	return c.MissingSamples > 0 || c.ExtraSamples > 0 || c.BadSamples > 0 || c.UnseenResults > 0
}

// SampleProblems holds one sample against what the simulated engines
// generate (`planact sim`'s byte tokenizer; seed is the seed of the
// sample's engine): its tokens spell its prompt and response, the loss
// mask and the log-probs cover the response, and every generated token
// has the log-probability that engine gives it, from the tokens before it
// as the prompt (a generation resumed within a turn starts a new one).
// An observation token has log-prob 0. Nothing is returned for a sound
// sample; else what is wrong, naming the sample.
func SampleProblems(s schema.Sample, seed int64) []string {
	name := s.RolloutID
	if e, ok := schema.MetaInt(s.Metadata["episode"]); ok {
		name = fmt.Sprintf("%s (episode %d", name, e)
		if t, ok := schema.MetaInt(s.Metadata["turn"]); ok {
			name += fmt.Sprintf(", turn %d", t)
		}
		if n, ok := s.Metadata["node"].(string); ok {
			name += ", node " + n
		}
		name += ")"
	}
	var out []string
	problem := func(format string, a ...any) {
		out = append(out, "sample "+name+": "+fmt.Sprintf(format, a...))
	}
	if math.IsNaN(s.Reward) || math.IsInf(s.Reward, 0) {
		problem("reward %v", s.Reward)
	}
	text, err := sim.Decode(s.Tokens)
	if err != nil {
		problem("tokens do not decode: %v", err)
		return out
	}
	if text != s.Prompt+s.Response {
		problem("tokens spell %q, not prompt+response %q", text, s.Prompt+s.Response)
	}
	n := s.ResponseLength
	if n < 0 || n > len(s.Tokens) || n != len(s.LossMask) || n != len(s.RolloutLogProbs) {
		problem("response_length %d, tokens %d, loss_mask %d, log-probs %d", n, len(s.Tokens), len(s.LossMask), len(s.RolloutLogProbs))
		return out
	}
	base, generated := len(s.Tokens)-n, 0
	var start int         // where the generation of token k began, in the response
	var prompt string     // what that generation was given: every token before start
	from := func(k int) { // a generation that began at token k
		start = k
		prompt, _ = sim.Decode(s.Tokens[:base+k])
	}
	want := func(k int) float64 { return sim.LogProb(seed, prompt, k-start, s.Tokens[base+k]) }
	for k, m := range s.LossMask {
		got := s.RolloutLogProbs[k]
		switch m {
		case 0:
			if got != 0 {
				problem("observation token %d has log-prob %v", k, got)
				return out
			}
			continue
		case 1:
		default:
			problem("loss_mask %d at token %d", m, k)
			return out
		}
		generated++
		if k == 0 || s.LossMask[k-1] == 0 {
			from(k)
		}
		if got == want(k) {
			continue
		}
		if start != k {
			from(k) // a generation resumed here
			if got == want(k) {
				continue
			}
		}
		problem("generated token %d (id %d) has log-prob %v, which the engine never gave it", k, s.Tokens[base+k], got)
		return out
	}
	if generated == 0 {
		problem("no generated token")
	}
	return out
}

// Tally sums the ledger over many rollouts.
type Tally struct {
	Rollouts         int `json:"rollouts"`
	OK               int `json:"ok"`
	Lost             int `json:"lost"`
	Hung             int `json:"hung"`
	WrongStatus      int `json:"wrong_status"`
	Duplicated       int `json:"duplicated"`     // rollouts with a sample or result delivered twice
	Mismatched       int `json:"mismatched"`     // rollouts whose samples do not match what ran
	ClientGaveUp     int `json:"client_gave_up"` // rollouts where pkg/client gave up before the deadline
	DuplicateSamples int `json:"duplicate_samples"`
	MissingSamples   int `json:"missing_samples"`
	ExtraSamples     int `json:"extra_samples"`
	BadSamples       int `json:"bad_samples"`
	Episodes         int `json:"episodes"`
	PlannerSamples   int `json:"planner_samples"`
	ActorSamples     int `json:"actor_samples"`
	ExecutedActs     int `json:"executed_acts"`
}

// Add counts one rollout. Lost, hung and wrong status count every rollout
// that has them (a lost rollout usually is hung too), so the columns
// do not add up to the rollouts.
func (t *Tally) Add(c RolloutCheck) {
	t.Rollouts++
	if c.Verdict == VerdictOK {
		t.OK++
	}
	if c.Lost {
		t.Lost++
	}
	if c.Hung || c.Lost {
		t.Hung++
	}
	if c.WrongStatus {
		t.WrongStatus++
	}
	if c.duplicated() {
		t.Duplicated++
	}
	if c.mismatched() {
		t.Mismatched++
	}
	if c.ClientErrors > 0 {
		t.ClientGaveUp++
	}
	t.DuplicateSamples += c.DuplicateSamples
	t.MissingSamples += c.MissingSamples
	t.ExtraSamples += c.ExtraSamples
	t.BadSamples += c.BadSamples
	t.Episodes += c.Episodes
	t.PlannerSamples += c.PlannerSamples
	t.ActorSamples += c.ActorSamples
	t.ExecutedActs += c.ExecutedActs
}

// Unsolicited lists what the bus shows of rollouts that no trainer played
// (recs): a result or an executed act of another rollout, or a result of
// a role that is neither planner nor actor. results holds, per rollout,
// the result messages per role; executed the executed acts.
func Unsolicited(recs []RolloutRecord, results map[int64]map[string]int, executed map[int64]map[string]bool) []string {
	played := map[int64]bool{}
	for _, r := range recs {
		played[r.Rollout] = true
	}
	var out []string
	for _, n := range sortedRollouts(results) {
		for _, role := range sortedKeys(results[n]) {
			switch {
			case !played[n]:
				out = append(out, fmt.Sprintf("rollout %d, which no trainer played: %d %s result messages", n, results[n][role], role))
			case role != schema.RolePlanner && role != schema.RoleActor:
				out = append(out, fmt.Sprintf("rollout %d: %d result messages of role %q", n, results[n][role], role))
			}
		}
	}
	for _, n := range sortedRollouts(executed) {
		if !played[n] {
			out = append(out, fmt.Sprintf("rollout %d, which no trainer played: %d executed acts", n, len(executed[n])))
		}
	}
	return out
}

func sortedRollouts[V any](m map[int64]V) []int64 {
	ns := make([]int64, 0, len(m))
	for n := range m {
		ns = append(ns, n)
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i] < ns[j] })
	return ns
}

// Clean reports whether nothing was lost, hung, wrong, doubled or missing.
func (t Tally) Clean() bool {
	return t.Rollouts > 0 && t.OK == t.Rollouts
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
