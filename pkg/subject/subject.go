// Package subject builds and parses the NATS subjects planact speaks
// (DESIGN §2). Rollout ids, episode indexes and node keys are subject tokens,
// so `nats sub 'act.7.>'` follows one rollout.
package subject

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// Wildcard filters the services consume.
const (
	AllArrive     = "rollout.*.arrive.*"
	AllEpisodeEnd = "rollout.*.end.*"
	AllTimeout    = "rollout.*.timeout.*"
	AllCancel     = "rollout.*.cancel.*"
	// Before roles were in these subjects; still consumed, to tell a
	// trainer written against them where to publish instead.
	LegacyArrive  = "rollout.*.arrive"
	LegacyCancel  = "rollout.*.cancel"
	AllPlanReq    = "plan.*.req.*"
	AllPlanOut    = "plan.*.out.*"
	AllPlanPart   = "plan.*.partial.*"
	AllPlanDAG    = "plan.*.dag.*"
	AllPlanAnswer = "plan.*.answer.*"
	AllPlanError  = "plan.*.error.*"
	AllActDone    = "act.*.done.>"
)

// Arrive is where a trainer of role announces itself for rollout n. The
// role is in the subject so that the server's permissions can let each
// trainer arrive as its own role only.
func Arrive(n int64, role string) string { return fmt.Sprintf("rollout.%d.arrive.%s", n, role) }

// ArriveOf matches every arrival of role.
func ArriveOf(role string) string { return "rollout.*.arrive." + role }

// CancelOf matches every cancel of role.
func CancelOf(role string) string { return "rollout.*.cancel." + role }

// Start is published once when the barrier releases rollout n.
func Start(n int64) string { return fmt.Sprintf("rollout.%d.start", n) }

// Status carries lifecycle events of rollout n for people watching.
func Status(n int64) string { return fmt.Sprintf("rollout.%d.status", n) }

// Result carries role's samples of rollout n.
func Result(n int64, role string) string { return fmt.Sprintf("rollout.%d.result.%s", n, role) }

// Group carries role's samples of group g of rollout n, as soon as every
// task of the group has ended (and passed the rollout's group filter).
func Group(n int64, role string, g int) string {
	return fmt.Sprintf("rollout.%d.result.%s.group.%d", n, role, g)
}

// Groups matches every group of role's of rollout n.
func Groups(n int64, role string) string { return fmt.Sprintf("rollout.%d.result.%s.group.*", n, role) }

// Control subjects: a trainer pauses its role's generations before it
// swaps weights and resumes them after (not tied to one rollout). The
// session-store takes the pauses and resumes and answers each (paused,
// resumed, or refused: one it will not apply); a gateway says, on
// control.<role>.drained.<gateway>, that it runs none of the role's
// generations any more.
const (
	AllPause  = "control.*.pause"
	AllResume = "control.*.resume"
)

// Control is where the trainer of role sends a control verb (pause, resume)
// and where planact answers (paused, resumed, refused, drained, expired,
// rollback).
func Control(role, verb string) string { return fmt.Sprintf("control.%s.%s", role, verb) }

// Presence is where a gateway (a service instance id) renews its notice
// that it runs role's generations: presence.<role>.<gateway>.
func Presence(role, gateway string) string { return "presence." + role + "." + gateway }

// AllPresence matches the presence notices of role's gateways.
func AllPresence(role string) string { return "presence." + role + ".*" }

// ParseControl reads control.<role>.<verb>; ok is false for any other
// subject (a drained answer, control.<role>.drained.<gateway>, included).
func ParseControl(s string) (role, verb string, ok bool) {
	t := strings.Split(s, ".")
	if len(t) != 3 || t[0] != "control" {
		return "", "", false
	}
	return t[1], t[2], true
}

// Rejected answers one arrival of role that planact refused; it stays apart
// from Result so that a rejection never hides the rollout's real result.
func Rejected(n int64, role string) string {
	return fmt.Sprintf("rollout.%d.result.%s.rejected", n, role)
}

// CancelAnswer holds planact's answer to the cancel of rollout n by role
// whose Nats-Msg-Id is id (as rollout.<n>.status does, among the
// rollout's events): the last message there is the answer, which the
// trainer reads from the stream when it may have missed it. The token is
// the first 32 hex digits of the id's SHA-256, for an id may hold dots.
func CancelAnswer(n int64, role, id string) string {
	sum := sha256.Sum256([]byte(id))
	return fmt.Sprintf("rollout.%d.result.%s.cancel.%s", n, role, hex.EncodeToString(sum[:16]))
}

// EpisodeEnd says that episode e of rollout n has ended.
func EpisodeEnd(n int64, e int) string { return fmt.Sprintf("rollout.%d.end.%d", n, e) }

// Timeout fires (as a scheduled message) when a deadline of rollout n passes;
// kind is "barrier" or "rollout".
func Timeout(n int64, kind string) string { return fmt.Sprintf("rollout.%d.timeout.%s", n, kind) }

// TimeoutSchedule is the subject that holds the schedule of a time-out.
func TimeoutSchedule(n int64, kind string) string {
	return fmt.Sprintf("rollout.%d.schedule.%s", n, kind)
}

// Cancel is where the trainer of role asks planact to abort rollout n.
func Cancel(n int64, role string) string { return fmt.Sprintf("rollout.%d.cancel.%s", n, role) }

// PlanReq asks the planner for episode e's next turn.
func PlanReq(n int64, e int) string { return fmt.Sprintf("plan.%d.req.%d", n, e) }

// PlanOut carries the planner's full output for a turn.
func PlanOut(n int64, e int) string { return fmt.Sprintf("plan.%d.out.%d", n, e) }

// PlanPartial carries the planner's output so far, while it still writes.
func PlanPartial(n int64, e int) string { return fmt.Sprintf("plan.%d.partial.%d", n, e) }

// PlanDAG carries a parsed, validated plan.
func PlanDAG(n int64, e int) string { return fmt.Sprintf("plan.%d.dag.%d", n, e) }

// PlanAnswer carries a final answer.
func PlanAnswer(n int64, e int) string { return fmt.Sprintf("plan.%d.answer.%d", n, e) }

// PlanError carries a parse error.
func PlanError(n int64, e int) string { return fmt.Sprintf("plan.%d.error.%d", n, e) }

// ActDone carries the outcome of node key k.
func ActDone(n int64, e int, k string) string { return fmt.Sprintf("act.%d.done.%d.%s", n, e, k) }

// ActRetries carries the retries recorded of node key k (actor-gateways
// record each before the engine is called), all of them in its last
// message.
func ActRetries(n int64, e int, k string) string {
	return fmt.Sprintf("act.%d.retries.%d.%s", n, e, k)
}

// ActOf matches every message of node key k: its outcome and its retries.
func ActOf(n int64, e int, k string) string { return fmt.Sprintf("act.%d.*.%d.%s", n, e, k) }

// ActDoneFilter matches every act outcome of rollout n.
func ActDoneFilter(n int64) string { return fmt.Sprintf("act.%d.done.>", n) }

// ActDones matches the act outcomes of episode e of rollout n.
func ActDones(n int64, e int) string { return fmt.Sprintf("act.%d.done.%d.*", n, e) }

// NodeKey is the episode-unique key of node id in turn t, safe as one
// subject token and as part of a KV key: "t1-T3".
func NodeKey(turn int, id string) string { return fmt.Sprintf("t%d-%s", turn, Token(id)) }

// TurnOfKey is the turn a node key (NodeKey) names; ok is false for a key
// that is not one.
func TurnOfKey(key string) (turn int, ok bool) {
	rest, found := strings.CutPrefix(key, "t")
	n, _, found2 := strings.Cut(rest, "-")
	if !found || !found2 {
		return 0, false
	}
	turn, err := strconv.Atoi(n)
	return turn, err == nil && turn > 0
}

// Token makes s safe as a single subject token and KV key part: anything
// but letters, digits, '-' and '_' becomes '_'.
func Token(s string) string {
	if s == "" {
		return "_"
	}
	b := []byte(s)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
		if !ok {
			b[i] = '_'
		}
	}
	return string(b)
}

// Parsed is what a planact subject names.
type Parsed struct {
	Domain  string // rollout, plan or act
	Verb    string // arrive, start, req, out, run, done, result, …
	Rollout int64
	Episode int    // -1 when the subject names none
	Node    string // node key, for act subjects
	Role    string // for results
	Detail  string // time-out kind
}

// Parse reads a planact subject.
func Parse(s string) (Parsed, error) {
	t := strings.Split(s, ".")
	if len(t) < 3 {
		return Parsed{}, fmt.Errorf("subject %q: too few tokens", s)
	}
	n, err := strconv.ParseInt(t[1], 10, 64)
	if err != nil {
		return Parsed{}, fmt.Errorf("subject %q: rollout %q is not an integer", s, t[1])
	}
	p := Parsed{Domain: t[0], Verb: t[2], Rollout: n, Episode: -1}
	episode := func(i int) error {
		if len(t) <= i {
			return fmt.Errorf("subject %q: missing episode", s)
		}
		e, err := strconv.Atoi(t[i])
		if err != nil {
			return fmt.Errorf("subject %q: episode %q is not an integer", s, t[i])
		}
		p.Episode = e
		return nil
	}
	switch t[0] {
	case "rollout":
		switch p.Verb {
		case "end":
			err = episode(3)
		case "result":
			if len(t) < 4 {
				return p, fmt.Errorf("subject %q: missing role", s)
			}
			p.Role = t[3]
		case "arrive", "cancel":
			if len(t) > 3 {
				p.Role = t[3] // absent on the subjects of before roles were in them
			}
		case "timeout", "schedule":
			if len(t) < 4 {
				return p, fmt.Errorf("subject %q: missing time-out kind", s)
			}
			p.Detail = t[3]
		}
	case "plan":
		err = episode(3)
	case "act":
		if err = episode(3); err == nil {
			if len(t) < 5 {
				return p, fmt.Errorf("subject %q: missing node", s)
			}
			p.Node = strings.Join(t[4:], ".")
		}
	default:
		return p, fmt.Errorf("subject %q: unknown domain %q", s, t[0])
	}
	return p, err
}

// Matches says whether subject subj matches filter, which may hold the
// wildcards * (one token) and > (the rest).
func Matches(filter, subj string) bool {
	f, t := strings.Split(filter, "."), strings.Split(subj, ".")
	for i, tok := range f {
		switch {
		case tok == ">":
			return len(t) > i
		case i >= len(t):
			return false
		case tok != "*" && tok != t[i]:
			return false
		}
	}
	return len(f) == len(t)
}
