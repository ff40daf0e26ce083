package sessionstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
)

// TestAChatPlannerWithStopsIsRefused: a chat reply's text leaves out the
// stop string its token ids hold; sent back as the assistant's message,
// the chat template renders the turn without those tokens, and every
// episode of a chat planner with stop strings ended as token drift at its
// second planner turn. The rollout is refused at the start, naming the
// stop strings and the protocol; with one planner turn, or on sglang, it
// runs.
func TestAChatPlannerWithStopsIsRefused(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		n        int64
		proto    string
		maxTurns int
		refused  bool
	}{
		{21, engine.ProtocolOpenAIChat, 3, true},
		{22, engine.ProtocolOpenAIChat, 1, false},
		{23, engine.ProtocolSGLang, 3, false},
	} {
		for _, a := range []*schema.Arrive{
			{Rollout: tc.n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner:30000", Protocol: tc.proto, Model: "m"},
				Tasks:  []schema.Task{{Prompt: "p", Label: "l"}},
				Config: &schema.Config{MaxTurns: tc.maxTurns, PlannerSampling: schema.Sampling{Stop: []string{"</plan>"}}}},
			{Rollout: tc.n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"}},
		} {
			a.AtMs = time.Now().UnixMilli()
			if err := s.handle(ctx, delivered(t, b, a)); err != nil {
				t.Fatal(err)
			}
		}
		sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(tc.n))
		if err != nil {
			t.Fatal(err)
		}
		refused := sess.Status == schema.ResultInvalid && strings.Contains(sess.Reason, `planner_sampling.stop ["</plan>"] with a planner on protocol openai-chat`)
		if refused != tc.refused || !tc.refused && sess.State != schema.SessionRunning {
			t.Errorf("planner on %s, max_turns %d: %s %s %q; want refused %v", tc.proto, tc.maxTurns, sess.State, sess.Status, sess.Reason, tc.refused)
		}
	}
}
