package schema

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/subject"
)

// Roles lists the roles planact has: the two training jobs.
var Roles = []string{RolePlanner, RoleActor}

// CheckRole refuses a role planact does not have: a subject or message
// that names one (rollout.N.cancel.critic) names nothing planact runs.
func CheckRole(role string) error {
	if slices.Contains(Roles, role) {
		return nil
	}
	return fail.Invalidf("role %q: want %s or %s", role, RolePlanner, RoleActor)
}

// CheckRouting checks that a message a trainer wrote (arrival, cancel,
// pause, resume) says the same thing everywhere it says it, before anything
// acts on it: its role is planner or actor, its subject is the one its body
// belongs on (same rollout, same role), and every planact header it carries
// names what the body does. Permissions go by the subject, logs by the
// headers, the handler by the body: a message whose parts disagree is
// refused, whichever part is wrong.
func CheckRouting(subj string, h map[string][]string, m Message) error {
	meta := m.Meta()
	if role := subjectRole(subj); role != "" {
		if err := CheckRole(role); err != nil {
			return fail.Invalidf("%s: %w", subj, err)
		}
	}
	if err := CheckRole(meta.Role); err != nil {
		return err
	}
	if want := m.Subject(); subj != want {
		return fail.E(fail.Invalid, disagreement(subj, m))
	}
	return checkHeaders(subj, h, m)
}

// subjectRole is the role a trainer's subject names, "" if none.
func subjectRole(subj string) string {
	if role, _, ok := subject.ParseControl(subj); ok {
		return role
	}
	if p, err := subject.Parse(subj); err == nil && p.Domain == "rollout" {
		return p.Role
	}
	return ""
}

// disagreement says how subject subj and message m, which belongs on
// another subject, disagree.
func disagreement(subj string, m Message) error {
	meta := m.Meta()
	if role, verb, ok := subject.ParseControl(subj); ok {
		return fmt.Errorf("the subject %s names role %s (%s), the body role %s: they must agree", subj, role, verb, meta.Role)
	}
	p, err := subject.Parse(subj)
	switch {
	case err == nil && p.Domain == "rollout" && p.Role == "":
		return fmt.Errorf("%s names no role: a %s goes to rollout.N.%s.<role> (here %s), with the role in the subject", subj, m.Kind(), p.Verb, m.Subject())
	case err == nil && p.Domain == "rollout":
		return fmt.Errorf("the subject names rollout %d as %s, the body rollout %d as %s: they must agree", p.Rollout, p.Role, meta.Rollout, meta.Role)
	}
	return fmt.Errorf("a %s for this body goes to %s, not %s", m.Kind(), m.Subject(), subj)
}

// checkHeaders refuses a planact header that names something else than the
// message's subject and body, or that a message of its kind never carries
// (an episode on an arrival). Header names are matched without regard to
// case, and every value of a repeated header counts.
func checkHeaders(subj string, h map[string][]string, m Message) error {
	meta := m.Meta()
	for _, want := range []struct {
		name, what, value string
		has, number       bool
	}{
		{HdrSchema, "schema", m.Kind(), true, false},
		{HdrRollout, "rollout", strconv.FormatInt(meta.Rollout, 10), meta.Rollout >= 0, true},
		{HdrRole, "role", meta.Role, meta.Role != "", false},
		{HdrEpisode, "episode", strconv.Itoa(meta.Episode), meta.Episode >= 0, true},
		{HdrTurn, "turn", strconv.Itoa(meta.Turn), meta.Turn > 0, true},
		{HdrNode, "node", meta.Node, meta.Node != "", false},
	} {
		for name, values := range h {
			if !strings.EqualFold(name, want.name) {
				continue
			}
			for _, got := range values {
				switch {
				case !want.has:
					return fail.Invalidf("header %s %q: a %s names no %s (here %s); leave the header out", name, got, m.Kind(), want.what, subj)
				case got == want.value:
				case want.number && sameNumber(got, want.value):
				case want.name == HdrSchema:
					return fail.Invalidf("header %s %q disagrees with the body's schema %q", name, got, want.value)
				default:
					return fail.Invalidf("header %s %q disagrees with the subject %s and the body (%s %s): they must agree", name, got, subj, want.what, want.value)
				}
			}
		}
	}
	return nil
}

// sameNumber reports whether header value got is the integer want.
func sameNumber(got, want string) bool {
	g, err := strconv.ParseInt(got, 10, 64)
	w, _ := strconv.ParseInt(want, 10, 64)
	return err == nil && g == w
}
