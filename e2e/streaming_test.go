package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
)

// TestStreamingPlans: with stream_plans, a slow planner's nodes are
// released while it is still writing, so acts start before the turn's
// final output is in the PLAN stream; samples stay one per act and
// token-exact, in every plan format.
func TestStreamingPlans(t *testing.T) {
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
	if early[0] == 0 {
		t.Error("graph plans: no act started before the planner finished writing its plan")
	}
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
