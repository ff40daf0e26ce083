package schema_test

import (
	"strings"
	"testing"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

// TestCheckRouting: the subject, the planact headers and the body of what a
// trainer writes must say the same thing. Only the schema header used to be
// compared (on arrivals alone), while logs took their rollout and role from
// the others; and a cancel on rollout.N.cancel.critic aborted rollout N.
func TestCheckRouting(t *testing.T) {
	arrive := &schema.Arrive{Rollout: 7, Role: schema.RolePlanner}
	cancel := &schema.Cancel{Rollout: 7, Role: schema.RoleActor}
	pause := &schema.Pause{Role: schema.RoleActor}
	resume := &schema.Resume{Role: schema.RolePlanner}
	hdr := func(kv ...string) map[string][]string {
		h := map[string][]string{}
		for i := 0; i < len(kv); i += 2 {
			h[kv[i]] = append(h[kv[i]], kv[i+1])
		}
		return h
	}
	cases := []struct {
		name string
		subj string
		h    map[string][]string
		m    schema.Message
		want string // "" = agrees
	}{
		{"arrival as the Go client sends it", "rollout.7.arrive.planner",
			hdr("Planact-Schema", "rollout.arrive/1", "Planact-Rollout", "7", "Planact-Role", "planner", "Content-Type", "application/msgpack", "Nats-Msg-Id", "x"), arrive, ""},
		{"no headers at all", "rollout.7.arrive.planner", nil, arrive, ""},
		{"rollout header written 07", "rollout.7.arrive.planner", hdr("Planact-Rollout", "07"), arrive, ""},
		{"rollout header", "rollout.7.arrive.planner", hdr("Planact-Rollout", "8"),
			arrive, `header Planact-Rollout "8" disagrees with the subject rollout.7.arrive.planner and the body (rollout 7): they must agree`},
		{"role header", "rollout.7.arrive.planner", hdr("Planact-Role", "actor"),
			arrive, `header Planact-Role "actor" disagrees with the subject rollout.7.arrive.planner and the body (role planner)`},
		{"role header in lower case", "rollout.7.arrive.planner", hdr("planact-role", "actor"), arrive, `header planact-role "actor" disagrees`},
		{"a second rollout header", "rollout.7.arrive.planner", hdr("Planact-Rollout", "7", "Planact-Rollout", "9"), arrive, `header Planact-Rollout "9" disagrees`},
		{"rollout header not a number", "rollout.7.arrive.planner", hdr("Planact-Rollout", "seven"), arrive, `header Planact-Rollout "seven" disagrees`},
		{"schema header", "rollout.7.arrive.planner", hdr("Planact-Schema", "rollout.arrive/2"),
			arrive, `header Planact-Schema "rollout.arrive/2" disagrees with the body's schema "rollout.arrive/1"`},
		{"episode header on an arrival", "rollout.7.arrive.planner", hdr("Planact-Episode", "3"),
			arrive, `header Planact-Episode "3": a rollout.arrive/1 names no episode (here rollout.7.arrive.planner); leave the header out`},
		{"node header on a cancel", "rollout.7.cancel.actor", hdr("Planact-Node", "t1-T1"), cancel, `header Planact-Node "t1-T1": a rollout.cancel/1 names no node`},
		{"subject names another rollout", "rollout.8.arrive.planner", nil, arrive,
			`the subject names rollout 8 as planner, the body rollout 7 as planner: they must agree`},
		{"subject names another role", "rollout.7.arrive.actor", nil, arrive, `the subject names rollout 7 as actor, the body rollout 7 as planner`},
		{"subject of before roles", "rollout.7.arrive", nil, arrive,
			`rollout.7.arrive names no role: a rollout.arrive/1 goes to rollout.N.arrive.<role> (here rollout.7.arrive.planner), with the role in the subject`},
		{"arrival of an unknown role", "rollout.7.arrive.plannner", nil, &schema.Arrive{Rollout: 7, Role: "plannner"},
			`rollout.7.arrive.plannner: role "plannner": want planner or actor`},
		{"cancel", "rollout.7.cancel.actor", hdr("Planact-Rollout", "7", "Planact-Role", "actor"), cancel, ""},
		{"cancel as critic", "rollout.7.cancel.critic", nil, &schema.Cancel{Rollout: 7, Role: "critic"}, `rollout.7.cancel.critic: role "critic": want planner or actor`},
		{"cancel of no role", "rollout.7.cancel.actor", nil, &schema.Cancel{Rollout: 7}, `role "": want planner or actor`},
		{"cancel with a role header that disagrees", "rollout.7.cancel.actor", hdr("Planact-Role", "planner"), cancel, `header Planact-Role "planner" disagrees`},
		{"pause", "control.actor.pause", hdr("Planact-Schema", "control.pause/1", "Planact-Role", "actor"), pause, ""},
		{"pause with a rollout header", "control.actor.pause", hdr("Planact-Rollout", "7"), pause, `header Planact-Rollout "7": a control.pause/1 names no rollout`},
		{"pause of another role than its subject's", "control.planner.pause", nil, pause,
			`the subject control.planner.pause names role planner (pause), the body role actor: they must agree`},
		{"pause on the resume subject", "control.actor.resume", nil, pause, `names role actor (resume), the body role actor`},
		{"pause as critic", "control.critic.pause", nil, &schema.Pause{Role: "critic"}, `control.critic.pause: role "critic": want planner or actor`},
		{"resume with a role header that disagrees", "control.planner.resume", hdr("Planact-Role", "actor"), resume, `header Planact-Role "actor" disagrees`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := schema.CheckRouting(c.subj, c.h, c.m)
			switch {
			case c.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("error %v\nwant one saying %s", err, c.want)
			case c.want != "" && fail.KindOf(err) != fail.Invalid:
				t.Errorf("kind %v, want invalid: %v", fail.KindOf(err), err)
			}
		})
	}
	for _, role := range []string{"planner", "actor"} {
		if err := schema.CheckRole(role); err != nil {
			t.Errorf("role %s: %v", role, err)
		}
	}
	for _, role := range []string{"", "critic", "Planner", "planner "} {
		if err := schema.CheckRole(role); err == nil {
			t.Errorf("role %q accepted", role)
		}
	}
}
