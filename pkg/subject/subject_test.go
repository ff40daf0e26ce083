package subject

import "testing"

func TestParseRoundTrip(t *testing.T) {
	cases := []struct {
		subject string
		want    Parsed
	}{
		{Arrive(7, "planner"), Parsed{Domain: "rollout", Verb: "arrive", Rollout: 7, Episode: -1, Role: "planner"}},
		{Cancel(7, "actor"), Parsed{Domain: "rollout", Verb: "cancel", Rollout: 7, Episode: -1, Role: "actor"}},
		{"rollout.7.arrive", Parsed{Domain: "rollout", Verb: "arrive", Rollout: 7, Episode: -1}},
		{Result(7, "actor"), Parsed{Domain: "rollout", Verb: "result", Rollout: 7, Episode: -1, Role: "actor"}},
		{EpisodeEnd(7, 3), Parsed{Domain: "rollout", Verb: "end", Rollout: 7, Episode: 3}},
		{Timeout(7, "barrier"), Parsed{Domain: "rollout", Verb: "timeout", Rollout: 7, Episode: -1, Detail: "barrier"}},
		{PlanReq(12, 0), Parsed{Domain: "plan", Verb: "req", Rollout: 12, Episode: 0}},
		{PlanDAG(12, 4), Parsed{Domain: "plan", Verb: "dag", Rollout: 12, Episode: 4}},
		{ActDone(1, 2, NodeKey(1, "step.1 x")), Parsed{Domain: "act", Verb: "done", Rollout: 1, Episode: 2, Node: "t1-step_1_x"}},
	}
	for _, c := range cases {
		got, err := Parse(c.subject)
		if err != nil {
			t.Fatalf("Parse(%q): %v", c.subject, err)
		}
		if got != c.want {
			t.Errorf("Parse(%q) = %+v, want %+v", c.subject, got, c.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, s := range []string{"rollout", "rollout.x.arrive", "plan.1.req", "plan.1.req.e", "act.1.run.2", "foo.1.bar", "rollout.1.result"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q): want error", s)
		}
	}
}

func TestToken(t *testing.T) {
	for in, want := range map[string]string{"T1": "T1", "a.b": "a_b", "x y*>": "x_y__", "": "_", "step-1_a": "step-1_a"} {
		if got := Token(in); got != want {
			t.Errorf("Token(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTurnOfKey(t *testing.T) {
	for key, want := range map[string]int{"t1-s1": 1, "t12-x-c2": 12, NodeKey(3, "a_b"): 3, "s1": 0, "t-s1": 0, "tx-s1": 0, "t0-s1": 0, "t2": 0} {
		got, ok := TurnOfKey(key)
		if got != want || ok != (want > 0) {
			t.Errorf("TurnOfKey(%q) = %d, %v; want %d", key, got, ok, want)
		}
	}
}
