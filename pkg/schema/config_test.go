package schema_test

import (
	"math"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
)

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(*schema.Config)
		field string // "" = valid
	}{
		{"defaults", func(*schema.Config) {}, ""},
		{"remote reward", func(c *schema.Config) { c.Reward = "http://rm:8000/score" }, ""},
		{"forced format", func(c *schema.Config) { c.ParseFormat = "steps" }, ""},
		{"no retries", func(c *schema.Config) { c.ActRetries = -1 }, ""},
		{"greedy", func(c *schema.Config) { c.ActorSampling.Temperature = schema.Float(0) }, ""},
		{"peer review", func(c *schema.Config) { c.Mode = schema.ModePeerReview }, ""},
		{"unknown mode", func(c *schema.Config) { c.Mode = "debate" }, `mode "debate": want one of plan_act, peer_review, ensemble`},
		{"ensemble", func(c *schema.Config) { c.Mode, c.EnsembleK = schema.ModeEnsemble, 5 }, ""},
		{"ensemble of one", func(c *schema.Config) { c.Mode, c.EnsembleK = schema.ModeEnsemble, 1 }, "ensemble_k 1: want 2 to 16"},
		{"ensemble_k without ensemble", func(c *schema.Config) { c.EnsembleK = 3 }, "only for mode ensemble"},
		{"split_act_reward in peer_review", func(c *schema.Config) { c.Mode, c.MaxTurns, c.SplitActReward = schema.ModePeerReview, 3, true },
			"split_act_reward: only for mode plan_act (mode peer_review"},
		{"split_act_reward in ensemble", func(c *schema.Config) { c.Mode, c.EnsembleK, c.SplitActReward = schema.ModeEnsemble, 3, true },
			"split_act_reward: only for mode plan_act (mode ensemble"},
		{"ensemble picked by the planner", func(c *schema.Config) { c.Mode, c.EnsemblePick = schema.ModeEnsemble, schema.EnsemblePickPlanner }, ""},
		{"ensemble picked by a vote", func(c *schema.Config) { c.Mode, c.EnsemblePick = schema.ModeEnsemble, schema.EnsemblePickVote }, ""},
		{"ensemble pick unknown", func(c *schema.Config) { c.Mode, c.EnsemblePick = schema.ModeEnsemble, "judge" }, `ensemble_pick "judge": want one of vote, planner`},
		{"ensemble_pick without ensemble", func(c *schema.Config) { c.EnsemblePick = schema.EnsemblePickPlanner }, `ensemble_pick "planner": only for mode ensemble (mode is plan_act)`},
		{"ensemble streamed", func(c *schema.Config) { c.Mode, c.EnsembleK, c.StreamPlans = schema.ModeEnsemble, 3, true }, "stream_plans: not with mode ensemble"},
		{"peer review in one turn", func(c *schema.Config) { c.Mode, c.MaxTurns = schema.ModePeerReview, 1 }, "mode peer_review wants at least 2"},
		{"failure policy", func(c *schema.Config) { c.FailurePolicy = "ignore" }, "failure_policy"},
		{"parse policy", func(c *schema.Config) { c.ParseErrorPolicy = "retry" }, "parse_error_policy"},
		{"schedule", func(c *schema.Config) { c.Schedule = "greedy" }, "schedule"},
		{"max turns", func(c *schema.Config) { c.MaxTurns = -2 }, "max_turns"},
		{"plan format", func(c *schema.Config) { c.PlanFormat = "yaml" }, "plan_format"},
		{"parse format", func(c *schema.Config) { c.ParseFormat = "xml" }, "parse_format"},
		{"act time-out", func(c *schema.Config) { c.ActTimeoutS = -5 }, "act_timeout_s"},
		{"context", func(c *schema.Config) { c.MaxContextTokens = -1 }, "max_context_tokens"},
		{"reward", func(c *schema.Config) { c.Reward = "exact" }, "reward"},
		{"temperature", func(c *schema.Config) { c.PlannerSampling.Temperature = schema.Float(-1) }, "planner_sampling.temperature"},
		{"top_p", func(c *schema.Config) { c.ActorSampling.TopP = schema.Float(1.5) }, "actor_sampling.top_p"},
		{"tool kind", func(c *schema.Config) { c.Tools = []schema.Tool{{Name: "search", Kind: "HTTP", URL: "http://x"}} }, "kind"},
		{"tool twice", func(c *schema.Config) { c.Tools = []schema.Tool{{Name: "search"}, {Name: "search"}} }, "twice"},
		{"http tool url", func(c *schema.Config) { c.Tools = []schema.Tool{{Name: "wiki", Kind: schema.ToolHTTP}} }, "url"},
		{"results without the groups", func(c *schema.Config) { c.TargetGroups, c.ResultSamples = 2, schema.ResultSamplesUndelivered }, ""},
		{"results with every sample", func(c *schema.Config) { c.ResultSamples = schema.ResultSamplesAll }, ""},
		{"results without groups delivered", func(c *schema.Config) { c.ResultSamples = schema.ResultSamplesUndelivered },
			`result_samples "undelivered": only with stream_groups, group_filter or target_groups`},
		{"result samples unknown", func(c *schema.Config) { c.StreamGroups, c.ResultSamples = true, "none" }, `result_samples "none": want all or undelivered`},
		// Numbers that are not finite, or far out of range, were accepted
		// and behaved as something else (an infinite time-out as "already
		// expired"); each is rejected with its field named.
		{"rollout time-out 1e300", func(c *schema.Config) { c.RolloutTimeoutS = 1e300 }, "rollout_timeout_s"},
		{"rollout time-out NaN", func(c *schema.Config) { c.RolloutTimeoutS = math.NaN() }, "rollout_timeout_s"},
		{"rollout time-out +Inf", func(c *schema.Config) { c.RolloutTimeoutS = math.Inf(1) }, "rollout_timeout_s"},
		{"barrier time-out -Inf", func(c *schema.Config) { c.BarrierTimeoutS = math.Inf(-1) }, "barrier_timeout_s"},
		{"act time-out NaN", func(c *schema.Config) { c.ActTimeoutS = math.NaN() }, "act_timeout_s"},
		{"planner time-out", func(c *schema.Config) { c.PlannerTimeoutS = 1e9 }, "planner_timeout_s"},
		{"act retries -100", func(c *schema.Config) { c.ActRetries = -100 }, "act_retries"},
		{"act retries 1000", func(c *schema.Config) { c.ActRetries = 1000 }, "act_retries"},
		{"max turns 2^62", func(c *schema.Config) { c.MaxTurns = 1 << 62 }, "max_turns"},
		{"max nodes", func(c *schema.Config) { c.MaxNodes = 100000 }, "max_nodes"},
		{"max new tokens 2^40", func(c *schema.Config) { c.ActorSampling.MaxNewTokens = 1 << 40 }, "actor_sampling.max_new_tokens"},
		{"planner tokens beyond the context", func(c *schema.Config) { c.PlannerSampling.MaxNewTokens = 20000 }, "planner_sampling.max_new_tokens"},
		{"negative max new tokens", func(c *schema.Config) { c.PlannerSampling.MaxNewTokens = -3 }, "planner_sampling.max_new_tokens"},
		{"temperature NaN", func(c *schema.Config) { c.ActorSampling.Temperature = schema.Float(math.NaN()) }, "actor_sampling.temperature"},
		{"top_p 0", func(c *schema.Config) { c.ActorSampling.TopP = schema.Float(0) }, "actor_sampling.top_p"},
		{"empty stop", func(c *schema.Config) { c.ActorSampling.Stop = []string{""} }, "actor_sampling.stop[0]"},
		{"tool name", func(c *schema.Config) { c.Tools = []schema.Tool{{Name: "web search"}} }, "name"},
		{"url on an actor tool", func(c *schema.Config) { c.Tools = []schema.Tool{{Name: "search", URL: "http://x"}} }, "only for kind http"},
		{"tool url without host", func(c *schema.Config) { c.Tools = []schema.Tool{{Name: "wiki", Kind: schema.ToolHTTP, URL: "http://"}} }, "host"},
		{"reward url", func(c *schema.Config) { c.Reward = "https://" }, "reward"},
		// Bounds are bounds on both sides: barrier_timeout_s 1e-300 was
		// taken, and the rollout timed out at once.
		{"barrier time-out 1e-300", func(c *schema.Config) { c.BarrierTimeoutS = 1e-300 }, "barrier_timeout_s 1e-300: want a number of seconds from 1 to 604800"},
		{"rollout time-out 0.5", func(c *schema.Config) { c.RolloutTimeoutS = 0.5 }, "rollout_timeout_s 0.5: want a number of seconds from 1"},
		{"act time-out 1 ms", func(c *schema.Config) { c.ActTimeoutS = 0.001 }, "act_timeout_s 0.001: want a number of seconds from 1 to 86400"},
		{"planner time-out 5e-324", func(c *schema.Config) { c.PlannerTimeoutS = 5e-324 }, "planner_timeout_s"},
		{"smallest values", func(c *schema.Config) {
			c.ActTimeoutS, c.PlannerTimeoutS, c.BarrierTimeoutS, c.RolloutTimeoutS = schema.MinTimeoutS, schema.MinTimeoutS, schema.MinTimeoutS, schema.MinTimeoutS
			c.ActorSampling.TopP = schema.Float(1e-9) // any positive top_p means what it says
		}, ""},
		{"largest values", func(c *schema.Config) {
			c.MaxTurns, c.MaxNodes, c.MaxContextTokens, c.ActRetries = schema.MaxTurnsLimit, schema.MaxNodesLimit, schema.MaxContextTokensLimit, schema.MaxActRetries
			c.RolloutTimeoutS, c.BarrierTimeoutS, c.ActTimeoutS = schema.MaxRolloutTimeoutS, schema.MaxRolloutTimeoutS, schema.MaxActTimeoutS
		}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := schema.Config{}
			c.edit(&cfg)
			err := cfg.WithDefaults().Validate()
			switch {
			case c.field == "" && err != nil:
				t.Errorf("valid config rejected: %v", err)
			case c.field != "" && (err == nil || !strings.Contains(err.Error(), c.field)):
				t.Errorf("error %v, want one naming %q", err, c.field)
			}
		})
	}
}

func TestSamplingDefaultsFieldByField(t *testing.T) {
	cfg := schema.Config{PlannerSampling: schema.Sampling{Temperature: schema.Float(0)}, ActorSampling: schema.Sampling{MaxNewTokens: 32}}.WithDefaults()
	temp, topP := cfg.PlannerSampling.Values()
	if temp != 0 || topP != 1 || cfg.PlannerSampling.MaxNewTokens != 1024 {
		t.Errorf("planner sampling %v %v %d: an explicit temperature 0 must survive the defaults", temp, topP, cfg.PlannerSampling.MaxNewTokens)
	}
	temp, _ = cfg.ActorSampling.Values()
	if temp != 1 || cfg.ActorSampling.MaxNewTokens != 32 {
		t.Errorf("actor sampling %v %d", temp, cfg.ActorSampling.MaxNewTokens)
	}
	if got := (schema.Config{ActRetries: -1}).WithDefaults().ActRetries; got != -1 {
		t.Errorf("act_retries -1 became %d", got)
	}
}

func TestGenerationSeed(t *testing.T) {
	if got := (schema.Sampling{}).GenerationSeed(1, 2, "t1-s1"); got != 0 {
		t.Errorf("no seed: %d, want 0 (the engine chooses)", got)
	}
	base := int64(7)
	s := schema.Sampling{Seed: &base}
	a, b, c := s.GenerationSeed(1, 2, "t1-s1"), s.GenerationSeed(1, 2, "t1-s1"), s.GenerationSeed(1, 3, "t1-s1")
	if a == 0 || a != b || a == c || a >= 1<<53 {
		t.Errorf("seeds %d %d %d: want the same for the same generation, another for another, nonzero, exact in JSON", a, b, c)
	}
}

// TestPauseValidate: a pause's time-out is bounded on both sides too (1e-300
// expired at once), its mode known; left out, they take their defaults.
func TestPauseValidate(t *testing.T) {
	cases := []struct {
		p    schema.Pause
		want string // "" = valid
	}{
		{schema.Pause{Role: "actor"}, ""},
		{schema.Pause{Role: "actor", Mode: schema.PauseAbort, TimeoutS: 1}, ""},
		{schema.Pause{Role: "actor", TimeoutS: schema.MaxRolloutTimeoutS}, ""},
		{schema.Pause{Role: "actor", TimeoutS: 1e-300}, "pause of actor: timeout_s 1e-300: want a number of seconds from 1 to 604800"},
		{schema.Pause{Role: "actor", TimeoutS: -5}, "timeout_s -5"},
		{schema.Pause{Role: "actor", TimeoutS: math.NaN()}, "timeout_s NaN"},
		{schema.Pause{Role: "actor", TimeoutS: math.Inf(1)}, "timeout_s +Inf"},
		{schema.Pause{Role: "actor", TimeoutS: 1e9}, "timeout_s 1e+09"},
		{schema.Pause{Role: "actor", Mode: "drain"}, `mode "drain": want wait or abort`},
	}
	for _, c := range cases {
		p := c.p.WithDefaults()
		err := p.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v refused: %v", c.p, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: %v, want an error saying %s", c.p, err, c.want)
		}
	}
	if p := (schema.Pause{Role: "actor"}).WithDefaults(); p.Mode != schema.PauseWait || p.TimeoutS != schema.DefaultPauseTimeoutS {
		t.Errorf("defaults: %+v", p)
	}
}
