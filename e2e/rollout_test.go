package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/reward"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// checkResults verifies what trainers can rely on: one planner sample per
// episode holding every turn exactly once, token-exact; one actor sample
// per executed act, each exactly once; rewards that match the world.
func checkResults(t *testing.T, n int64, tasks []schema.Task, o outcome, wantAllCorrect bool) {
	t.Helper()
	if o.perr != nil || o.aerr != nil {
		t.Fatalf("rollout %d: planner err %v, actor err %v", n, o.perr, o.aerr)
	}
	pr, ar := o.planner, o.actor
	if pr.Status != schema.ResultOK || ar.Status != schema.ResultOK {
		t.Fatalf("rollout %d: status planner %q actor %q (%s)", n, pr.Status, ar.Status, pr.Reason)
	}
	if len(pr.Samples) != len(tasks) {
		t.Fatalf("rollout %d: %d planner samples for %d episodes", n, len(pr.Samples), len(tasks))
	}
	seen := map[string]bool{}
	for _, s := range pr.Samples {
		if seen[s.RolloutID] {
			t.Errorf("rollout %d: two planner samples for episode %s", n, s.RolloutID)
		}
		seen[s.RolloutID] = true
		task := tasks[s.Index]
		if s.GroupIndex != task.GroupIndex || s.Label != task.Label {
			t.Errorf("sample %s: group %d label %q, task has %d %q", s.RolloutID, s.GroupIndex, s.Label, task.GroupIndex, task.Label)
		}
		checkTokenExact(t, s)
		turns := asInt(s.Metadata["turns"])
		if runs := generatedRuns(s.LossMask); runs != turns {
			t.Errorf("sample %s: %d generated turns in the loss mask, episode had %d turns", s.RolloutID, runs, turns)
		}
		answers := fmt.Sprint(s.Metadata["answers"])
		want := reward.F1(joinAnswers(s.Metadata["answers"]), task.Label)
		if s.Status == schema.EpisodeCompleted && s.Reward != want {
			t.Errorf("sample %s: reward %v, want F1(%s, %q) = %v", s.RolloutID, s.Reward, answers, task.Label, want)
		}
		if wantAllCorrect && (s.Status != schema.EpisodeCompleted || s.Reward != 1) {
			t.Errorf("sample %s: status %s reward %v (answers %s, label %q); the world answers every question", s.RolloutID, s.Status, s.Reward, answers, task.Label)
		}
		if len(s.WeightVersions) == 0 || s.WeightVersions[0] != "planner-v7" {
			t.Errorf("sample %s: weight versions %v", s.RolloutID, s.WeightVersions)
		}
	}
	acts := map[string]bool{}
	perEpisode := map[string]int{}
	for _, s := range ar.Samples {
		key := s.RolloutID + "/" + fmt.Sprint(s.Metadata["key"])
		if acts[key] {
			t.Errorf("rollout %d: act %s has two samples", n, key)
		}
		acts[key] = true
		perEpisode[s.RolloutID]++
		checkTokenExact(t, s)
		if s.Metadata["tool"] != "search" {
			t.Errorf("act %s: tool %v", key, s.Metadata["tool"])
		}
		if len(s.WeightVersions) == 0 || s.WeightVersions[0] != "actor-v3" {
			t.Errorf("act %s: weight versions %v", key, s.WeightVersions)
		}
	}
	if ar.Stats.Acts != len(ar.Samples) {
		t.Errorf("rollout %d: stats say %d acts, %d actor samples", n, ar.Stats.Acts, len(ar.Samples))
	}
	for id := range seen {
		if perEpisode[id] == 0 {
			t.Errorf("episode %s has no actor samples", id)
		}
	}
}

// checkTokenExact decodes the tokens with the engines' byte tokenizer: they
// must spell exactly the prompt and the response, and the masks and
// log-probs must cover the response.
func checkTokenExact(t *testing.T, s schema.Sample) {
	t.Helper()
	text, err := sim.Decode(s.Tokens)
	if err != nil {
		t.Fatalf("sample %s: %v", s.RolloutID, err)
	}
	if text != s.Prompt+s.Response {
		t.Errorf("sample %s: tokens spell %q, want prompt+response %q", s.RolloutID, text, s.Prompt+s.Response)
	}
	if s.ResponseLength != len(s.LossMask) || s.ResponseLength != len(s.RolloutLogProbs) {
		t.Errorf("sample %s: response_length %d, loss_mask %d, log-probs %d", s.RolloutID, s.ResponseLength, len(s.LossMask), len(s.RolloutLogProbs))
	}
	for i, m := range s.LossMask {
		if m == 1 && s.RolloutLogProbs[i] >= 0 {
			t.Errorf("sample %s: generated token %d has log-prob %v", s.RolloutID, i, s.RolloutLogProbs[i])
			break
		}
		if m == 0 && s.RolloutLogProbs[i] != 0 {
			t.Errorf("sample %s: observation token %d has log-prob %v", s.RolloutID, i, s.RolloutLogProbs[i])
			break
		}
	}
}

func generatedRuns(mask []int) int {
	runs := 0
	for i, m := range mask {
		if m == 1 && (i == 0 || mask[i-1] == 0) {
			runs++
		}
	}
	return runs
}

// asInt reads a number of a sample's metadata (0 when it is none).
func asInt(v any) int {
	n, _ := schema.MetaInt(v)
	return n
}

func joinAnswers(v any) string {
	list, _ := v.([]any)
	s := ""
	for i, a := range list {
		if i > 0 {
			s += " | "
		}
		s += fmt.Sprint(a)
	}
	return s
}

// TestRolloutsEndToEnd: two trainers on separate connections, several
// rollouts at once, arriving in either order; multi-turn episodes with
// parallel acts; both roles get their samples.
func TestRolloutsEndToEnd(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 3, PlannerStepwise: 0.5}, actor: sim.Config{Seed: 4}})
	planner, actor := e.trainer(t), e.trainer(t)
	formats := []string{"graph", "tasklist", "json", "numbered", "steps", "graph"}
	var wg sync.WaitGroup
	for i, format := range formats {
		n := int64(100 + i)
		tasks := e.tasks(4, 2, n)
		cfg := schema.Config{PlanFormat: format}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := e.rollout(t, planner, actor, n, tasks, &cfg, i%2 == 1)
			checkResults(t, n, tasks, o, true)
			st := o.planner.Stats
			if st.Accuracy != 1 {
				t.Errorf("rollout %d (%s): accuracy %v, want 1", n, format, st.Accuracy)
			}
			t.Logf("rollout %d (%s): %d episodes, %.2f turns, %.2f acts per episode", n, format, st.Episodes, st.MeanTurns, st.ActsPerEpisode)
		}()
	}
	wg.Wait()
}

// TestLargeResultsGoToTheObjectStore: a result too large for a message
// carries an object-store reference, and the client fetches the samples.
func TestLargeResultsGoToTheObjectStore(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 8}, actor: sim.Config{Seed: 9}, inlineLimit: 4096})
	tasks := e.tasks(3, 2, 55)
	o := e.rollout(t, e.trainer(t), e.trainer(t), 55, tasks, nil, false)
	for _, r := range []*schema.Result{o.planner, o.actor} {
		if r == nil {
			t.Fatalf("no result: %v %v", o.perr, o.aerr)
		}
		if r.SamplesObject == "" {
			t.Errorf("%s result of %d samples stayed inline with a 4 KiB limit", r.Role, r.SampleCount)
		}
		if len(r.Samples) != r.SampleCount || r.SampleCount == 0 {
			t.Errorf("%s: fetched %d samples, result says %d", r.Role, len(r.Samples), r.SampleCount)
		}
	}
	checkResults(t, 55, tasks, o, true)
}

// TestLargeTaskListsGoThroughTheObjectStore: a batch too large for a
// message is stored as an object by the client and read back by planact.
func TestLargeTaskListsGoThroughTheObjectStore(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 10}, actor: sim.Config{Seed: 11}})
	planner := e.trainer(t)
	planner.InlineTasksLimit = 512
	tasks := e.tasks(4, 2, 66)
	o := e.rollout(t, planner, e.trainer(t), 66, tasks, nil, true)
	checkResults(t, 66, tasks, o, true)

	// The arrival on the wire carried a reference, not the tasks.
	nc := bustest.Conn(t, e.url)
	js, _ := jetstream.New(nc)
	st, err := js.Stream(context.Background(), bus.StreamTrainer(schema.RolePlanner))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := st.GetLastMsgForSubject(context.Background(), "rollout.66.arrive.planner")
	if err != nil {
		t.Fatal(err)
	}
	// The last arrival is the planner's (the actor arrived first).
	var a schema.Arrive
	if err := schema.Unmarshal(raw.Data, &a); err != nil {
		t.Fatal(err)
	}
	if a.Role != schema.RolePlanner || len(a.Tasks) != 0 || a.TasksObject == "" {
		t.Errorf("planner arrival: role %s, %d inline tasks, object %q", a.Role, len(a.Tasks), a.TasksObject)
	}
	// It names the list's SHA-256, which planact checked (the rollout ran
	// on it; the list is removed with the rollout).
	if len(a.TasksSHA256) != 64 || !strings.Contains(a.TasksObject, a.TasksSHA256[:16]) {
		t.Errorf("task object %s, tasks_sha256 %q: want the list's SHA-256, and the object named by it", a.TasksObject, a.TasksSHA256)
	}
}

// TestOpenAIProtocol: engines spoken to through the OpenAI-compatible API
// (/v1/completions with token ids and log-probs, /tokenize) give the same
// token-exact samples.
func TestOpenAIProtocol(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 12}, actor: sim.Config{Seed: 13}})
	e.planner.Protocol, e.actor.Protocol = "openai", "openai"
	tasks := e.tasks(3, 1, 77)
	o := e.rollout(t, e.trainer(t), e.trainer(t), 77, tasks, &schema.Config{PlanFormat: "json"}, false)
	checkResults(t, 77, tasks, o, true)
}

// TestRewardServerDown: when the reward server cannot be reached, the
// rollout still delivers its samples; the episodes score 0 and say why.
func TestRewardServerDown(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 14}, actor: sim.Config{Seed: 15}})
	tasks := e.tasks(2, 1, 88)
	o := e.rollout(t, e.trainer(t), e.trainer(t), 88, tasks, &schema.Config{Reward: "http://127.0.0.1:1/reward"}, false)
	if o.perr != nil || o.planner.Status != schema.ResultOK || len(o.planner.Samples) != 2 {
		t.Fatalf("rollout: %v %+v", o.perr, o.planner)
	}
	for _, s := range o.planner.Samples {
		if s.Reward != 0 || s.Metadata["reward_error"] == nil {
			t.Errorf("sample %s: reward %v, reward_error %v", s.RolloutID, s.Reward, s.Metadata["reward_error"])
		}
	}
	if got := o.planner.Stats.Failures["reward"]; got != 2 {
		t.Errorf("stats count %d reward failures, want 2", got)
	}
}

// TestPlannerEngineRefuses: a planner engine that answers 400 (a prompt it
// will never take) ends the episode failed at once, with the engine's
// message, instead of leaving it to the rollout time-out; a rollout whose
// episodes all failed is failed, not ok, and says why.
func TestPlannerEngineRefuses(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 16}, actor: sim.Config{Seed: 17}})
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			w.Write([]byte(`{"tokens":[5,6,7]}`))
			return
		}
		http.Error(w, `{"error":"input is longer than the model's context length"}`, http.StatusBadRequest)
	}))
	defer refusing.Close()
	e.planner = schema.Engine{URL: refusing.URL}
	tasks := e.tasks(2, 1, 89)
	o := e.rollout(t, e.trainer(t), e.trainer(t), 89, tasks, nil, false)
	if !errors.Is(o.perr, client.ErrFailed) || o.planner.Status != schema.ResultFailed || !strings.Contains(o.planner.Reason, "context length") {
		t.Fatalf("rollout: %v %+v", o.perr, o.planner)
	}
	if got := o.planner.Stats.EpisodeStatus[schema.EpisodeFailed]; got != 2 {
		t.Errorf("episode status %v, want both failed", o.planner.Stats.EpisodeStatus)
	}
}

// TestPlannerEngineUnreachable: with the planner engine down, the rollout
// is reported failed (it was "ok, 0 samples"), its reason naming the cause,
// and both trainers learn it (ErrFailed).
func TestPlannerEngineUnreachable(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 18}, actor: sim.Config{Seed: 19}})
	down := httptest.NewServer(http.NotFoundHandler())
	e.planner = schema.Engine{URL: down.URL}
	down.Close() // nothing listens there any more
	tasks := e.tasks(2, 1, 90)
	o := e.rollout(t, e.trainer(t), e.trainer(t), 90, tasks, &schema.Config{PlannerTimeoutS: 2}, false)
	for role, r := range map[string]*schema.Result{"planner": o.planner, "actor": o.actor} {
		err := o.perr
		if role == "actor" {
			err = o.aerr
		}
		if !errors.Is(err, client.ErrFailed) || r == nil || r.Status != schema.ResultFailed ||
			!strings.Contains(r.Reason, "all 2 episodes failed") || !strings.Contains(r.Reason, "connection refused") {
			t.Errorf("%s: %v %+v, want failed naming the refused connection", role, err, r)
		}
	}
}
