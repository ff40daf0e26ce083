package actdispatcher

import (
	"testing"

	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
)

// Only the actor model's acts take the slots of an actor engine that
// states its capacity (twice it, per replica): a Go or HTTP tool's acts,
// and a mode's own (an ensemble's vote), take the replica's. Before, a Go
// tool's took the actor engine's, and a few slow ones held back every act
// of the actor model on the replica.
func TestOnlyTheActorsActsTakeTheActorEnginesSlots(t *testing.T) {
	for _, tc := range []struct {
		mode  string
		tool  string
		actor bool
	}{
		{schema.ModePlanAct, "search", true},
		{schema.ModePlanAct, "code", false},
		{schema.ModePlanAct, "retrieve", false},
		{schema.ModeEnsemble, "vote", false},
	} {
		cfg := schema.Config{Mode: tc.mode, Tools: []schema.Tool{
			{Name: "search", Kind: schema.ToolActor},
			{Name: "code", Kind: schema.ToolGo},
			{Name: "retrieve", Kind: schema.ToolHTTP, URL: "http://retrieval.invalid/retrieve"},
		}}.WithDefaults()
		info := &session.Info{Session: schema.Session{Rollout: 1, Config: cfg,
			Roles: map[string]schema.RoleInfo{schema.RoleActor: {Engine: schema.Engine{URL: "http://actor.invalid", MaxInFlight: 1}}}}}
		s := &Service{slots: make(chan struct{}, 16), engines: map[schema.Engine]chan struct{}{}}
		got := s.slotsFor(info, &act{Key: "t1-a", Node: plan.Node{ID: "a", Tool: tc.tool}})
		switch {
		case tc.actor && (got == s.slots || cap(got) != 2):
			t.Errorf("%s: an act of %s takes a slot of the replica's %d; want one of the actor engine's 2", tc.mode, tc.tool, cap(got))
		case !tc.actor && got != s.slots:
			t.Errorf("%s: an act of %s takes a slot of the actor engine's %d; want one of the replica's", tc.mode, tc.tool, cap(got))
		}
	}
}
