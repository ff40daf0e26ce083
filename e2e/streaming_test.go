package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
)

// TestStreamingPlans: with stream_plans, in every plan format, a slow
// planner's plans stream through partials and the samples stay one per act
// and token-exact. How many acts start before the planner finishes depends
// on the machine's load, so it is logged here; TestStreamingReleasesEarly
// proves the early release without depending on time.
func TestStreamingPlans(t *testing.T) {
	t.Parallel()
	// ~5 ms a token (a byte): a plan takes about a second to write.
	e := startSem(t, semOptions{planner: sim.Config{Seed: 5, PerToken: 5 * time.Millisecond}, actor: sim.Config{Seed: 6}})
	formats := []string{"graph", "tasklist", "json", "numbered", "steps"}
	early := make([]int, len(formats))
	var wg sync.WaitGroup
	for i, format := range formats {
		n := int64(600 + i)
		tasks := []schema.Task{e.question(0, population("France")), e.question(1, population("Japan"))}
		cfg := schema.Config{PlanFormat: format, StreamPlans: true}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := e.rollout(t, e.trainer(t), e.trainer(t), n, tasks, &cfg, false)
			checkResults(t, n, tasks, o, true)
			if t.Failed() {
				return
			}
			checkOnePerAct(t, o.actor)
			dones := e.dones(t, n)
			if len(o.actor.Samples) != len(dones) {
				t.Errorf("rollout %d (%s): %d actor samples for %d acts", n, format, len(o.actor.Samples), len(dones))
			}
			outs := e.planOutTimes(t, n)
			for k, d := range dones {
				final, ok := outs[fmt.Sprintf("%d/%d", d.Episode, d.Turn)]
				if !ok {
					t.Errorf("rollout %d: act %s of turn %d has no planner output", n, k, d.Turn)
					continue
				}
				if d.StartedMs < final.UnixMilli() {
					early[i]++
				}
			}
			if e.count(t, bus.StreamPlan, subject.PlanPartial(n, 0)) == 0 {
				t.Errorf("rollout %d (%s): no partial plan published", n, format)
			}
			t.Logf("rollout %d (%s): %d acts, %d started before the planner finished writing", n, format, len(dones), early[i])
		}()
	}
	wg.Wait()
}

// planOutTimes returns when the PLAN stream stored each planner output of
// rollout n, by "E/turn".
func (e *semEnv) planOutTimes(t *testing.T, n int64) map[string]time.Time {
	t.Helper()
	ctx := context.Background()
	cons, err := e.bus.JS.OrderedConsumer(ctx, bus.StreamPlan, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{fmt.Sprintf("plan.%d.out.*", n)},
	})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]time.Time{}
	for pending := info.NumPending; pending > 0; {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var po schema.PlanOutput
		if err := schema.Unmarshal(msg.Data(), &po); err != nil {
			t.Fatal(err)
		}
		md, err := msg.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		out[fmt.Sprintf("%d/%d", po.Episode, po.Turn)] = md.Timestamp
		pending = md.NumPending
	}
	return out
}

// gatedPlanner is a planner engine (SGLang's streaming /generate and
// /tokenize, byte tokens) that writes the first node of its plan and then
// holds the rest back until release is closed: if an act of that node runs
// while the plan is held, nodes were released before the plan was written.
type gatedPlanner struct {
	release chan struct{}
	held    atomic.Bool // the first act came while the plan was held
}

func (g *gatedPlanner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Text     string `json:"prompt"`
		InputIDs []int  `json:"input_ids"`
	}
	json.NewDecoder(r.Body).Decode(&req)
	if r.URL.Path == "/tokenize" {
		json.NewEncoder(w).Encode(map[string]any{"tokens": sim.Encode(req.Text)})
		return
	}
	prompt, _ := sim.Decode(req.InputIDs)
	chunks := []string{"<answer>2.1 million</answer>"}
	if !strings.Contains(prompt, "</observation>") { // the instructions mention <observation> too
		chunks = []string{
			"<graph>\n<node id=\"s1\">search(\"capital of France\")</node>\n",
			"<node id=\"s2\" depends=\"s1\">search(\"population of {s1}\")</node>\n</graph>",
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	text := ""
	for i, c := range chunks {
		if i > 0 {
			select { // the rest of the plan waits for the first act
			case <-g.release:
				g.held.Store(true)
			case <-time.After(20 * time.Second): // it never came: the test fails
			case <-r.Context().Done():
				return
			}
		}
		text += c
		ids := sim.Encode(text)
		lps := make([][]any, len(ids))
		for k, id := range ids {
			lps[k] = []any{-0.25, id, nil}
		}
		meta := map[string]any{"prompt_tokens": len(req.InputIDs), "completion_tokens": len(ids), "output_token_logprobs": lps, "finish_reason": nil}
		if i == len(chunks)-1 {
			meta["finish_reason"] = map[string]any{"type": "stop"}
		}
		data, _ := json.Marshal(map[string]any{"text": text, "output_ids": ids, "meta_info": meta})
		fmt.Fprintf(w, "data: %s\n\n", data)
		w.(http.Flusher).Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// TestStreamingReleasesEarly: the planner holds back the end of its plan
// until the first node's act has an outcome; the act only ran if the node
// was released from a partial plan, so no clock is involved.
func TestStreamingReleasesEarly(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{actor: sim.Config{Seed: 6}})
	g := &gatedPlanner{release: make(chan struct{})}
	srv := httptest.NewServer(g)
	defer srv.Close()
	e.planner = schema.Engine{URL: srv.URL}

	const n = 610
	nc := bustest.Conn(t, e.url)
	var once sync.Once
	sub, err := nc.Subscribe(subject.ActDone(n, 0, subject.NodeKey(1, "s1")), func(*nats.Msg) {
		once.Do(func() { close(g.release) })
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	nc.Flush()

	tasks := []schema.Task{e.question(0, population("France"))}
	o := e.rollout(t, e.trainer(t), e.trainer(t), n, tasks, &schema.Config{StreamPlans: true}, false)
	checkResults(t, n, tasks, o, true)
	if !g.held.Load() {
		t.Fatal("the first act was not released while the planner was still writing its plan")
	}
	if got := len(o.actor.Samples); got != 2 {
		t.Errorf("%d actor samples, want 2 (s1 and s2)", got)
	}
}
