package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// board is what `planact watch` shows without -v: one line per rollout,
// built from the rollout's own messages on ROLLOUT (start, status, episode
// ends, results), so that it shows rollouts that ran before it started as
// well as those running now.
type board struct {
	rows  map[int64]*boardRow
	order []int64 // rollouts in the order first seen
}

// boardRow is one rollout's progress.
type boardRow struct {
	n         int64
	arrived   []string             // roles that arrived, before the start
	arrivedAt map[string]time.Time // by role, when its last arrival was stored
	// refused holds, by role, why its last arrival was refused, while no
	// arrival of the role came after it: shown until the rollout starts.
	refused map[string]refusal
	started time.Time
	progressCounts
	byStatus map[string]int // episodes ended, by status
	status   string         // the first result's status, once one came: the rollout has ended
	// results are each role's result, as it came: each has its own status
	// (the actor's can be failed where the planner's is ok).
	results  map[string]roleResult
	accuracy float64
	scored   bool // accuracy and the counts are a result's (one that holds its episodes' figures)
	finished time.Time
}

// roleResult is a role's result as the board shows it.
type roleResult struct{ status, reason string }

// refusal is a role's arrival refused: why, and when it was stored.
type refusal struct {
	reason string
	at     time.Time
}

func newBoard() *board { return &board{rows: map[int64]*boardRow{}} }

func (b *board) row(n int64) *boardRow {
	r, ok := b.rows[n]
	if !ok {
		r = &boardRow{n: n, byStatus: map[string]int{}}
		b.rows[n] = r
		b.order = append(b.order, n)
	}
	return r
}

// apply takes one message of the ROLLOUT stream, stored at at; it reports
// whether the board changed. Messages it does not use are ignored.
func (b *board) apply(subj string, data []byte, at time.Time) bool {
	p, err := subject.Parse(subj)
	if err != nil || p.Domain != "rollout" {
		return false
	}
	switch p.Verb {
	case "arrive":
		// rollout.N.arrive, of before roles were in the subject, is kept
		// on ROLLOUT for the admin and never taken as an arrival: only a
		// trainer's stream holds those (rollout.N.arrive.<role>).
		if !slices.Contains(bus.Roles, p.Role) {
			return false
		}
	case "start", "status", "end", "result":
	default:
		return false // a cancel: no rollout line of its own
	}
	r := b.row(p.Rollout)
	switch p.Verb {
	case "arrive":
		// The role is the subject's last token: the body (which may
		// carry thousands of tasks) is not read.
		role := p.Role
		if r.arrivedAt == nil {
			r.arrivedAt = map[string]time.Time{}
		}
		if at.After(r.arrivedAt[role]) {
			r.arrivedAt[role] = at
		}
		// The arrivals and the refusals are read from different streams,
		// in no set order: a refusal stands if no arrival came after it.
		changed := false
		if f, ok := r.refused[role]; ok && at.After(f.at) {
			delete(r.refused, role)
			changed = true
		}
		if slices.Contains(r.arrived, role) {
			return changed
		}
		r.arrived = append(r.arrived, role)
	case "start":
		var v schema.Start
		if schema.Unmarshal(data, &v) != nil {
			return false
		}
		r.started, r.episodes = at, v.Episodes
	case "status":
		// Once its result came, a rollout's counts are the result's: a
		// status event stored after it (published by a handler that ran at
		// the same time) is older news.
		var v schema.Status
		if r.status != "" || schema.Unmarshal(data, &v) != nil || v.Episodes == 0 {
			return false
		}
		return r.advance(v.Episodes, v.Ended, v.Acts)
	case "end":
		var v schema.EpisodeEnd
		if schema.Unmarshal(data, &v) != nil {
			return false
		}
		r.byStatus[v.Status]++
	case "result":
		switch t := strings.Split(subj, "."); {
		case len(t) == 5 && t[4] == "rejected":
			return r.refuse(p.Role, data, at)
		case len(t) != 4:
			return false // a group's samples, not the rollout's result
		}
		if _, seen := r.results[p.Role]; seen || !slices.Contains(bus.Roles, p.Role) {
			return false // the role's first result is its result
		}
		var v schema.Result
		var head struct {
			schema.Envelope
			Status string       `json:"status"`
			Reason string       `json:"reason"`
			Stats  schema.Stats `json:"stats"`
		}
		if schema.UnmarshalPart(data, &v, &head) != nil {
			return false
		}
		if r.results == nil {
			r.results = map[string]roleResult{}
		}
		r.results[p.Role] = roleResult{head.Status, head.Reason}
		if r.status == "" {
			r.status, r.finished = head.Status, at
		}
		// The roles' results count the same episodes; one that holds none
		// of its samples (they could not be delivered) counts no episode
		// figure, and the other's are taken.
		if st := head.Stats; !r.scored && st.Episodes > 0 && len(st.EpisodeStatus) > 0 {
			r.scored, r.accuracy, r.episodes, r.ended = true, st.Accuracy, st.Episodes, 0
			for _, c := range st.EpisodeStatus {
				r.ended += c
			}
			r.acts = max(r.acts, st.Acts+st.CachedActs)
		}
	default:
		return false
	}
	return true
}

// refuse takes an arrival of role that planact refused (its answer on
// rollout.N.result.<role>.rejected): never the rollout's result, which a
// corrected arrival may still bring; shown only while the rollout has not
// started and no arrival of the role came after it.
func (r *boardRow) refuse(role string, data []byte, at time.Time) bool {
	var head struct {
		schema.Envelope
		Reason string `json:"reason"`
	}
	if !r.started.IsZero() || r.status != "" || !at.After(r.arrivedAt[role]) || schema.UnmarshalPart(data, &schema.Result{}, &head) != nil {
		return false
	}
	if r.refused == nil {
		r.refused = map[string]refusal{}
	}
	r.refused[role] = refusal{reason: head.Reason, at: at}
	return true
}

// shown are the rollouts to draw: every running one and the most recent
// finished ones, at most limit lines, oldest first.
func (b *board) shown(limit int) []*boardRow {
	var out []*boardRow
	for i := len(b.order) - 1; i >= 0 && len(out) < limit; i-- {
		out = append(out, b.rows[b.order[i]])
	}
	slices.Reverse(out)
	return out
}

// line is r as one line: a bar of episodes ended of all, the acts, the
// failures, and how it ended.
func (r *boardRow) line(width int) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "rollout %-6d ", r.n)
	switch {
	case r.started.IsZero() && r.status == "":
		// An arrival refused (and none of its role since) waits for
		// nothing: the roles whose arrival was taken wait at the barrier.
		var waiting []string
		for _, role := range r.arrived {
			if _, refused := r.refused[role]; !refused {
				waiting = append(waiting, role)
			}
		}
		switch {
		case len(r.arrived) == 0:
			sb.WriteString("seen")
		case len(waiting) == 0:
			sb.WriteString("no arrival taken")
		default:
			fmt.Fprintf(&sb, "waiting at the barrier (%s arrived)", strings.Join(waiting, ", "))
		}
		for _, role := range slices.Sorted(maps.Keys(r.refused)) {
			fmt.Fprintf(&sb, "; %s arrival refused: %s", role, r.refused[role].reason)
		}
		return sb.String()
	}
	sb.WriteString(bar(r.ended, r.episodes, width))
	fmt.Fprintf(&sb, " %d/%d episodes, %d acts", r.ended, r.episodes, r.acts)
	if f := r.byStatus[schema.EpisodeFailed]; f > 0 {
		fmt.Fprintf(&sb, ", %d failed", f)
	}
	if t := r.byStatus[schema.EpisodeTruncated]; t > 0 {
		fmt.Fprintf(&sb, ", %d truncated", t)
	}
	if r.status == "" {
		if !r.started.IsZero() {
			fmt.Fprintf(&sb, "  running %s", time.Since(r.started).Truncate(time.Second))
		}
		return sb.String()
	}
	statuses, reasons := r.ends()
	fmt.Fprintf(&sb, "  %s", statuses)
	if r.scored {
		fmt.Fprintf(&sb, ", accuracy %.2f", r.accuracy)
	}
	if !r.started.IsZero() && !r.finished.IsZero() {
		fmt.Fprintf(&sb, ", %s", r.finished.Sub(r.started).Round(time.Millisecond))
	}
	if reasons != "" {
		fmt.Fprintf(&sb, " (%s)", reasons)
	}
	return sb.String()
}

// ends says how the rollout ended for each role whose result came: its
// status and why, once when every result says the same ("ok"), else role
// by role ("planner ok, actor failed", with "actor: why").
func (r *boardRow) ends() (statuses, reasons string) {
	var roles []string
	for _, role := range bus.Roles {
		if _, ok := r.results[role]; ok {
			roles = append(roles, role)
		}
	}
	first := r.results[roles[0]]
	same := true
	for _, role := range roles[1:] {
		same = same && r.results[role] == first
	}
	if same {
		return first.status, first.reason
	}
	var st, why []string
	for _, role := range roles {
		rr := r.results[role]
		st = append(st, role+" "+rr.status)
		if rr.reason != "" {
			why = append(why, role+": "+rr.reason)
		}
	}
	return strings.Join(st, ", "), strings.Join(why, "; ")
}

// bar draws done of all in width cells.
func bar(done, all, width int) string {
	filled := 0
	if all > 0 {
		filled = min(width, done*width/all)
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat("-", width-filled) + "]"
}

// boardWriter draws a board: on a terminal it redraws its lines in place;
// otherwise it prints a rollout's line each time it changes.
type boardWriter struct {
	w     io.Writer
	tty   bool
	drawn int // lines drawn last time, on a terminal
	last  map[int64]string
}

const boardLines = 20 // rollouts shown at once on a terminal

func (bw *boardWriter) draw(b *board) {
	if !bw.tty {
		if bw.last == nil {
			bw.last = map[int64]string{}
		}
		for _, n := range b.order {
			l := printable(b.rows[n].line(20), "")
			// The running time changes every second; a plain log shows
			// progress, not the clock.
			key := l
			if i := strings.Index(l, "  running "); i >= 0 {
				key = l[:i]
			}
			if bw.last[n] != key {
				bw.last[n] = key
				fmt.Fprintln(bw.w, l)
			}
		}
		return
	}
	rows := b.shown(boardLines)
	if bw.drawn > 0 {
		fmt.Fprintf(bw.w, "\033[%dA", bw.drawn)
	}
	for _, r := range rows {
		fmt.Fprintf(bw.w, "\r\033[K%s\n", printable(r.line(30), ""))
	}
	bw.drawn = len(rows)
}
