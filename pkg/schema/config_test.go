package schema_test

import (
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
