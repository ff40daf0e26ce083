package chaos

import (
	"sort"
	"time"

	"github.com/planact/planact/pkg/schema"
)

// Recovery says how the rollouts in flight came through one fault.
//
// At the fault's time F, an episode is in flight if its rollout had been
// started by the trainers and neither the episode's end nor the rollout's
// result had been stored by then. An episode moves when the bus stores a
// message that shows it moving: an act outcome (act.N.done.E.K), a planner
// output (plan.N.out.E), its end (rollout.N.end.E), or a result of its
// rollout when it is ok (a partial result after the rollout's time-out
// does not move the episodes it gave up on). Times are JetStream's stored
// times, on the clock of the machine.
// An episode that had not moved for StallWindow before F (nor had its
// rollout started in that window) was stuck already: it is counted apart,
// so that one earlier hang does not stand for every later fault.
type Recovery struct {
	InFlight int `json:"in_flight"`    // episodes in flight at F, not stuck already
	Stuck    int `json:"stuck_before"` // episodes in flight at F that had not moved for StallWindow
	// FirstProgress is the time from F to the first message of any rollout
	// stored after F: how long the whole system stood still.
	FirstProgress time.Duration `json:"first_progress_ns"`
	// NextCompletion is the time from F until the first rollout completed
	// after it: both roles' results stored, the later of them after F. It
	// is what a training run feels: how long no rollout came back.
	NextCompletion time.Duration `json:"next_completion_ns"`
	// Full is the time from F until every episode in flight at F had moved:
	// how long the slowest one waited. Unrecovered episodes never moved.
	Full        time.Duration `json:"full_ns"`
	Unrecovered int           `json:"unrecovered"`
	Measured    bool          `json:"measured"` // something was in flight
}

// StallWindow is how long an episode must not have moved before a fault to
// count as stuck already.
const StallWindow = 45 * time.Second

// RecoveryOf measures a fault at time at against what the trainers started
// and what the observer saw.
func RecoveryOf(at time.Time, recs []RolloutRecord, events func(int64) []Event) Recovery {
	var r Recovery
	first, next := time.Time{}, time.Time{}
	for _, rec := range recs {
		evs := events(rec.Rollout)
		if done := completedAt(evs); done.After(at) && (next.IsZero() || done.Before(next)) {
			next = done
		}
		for _, ev := range evs {
			if ev.At.After(at) {
				if first.IsZero() || ev.At.Before(first) {
					first = ev.At
				}
				break
			}
		}
		if !rec.Started.Before(at) {
			continue
		}
		resultMoves := rec.Planner.Status == schema.ResultOK && rec.Actor.Status == schema.ResultOK
		done := false
		ended := map[int]bool{}
		for _, ev := range evs {
			if ev.At.After(at) {
				break
			}
			switch ev.What {
			case "result":
				done = true
			case "end":
				ended[ev.Episode] = true
			}
		}
		if done {
			continue
		}
		for e := range rec.Episodes {
			if ended[e] {
				continue
			}
			lastMoved := rec.Started
			for _, ev := range evs {
				if ev.At.After(at) {
					break
				}
				if ev.Episode == e && ev.At.After(lastMoved) {
					lastMoved = ev.At
				}
			}
			if at.Sub(lastMoved) > StallWindow {
				r.Stuck++
				continue
			}
			r.InFlight++
			moved := time.Time{}
			for _, ev := range evs {
				if ev.At.After(at) && (ev.Episode == e || ev.What == "result" && resultMoves) {
					moved = ev.At
					break
				}
			}
			if moved.IsZero() {
				r.Unrecovered++
				continue
			}
			r.Full = max(r.Full, moved.Sub(at))
		}
	}
	r.Measured = r.InFlight > 0
	if !first.IsZero() {
		r.FirstProgress = first.Sub(at)
	}
	if !next.IsZero() {
		r.NextCompletion = next.Sub(at)
	}
	return r
}

// completedAt is when a rollout completed: when the results of both roles
// had been stored (events in stored order), or zero if they were not.
func completedAt(evs []Event) time.Time {
	roles := map[string]bool{}
	for _, ev := range evs {
		if ev.What == "result" {
			if roles[ev.Role] = true; roles[schema.RolePlanner] && roles[schema.RoleActor] {
				return ev.At
			}
		}
	}
	return time.Time{}
}

// RecoveryStats sum up the faults of one kind.
type RecoveryStats struct {
	Faults            int           `json:"faults"`
	Failed            int           `json:"failed"` // the harness could not inject or repair it
	MedianFirst       time.Duration `json:"median_first_progress_ns"`
	MedianNext        time.Duration `json:"median_next_completion_ns"`
	MaxNext           time.Duration `json:"max_next_completion_ns"`
	MedianFull        time.Duration `json:"median_full_ns"` // over the faults after which every episode in flight moved
	MaxFull           time.Duration `json:"max_full_ns"`
	Unrecovered       int           `json:"unrecovered_episodes"` // in flight at a fault, never moved again: no time by which all had
	Stuck             int           `json:"stuck_before_episodes"`
	MedianTargetReady time.Duration `json:"median_target_ready_ns"` // from the fault until the target was ready again
}

// SumRecovery groups fault records by kind.
func SumRecovery(faults []FaultRecord) map[string]RecoveryStats {
	byKind := map[string][]FaultRecord{}
	for _, f := range faults {
		byKind[f.Kind] = append(byKind[f.Kind], f)
	}
	out := map[string]RecoveryStats{}
	for kind, fs := range byKind {
		var s RecoveryStats
		var firsts, nexts, fulls, ready []time.Duration
		for _, f := range fs {
			s.Faults++
			if f.Err != "" {
				s.Failed++
			}
			if !f.Ready.IsZero() {
				ready = append(ready, f.Ready.Sub(f.At))
			}
			if f.Recovery.FirstProgress > 0 {
				firsts = append(firsts, f.Recovery.FirstProgress)
			}
			if f.Recovery.NextCompletion > 0 {
				nexts = append(nexts, f.Recovery.NextCompletion)
				s.MaxNext = max(s.MaxNext, f.Recovery.NextCompletion)
			}
			if !f.Recovery.Measured {
				continue
			}
			s.Unrecovered += f.Recovery.Unrecovered
			s.Stuck += f.Recovery.Stuck
			if f.Recovery.Unrecovered > 0 {
				// Not every episode moved: its Full is the slowest that did,
				// no time by which all had.
				continue
			}
			fulls = append(fulls, f.Recovery.Full)
			s.MaxFull = max(s.MaxFull, f.Recovery.Full)
		}
		s.MedianFirst, s.MedianNext, s.MedianFull, s.MedianTargetReady = median(firsts), median(nexts), median(fulls), median(ready)
		out[kind] = s
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = append([]time.Duration(nil), ds...)
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}
