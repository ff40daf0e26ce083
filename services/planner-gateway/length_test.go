package plannergateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/planact/planact/internal/enginetest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// autoTruncate lowers every generation's max_new_tokens to limit before
// the engine sees it, as SGLang's --allow-auto-truncate does for a request
// whose prompt and max_new_tokens pass its context length: the generation
// ends at length, short of what planact asked for.
type autoTruncate struct {
	next  http.Handler
	limit int
}

func (a autoTruncate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/generate" {
		body, _ := io.ReadAll(r.Body)
		var in map[string]any
		if err := json.Unmarshal(body, &in); err == nil {
			if sp, ok := in["sampling_params"].(map[string]any); ok {
				sp["max_new_tokens"] = a.limit
			}
			body, _ = json.Marshal(in)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
	}
	a.next.ServeHTTP(w, r)
}

// rolloutOn stores rollout n running, one episode of p's task, with cfg
// and its planner on the engine at url, speaking protocol.
func (p *planners) rolloutOn(t *testing.T, n int64, url, protocol string, cfg schema.Config) {
	t.Helper()
	if _, err := bus.Create(p.ctx, p.b.Sessions, schema.TasksKey(n), &schema.TaskList{Tasks: []schema.Task{p.task}}); err != nil {
		t.Fatal(err)
	}
	sess := &schema.Session{Rollout: n, State: schema.SessionRunning, Config: cfg, Episodes: 1,
		Roles: map[string]schema.RoleInfo{schema.RolePlanner: {Engine: schema.Engine{URL: url, Protocol: protocol}, WeightVersion: "planner-v1"}}}
	if _, err := bus.Create(p.ctx, p.b.Sessions, schema.SessionKey(n), sess); err != nil {
		t.Fatal(err)
	}
}

// TestATurnTheEngineCutSaysSo: an engine may end a generation at length
// before the max_new_tokens planact asked for (SGLang's
// --allow-auto-truncate lowers it to fit its own context). The output's
// truncated said planner_sampling.max_new_tokens (or max_context_tokens)
// had cut the turn there, a limit the turn never reached. It now says the
// engine cut it, and after how many of the tokens asked for.
func TestATurnTheEngineCutSaysSo(t *testing.T) {
	p := startPlanners(t)
	url := enginetest.Start(t, autoTruncate{limit: 5,
		next: enginetest.New(sim.New(sim.Config{Role: schema.RolePlanner, Seed: 9, WeightVersion: "planner-v1"}), enginetest.Options{})})
	for i, tc := range []struct {
		name     string
		max      int // max_context_tokens, 0: the default
		maxNew   int
		notClaim string // a limit the truncation must not name
	}{
		{"max_new_tokens not reached", 0, 64, "planner_sampling.max_new_tokens 64: turn 1 was cut there"},
		{"the context's room not reached", len(sim.Encode(RenderPrompt(p.task, schema.DefaultConfig()))) + 20, 64, "had room for 20 tokens (planner_sampling.max_new_tokens 64) and was cut there"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := int64(200 + i)
			cfg := schema.DefaultConfig()
			if tc.max > 0 {
				cfg.MaxContextTokens = tc.max
			}
			cfg.PlannerSampling.MaxNewTokens = tc.maxNew
			p.rolloutOn(t, n, url, engine.ProtocolSGLang, cfg)
			out := p.turn(t, n, 1, "")
			gen := out.Segments[len(out.Segments)-1]
			if gen.Kind != schema.SegGenerated || len(gen.IDs) != 5 || out.FinishReason != engine.FinishLength {
				t.Fatalf("turn 1: %d generated ids, finish %q; want the engine's 5, length", len(gen.IDs), out.FinishReason)
			}
			if strings.Contains(out.Truncated, tc.notClaim) {
				t.Errorf("truncated %q: it names a limit the turn did not reach (5 tokens generated)", out.Truncated)
			}
			if want := fmt.Sprintf("after %d tokens", 5); !strings.Contains(out.Truncated, want) || !strings.Contains(out.Truncated, "engine") {
				t.Errorf("truncated %q: want the engine named as what cut it, %q", out.Truncated, want)
			}
		})
	}
}
