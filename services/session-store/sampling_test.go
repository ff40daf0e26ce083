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
	"github.com/planact/planact/pkg/subject"
)

// TestEachRoleBringsItsSampling: an arrival's own sampling (Arrive.Sampling)
// becomes its role's sampling in the rollout's config, its zero fields
// taking the role's defaults. Before, only the config (the planner's) set
// both roles' sampling: slime's actor job, whose eval flags are its own,
// had its model sampled as the planner's job said. A config that sets the
// role's sampling to something else makes the rollout invalid, naming
// both; one that sets it alike does not; a bad sampling refuses the
// arrival, naming the field; the role arriving again with another
// sampling is refused, naming it.
func TestEachRoleBringsItsSampling(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	arrive := func(a *schema.Arrive) error {
		t.Helper()
		a.AtMs = time.Now().UnixMilli()
		return s.handle(ctx, delivered(t, b, a))
	}
	session := func(n int64) schema.Session {
		t.Helper()
		sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
		if err != nil {
			t.Fatal(err)
		}
		return sess
	}
	rejection := func(n int64, role string) string {
		t.Helper()
		m, err := b.LastMsg(ctx, bus.StreamRollout, subject.Rejected(n, role))
		if err != nil || m == nil {
			return ""
		}
		var r schema.Result
		if err := schema.Unmarshal(m.Data, &r); err != nil || !r.Rejected {
			return ""
		}
		return r.Reason
	}
	planner := func(n int64, cfg *schema.Config) *schema.Arrive {
		return &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner:30000"},
			Tasks: []schema.Task{{Prompt: "p", Label: "l"}}, Config: cfg}
	}
	actor := func(n int64, sp *schema.Sampling) *schema.Arrive {
		return &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"}, Sampling: sp}
	}
	mustArrive := func(a *schema.Arrive) {
		t.Helper()
		if err := arrive(a); err != nil {
			t.Fatalf("%s arrival of %d: %v", a.Role, a.Rollout, err)
		}
	}

	// The actor's own sampling, the planner's config silent on it.
	mustArrive(actor(1, &schema.Sampling{Temperature: schema.Float(0.2), MaxNewTokens: 64}))
	mustArrive(planner(1, &schema.Config{MaxTurns: 2, PlannerSampling: schema.Sampling{MaxNewTokens: 512}}))
	sess := session(1)
	a, p := sess.Config.ActorSampling, sess.Config.PlannerSampling
	if sess.State != schema.SessionRunning || a.Temperature == nil || *a.Temperature != 0.2 || a.TopP == nil || *a.TopP != 1 || a.MaxNewTokens != 64 {
		t.Errorf("rollout 1 (%s %s): actor_sampling %+v; want the actor's arrival's (temperature 0.2, max_new_tokens 64), top_p its default 1", sess.State, sess.Reason, a)
	}
	if p.MaxNewTokens != 512 {
		t.Errorf("rollout 1: planner_sampling %+v; want the planner's config's", p)
	}

	// The planner's config sets the actor's sampling too, to the same.
	mustArrive(planner(2, &schema.Config{ActorSampling: schema.Sampling{Temperature: schema.Float(0.2), MaxNewTokens: 64, TopP: schema.Float(1)}}))
	mustArrive(actor(2, &schema.Sampling{Temperature: schema.Float(0.2), MaxNewTokens: 64}))
	if sess := session(2); sess.State != schema.SessionRunning {
		t.Errorf("rollout 2, the same sampling in the config and the arrival: %s %s; want it running", sess.State, sess.Reason)
	}

	// To something else: which one is meant is the user's to say.
	mustArrive(planner(3, &schema.Config{ActorSampling: schema.Sampling{Temperature: schema.Float(0.9)}}))
	mustArrive(actor(3, &schema.Sampling{Temperature: schema.Float(0.2)}))
	sess = session(3)
	if sess.Status != schema.ResultInvalid || !strings.Contains(sess.Reason, "actor_sampling") ||
		!strings.Contains(sess.Reason, `"temperature":0.2`) || !strings.Contains(sess.Reason, `"temperature":0.9`) {
		t.Errorf("rollout 3, two actor samplings: %s %q; want it invalid, naming both", sess.Status, sess.Reason)
	}

	// A planner's own max_new_tokens beyond the config's context.
	mustArrive(planner(4, &schema.Config{MaxContextTokens: 1024}))
	mustArrive(&schema.Arrive{Rollout: 4, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"}})
	_ = arrive(&schema.Arrive{Rollout: 5, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner:30000"},
		Tasks: []schema.Task{{Prompt: "p"}}, Config: &schema.Config{MaxContextTokens: 1024}, Sampling: &schema.Sampling{MaxNewTokens: 4096}})
	mustArrive(actor(5, nil))
	if sess := session(5); sess.Status != schema.ResultInvalid || !strings.Contains(sess.Reason, "planner_sampling.max_new_tokens 4096") {
		t.Errorf("rollout 5, the planner's own max_new_tokens over max_context_tokens: %s %q; want it invalid, naming it", sess.Status, sess.Reason)
	}

	// A bad sampling refuses the arrival.
	_ = arrive(actor(6, &schema.Sampling{Temperature: schema.Float(170)}))
	if r := rejection(6, schema.RoleActor); !strings.Contains(r, "sampling.temperature 170") {
		t.Errorf("an arrival with temperature 170: rejection %q; want it refused, naming sampling.temperature", r)
	}

	// The actor again, asking for another sampling.
	mustArrive(actor(7, &schema.Sampling{Temperature: schema.Float(0.2)}))
	again := actor(7, &schema.Sampling{Temperature: schema.Float(0.3)})
	again.Attempt = "2"
	_ = arrive(again)
	if r := rejection(7, schema.RoleActor); !strings.Contains(r, `sampling {"temperature":0.3}, was {"temperature":0.2}`) {
		t.Errorf("the actor arriving again with another sampling: rejection %q; want it refused, naming both", r)
	}
}

// TestAChatPlannerCannotGoSecond: in peer_review the actor answers first,
// and the planner's first turn brings two new messages (the task and the
// actor's answer); on openai-chat the ids of the first cannot be had as
// the chat template renders them, and every episode used to end as token
// drift. The rollout is refused at the start, naming the mode, the
// protocol and what to use; the same mode on sglang runs.
func TestAChatPlannerCannotGoSecond(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for n, proto := range map[int64]string{11: engine.ProtocolOpenAIChat, 12: engine.ProtocolSGLang} {
		for _, a := range []*schema.Arrive{
			{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner:30000", Protocol: proto, Model: "m"},
				Tasks: []schema.Task{{Prompt: "p", Label: "l"}}, Config: &schema.Config{Mode: schema.ModePeerReview, MaxTurns: 3}},
			{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"}},
		} {
			a.AtMs = time.Now().UnixMilli()
			if err := s.handle(ctx, delivered(t, b, a)); err != nil {
				t.Fatal(err)
			}
		}
		sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
		if err != nil {
			t.Fatal(err)
		}
		refused := sess.Status == schema.ResultInvalid && strings.Contains(sess.Reason, "mode peer_review with a planner on protocol openai-chat")
		if want := proto == engine.ProtocolOpenAIChat; refused != want || !want && sess.State != schema.SessionRunning {
			t.Errorf("peer_review, planner on %s: %s %s %q; want refused %v", proto, sess.State, sess.Status, sess.Reason, want)
		}
	}
}
