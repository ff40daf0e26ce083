package chaos

import (
	"fmt"
	"sort"

	"github.com/planact/planact/pkg/schema"
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
	ResultMessages   int      `json:"result_messages"`   // both roles; 2 is right
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
			problem("%s: %d result messages", r.role, results[r.role])
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
	case c.DuplicateSamples > 0 || c.ResultMessages > 2:
		c.Verdict = VerdictDuplicate
	case c.MissingSamples > 0 || c.ExtraSamples > 0:
		c.Verdict = VerdictMismatch
	case c.ClientErrors > 0:
		c.Verdict = VerdictClient
	default:
		c.Verdict = VerdictOK
	}
	return c
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
	if c.DuplicateSamples > 0 || c.ResultMessages > 2 {
		t.Duplicated++
	}
	if c.MissingSamples > 0 || c.ExtraSamples > 0 {
		t.Mismatched++
	}
	if c.ClientErrors > 0 {
		t.ClientGaveUp++
	}
	t.DuplicateSamples += c.DuplicateSamples
	t.MissingSamples += c.MissingSamples
	t.ExtraSamples += c.ExtraSamples
	t.Episodes += c.Episodes
	t.PlannerSamples += c.PlannerSamples
	t.ActorSamples += c.ActorSamples
	t.ExecutedActs += c.ExecutedActs
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
