package plannergateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/internal/enginetest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
)

// maxTokens keeps how many new tokens every generation asks the engine
// for (a chat completion's max_tokens, SGLang's max_new_tokens), by its
// X-Planact-Generation, before the engine sees it.
type maxTokens struct {
	next http.Handler
	mu   sync.Mutex
	sent map[string]int
}

func (m *maxTokens) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if enginetest.IsGeneration(r.URL.Path) {
		body, _ := io.ReadAll(r.Body)
		var in struct {
			MaxTokens int `json:"max_tokens"`
			Sampling  struct {
				MaxNewTokens int `json:"max_new_tokens"`
			} `json:"sampling_params"`
		}
		_ = json.Unmarshal(body, &in)
		m.mu.Lock()
		m.sent[r.Header.Get(engine.GenerationHeader)] = max(in.MaxTokens, in.Sampling.MaxNewTokens)
		m.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	m.next.ServeHTTP(w, r)
}

func (m *maxTokens) of(generation string) (int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.sent[generation]
	return n, ok
}

// planners is a bus with a planner-gateway running on it and a simulated
// planner engine (it speaks every protocol), for rollouts of one episode.
type planners struct {
	b    *bus.Bus
	ctx  context.Context
	url  string // the engine's
	max  *maxTokens
	task schema.Task
}

func startPlanners(t *testing.T) *planners {
	t.Helper()
	_, url := bustest.Server(t)
	p := &planners{b: bustest.Bus(t, url, "planner-gateway-test")}
	p.max = &maxTokens{next: enginetest.New(sim.New(sim.Config{Role: schema.RolePlanner, Seed: 9, WeightVersion: "planner-v1"}), enginetest.Options{}),
		sent: map[string]int{}}
	p.url = enginetest.Start(t, p.max)
	ctx, cancel := context.WithCancel(context.Background())
	p.ctx = ctx
	p.task = demo.Tasks(sim.DefaultWorld(), 1, 1, 1, "")[0]
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Deps{Bus: p.b, Log: bustest.TestLogger(t, "info"), Engines: &engine.Pool{}, RetryBase: 10 * time.Millisecond})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	})
	return p
}

// rollout stores rollout n running, one episode of p's task, with cfg and
// its planner on protocol.
func (p *planners) rollout(t *testing.T, n int64, protocol string, cfg schema.Config) {
	t.Helper()
	if _, err := bus.Create(p.ctx, p.b.Sessions, schema.TasksKey(n), &schema.TaskList{Tasks: []schema.Task{p.task}}); err != nil {
		t.Fatal(err)
	}
	sess := &schema.Session{Rollout: n, State: schema.SessionRunning, Config: cfg, Episodes: 1,
		Roles: map[string]schema.RoleInfo{schema.RolePlanner: {Engine: schema.Engine{URL: p.url, Protocol: protocol}, WeightVersion: "planner-v1"}}}
	if _, err := bus.Create(p.ctx, p.b.Sessions, schema.SessionKey(n), sess); err != nil {
		t.Fatal(err)
	}
}

// turn asks for turn k of rollout n's episode and returns its output.
func (p *planners) turn(t *testing.T, n int64, k int, observation string) schema.PlanOutput {
	t.Helper()
	if err := p.b.Publish(p.ctx, &schema.PlanRequest{Rollout: n, Episode: 0, Turn: k, Observation: observation, WeightVersion: "planner-v1"}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if m, err := p.b.LastMsg(p.ctx, bus.StreamPlan, subject.PlanError(n, 0)); err != nil || m != nil {
			var pe schema.PlanError
			if m != nil {
				_ = schema.Unmarshal(m.Data, &pe)
			}
			t.Fatalf("turn %d: %v %+v", k, err, pe)
		}
		m, err := p.b.LastMsg(p.ctx, bus.StreamPlan, subject.PlanOut(n, 0))
		if err != nil {
			t.Fatal(err)
		}
		if m != nil {
			var out schema.PlanOutput
			if err := schema.Unmarshal(m.Data, &out); err != nil {
				t.Fatal(err)
			}
			if out.Turn == k {
				return out
			}
		}
		if time.Now().After(deadline) {
			bustest.DumpGoroutines(t)
			t.Fatalf("no output of turn %d", k)
		}
	}
}

func trajectoryLen(segs []schema.Segment) int {
	n := 0
	for _, seg := range segs {
		n += len(seg.IDs)
	}
	return n
}

// checkContext checks that turn k of rollout n, out, kept to max tokens
// as the engine counts them: the prompt the engine generated from (its
// prompt_token_ids, which the trajectory holds) with the max_tokens it was
// asked for, and the trajectory with what it generated.
func (p *planners) checkContext(t *testing.T, n int64, k int, out schema.PlanOutput, max int) {
	t.Helper()
	if got := trajectoryLen(out.Segments); got > max {
		t.Errorf("turn %d: the trajectory holds %d tokens, more than max_context_tokens %d", k, got, max)
	}
	if last := out.Segments[len(out.Segments)-1]; last.Kind != schema.SegGenerated || last.Turn != k {
		return // nothing generated
	}
	sent, ok := p.max.of(engine.TurnGeneration(n, 0, k))
	prompt := trajectoryLen(out.Segments[:len(out.Segments)-1])
	if !ok || prompt+sent > max {
		t.Errorf("turn %d: the engine was asked for %d tokens (sent %v) after a prompt of %d: %d, more than max_context_tokens %d",
			k, sent, ok, prompt, prompt+sent, max)
	}
}

// TestAChatPlannerKeepsToItsContext: a chat engine generates from the
// conversation as its template renders it, the template's tokens (role
// markers, end of turn, the generation prompt) with the messages'. The
// context was counted as the messages' ids alone, so a turn could be
// asked for more tokens than the context had room for, and a trajectory
// grew past max_context_tokens by the template's tokens. Now the context
// is counted on the engine's rendering: the trajectory, and every request,
// keeps to max_context_tokens, and an episode out of room ends as it does
// on the other protocols, truncated, saying so in the same words (with
// the same room, an SGLang planner's turn is cut at the same place).
func TestAChatPlannerKeepsToItsContext(t *testing.T) {
	p := startPlanners(t)
	cfg := schema.DefaultConfig()
	prompt := len(sim.Encode(RenderPrompt(p.task, cfg)))
	// The simulator's template: "<|user|>\n", the text, EOS, then "<|assistant|>\n".
	glue := len(sim.Encode("<|user|>\n")) + 1 + len(sim.Encode("<|assistant|>\n"))
	withMax := func(max, maxNew int) schema.Config {
		c := cfg
		c.MaxContextTokens = max
		c.PlannerSampling.MaxNewTokens = maxNew
		return c
	}

	t.Run("turn 1 has little room", func(t *testing.T) {
		for i, tc := range []struct {
			protocol string
			max      int // room for 6 tokens after the prompt the engine sees
		}{
			{engine.ProtocolSGLang, prompt + 6},
			{engine.ProtocolOpenAIChat, prompt + glue + 6},
		} {
			n := int64(100 + i)
			p.rollout(t, n, tc.protocol, withMax(tc.max, 64))
			out := p.turn(t, n, 1, "")
			p.checkContext(t, n, 1, out, tc.max)
			want := fmt.Sprintf("max_context_tokens %d: turn 1 had room for 6 tokens (planner_sampling.max_new_tokens 64) and was cut there", tc.max)
			if out.FinishReason != engine.FinishLength || out.Truncated != want {
				t.Errorf("%s: turn 1 finished %q, truncated %q; want length, %q", tc.protocol, out.FinishReason, out.Truncated, want)
			}
		}
	})

	// Turn 2's observation, as long as told: its room is what a chat
	// planner's turn 1 left, less the template's tokens around it.
	const max = 8192
	turn2 := func(t *testing.T, n int64, room int) (schema.PlanOutput, schema.PlanOutput, int) {
		t.Helper()
		p.rollout(t, n, engine.ProtocolOpenAIChat, withMax(max, 1024))
		first := p.turn(t, n, 1, "")
		p.checkContext(t, n, 1, first, max)
		if first.Truncated != "" {
			t.Fatalf("turn 1 truncated: %s", first.Truncated)
		}
		held := trajectoryLen(first.Segments)
		wrap := len("\n<observation>\n") + len("\n</observation>\n")
		obs := "\n<observation>\n" + strings.Repeat("y", max-held-glue-room-wrap) + "\n</observation>\n"
		out := p.turn(t, n, 2, obs)
		p.checkContext(t, n, 2, out, max)
		return first, out, held
	}

	t.Run("turn 2 has little room", func(t *testing.T) {
		const n = 110
		_, out, _ := turn2(t, n, 5)
		want := fmt.Sprintf("max_context_tokens %d: turn 2 had room for 5 tokens (planner_sampling.max_new_tokens 1024) and was cut there", max)
		if out.FinishReason != engine.FinishLength || out.Truncated != want {
			t.Errorf("turn 2 finished %q, truncated %q; want length, %q", out.FinishReason, out.Truncated, want)
		}
	})

	t.Run("turn 2's observation does not fit", func(t *testing.T) {
		const n = 111
		first, out, held := turn2(t, n, -10)
		want := fmt.Sprintf("max_context_tokens %d: the trajectory holds %d tokens before turn 2, and its observation (%d tokens) does not fit: it is left out",
			max, held, max-held+10)
		if out.FinishReason != engine.FinishLength || !strings.HasPrefix(out.Truncated, want) {
			t.Errorf("turn 2 finished %q, truncated %q; want length, %q", out.FinishReason, out.Truncated, want)
		}
		if len(out.Segments) != len(first.Segments) || trajectoryLen(out.Segments) != held {
			t.Errorf("turn 2's trajectory holds %d segments, %d tokens; want turn 1's %d, %d: the observation left out",
				len(out.Segments), trajectoryLen(out.Segments), len(first.Segments), held)
		}
		if _, asked := p.max.of(engine.TurnGeneration(n, 0, 2)); asked {
			t.Error("the engine was asked to generate turn 2, which had no room")
		}
	})
}
