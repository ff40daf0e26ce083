package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// TestTokenDriftQuarantines: an engine whose input drifts from planact's
// trajectory is caught on the turn or act where it does, and the episode
// is quarantined, never trained on: its end says quarantined, with a reason
// that names token_drift and where (the turn and the first differing
// position, or the act and the counts), the result's task is quarantined
// for both roles, no sample of it reaches either role, the result's reason
// says how many, and planact_token_drift_total counts each. The other
// episodes of the rollout train as usual.
//
// The planner is an OpenAI-compatible chat server whose template, from an
// episode's third request on, ends earlier user turns with "\n" where it
// wrote EOS (another tokenizer revision behind the router): the drift is
// where the first user turn ended. The actor is an SGLang server that, from
// an episode's third act on, takes a BOS before the ids it is sent and
// reports one prompt token more.
func TestTokenDriftQuarantines(t *testing.T) {
	for _, c := range []struct {
		name           string
		planner, actor sim.Config
		chat           bool
		role           string
		reason         *regexp.Regexp
	}{
		{"planner chat template drifts at turn 3", sim.Config{Seed: 21, DriftFrom: 3, PlannerStepwise: 0.6}, sim.Config{Seed: 22}, true, schema.RolePlanner,
			regexp.MustCompile(`^token_drift: turn 3: the engine's input differs from planact's trajectory at token (\d+) of \d+ \(the chat template's prompt_token_ids: \d+ tokens\)$`)},
		{"actor engine drifts from an episode's third act", sim.Config{Seed: 23}, sim.Config{Seed: 24, DriftFrom: 3}, false, schema.RoleActor,
			regexp.MustCompile(`^token_drift: act \S+ \(turn \d\): the engine reports (\d+) prompt tokens \(prompt_tokens\) for the (\d+) planact sent: its input is not planact's trajectory$`)},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := start(t, envOptions{planner: c.planner, actor: c.actor})
			if c.chat {
				e.planner.Protocol = "openai-chat"
			}
			n := int64(70 + len(c.role))
			before := testutil.ToFloat64(telemetry.TokenDrift.WithLabelValues(c.role))
			tasks := e.tasks(6, 2, n)
			o := e.rollout(t, e.trainer(t), e.trainer(t), n, tasks, nil, false)
			if o.perr != nil || o.aerr != nil {
				t.Fatalf("rollout: %v / %v", o.perr, o.aerr)
			}
			b := bustest.Bus(t, e.url, "observer")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			quarantined := map[string]bool{}
			for ep := range tasks {
				m, err := b.LastMsg(ctx, bus.StreamRollout, subject.EpisodeEnd(n, ep))
				if err != nil || m == nil {
					t.Fatalf("episode %d's end: %v", ep, err)
				}
				var end schema.EpisodeEnd
				if err := schema.Unmarshal(m.Data, &end); err != nil {
					t.Fatal(err)
				}
				if end.Status != schema.EpisodeQuarantined {
					continue
				}
				quarantined[fmt.Sprintf("%d-%d", n, ep)] = true
				got := c.reason.FindStringSubmatch(end.Reason)
				if got == nil {
					t.Errorf("episode %d quarantined: reason %q, want it to match %s", ep, end.Reason, c.reason)
					continue
				}
				if c.chat {
					// Where the first user turn ended (its EOS), in the
					// trajectory the engine rendered before.
					last, err := b.LastMsg(ctx, bus.StreamPlan, subject.PlanOut(n, ep))
					if err != nil || last == nil {
						t.Fatalf("episode %d's last planner output: %v", ep, err)
					}
					var out schema.PlanOutput
					if err := schema.Unmarshal(last.Data, &out); err != nil {
						t.Fatal(err)
					}
					want := len(out.Segments[0].IDs) - len(sim.Encode("<|assistant|>\n")) - 1
					if at, _ := strconv.Atoi(got[1]); at != want || out.Turn != 2 {
						t.Errorf("episode %d: drift at token %d after turn %d; the first user turn ended at %d", ep, at, out.Turn, want)
					}
				} else if consumed, _ := strconv.Atoi(got[1]); got[2] != strconv.Itoa(consumed-1) {
					t.Errorf("episode %d: %s: want one token more than sent", ep, end.Reason)
				}
			}
			if len(quarantined) == 0 || len(quarantined) == len(tasks) {
				t.Fatalf("%d of %d episodes quarantined: the rollout shows nothing", len(quarantined), len(tasks))
			}
			if got := testutil.ToFloat64(telemetry.TokenDrift.WithLabelValues(c.role)) - before; int(got) != len(quarantined) {
				t.Errorf("planact_token_drift_total{role=%q} rose by %v, %d episodes quarantined", c.role, got, len(quarantined))
			}
			for _, r := range []*schema.Result{o.planner, o.actor} {
				if r.Status != schema.ResultOK || !strings.Contains(r.Reason, fmt.Sprintf("%d of %d episodes quarantined, never trained on", len(quarantined), len(tasks))) {
					t.Errorf("%s result: %s (%s): want ok, saying how many episodes were quarantined", r.Role, r.Status, r.Reason)
				}
				if r.Stats.EpisodeStatus[schema.EpisodeQuarantined] != len(quarantined) || r.Stats.TaskStates[schema.TaskQuarantined] != len(quarantined) {
					t.Errorf("%s result: episode status %v, task states %v", r.Role, r.Stats.EpisodeStatus, r.Stats.TaskStates)
				}
				for _, to := range r.Tasks {
					if quarantined[fmt.Sprintf("%d-%d", n, to.Episode)] != (to.State == schema.TaskQuarantined) || (to.State == schema.TaskQuarantined && !strings.HasPrefix(to.Reason, "token_drift: ")) {
						t.Errorf("%s result: task %+v", r.Role, to)
					}
				}
				for _, s := range r.Samples {
					if quarantined[s.RolloutID] {
						t.Errorf("%s result holds a sample of quarantined episode %s", r.Role, s.RolloutID)
					}
				}
			}
			trained := 0
			for _, s := range o.planner.Samples {
				trained++
				if !c.chat {
					checkTokenExact(t, s)
				}
				if s.ResponseLength != len(s.LossMask) || len(s.Tokens) < s.ResponseLength {
					t.Errorf("planner sample %s: %d tokens, response_length %d, loss mask %d", s.RolloutID, len(s.Tokens), s.ResponseLength, len(s.LossMask))
				}
			}
			if trained != len(tasks)-len(quarantined) {
				t.Errorf("%d planner samples, %d episodes not quarantined", trained, len(tasks)-len(quarantined))
			}
			t.Logf("%d of %d episodes quarantined; %d planner and %d actor samples from the others; result: %s", len(quarantined), len(tasks),
				len(o.planner.Samples), len(o.actor.Samples), o.planner.Reason)
		})
	}
}
