package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// What slime_planact hands slime must hold to slime's own contract
// (THUDM/slime 624b824a): log-probs for every sample or none, no aborted
// sample trained on, a fresh planact rollout id for every evaluation of
// train.py's call order, and eval rewards slime can reshape into groups.

// TestPythonSlimeLogProbsAllOrNone: slime takes a batch's
// rollout_log_probs from its first sample (RolloutManager.
// _convert_samples_to_train_data): a None among lists fails its tensors,
// and a first sample without them drops every sample's. A response of no
// tokens has its log-probs, [] (planact leaves the empty list out), so it
// drops nothing; a sample whose engine gave none makes the batch have none,
// counted, or is refused when slime's args train with them (--use-tis,
// --use-rollout-logprobs, --get-mismatch-metrics).
func TestPythonSlimeLogProbsAllOrNone(t *testing.T) {
	t.Parallel()
	const n = 9
	base := plannerSamples(n)
	empty := base[2] // failed, no response
	empty.GroupIndex, empty.Index, empty.RolloutID = 10, 20, fmt.Sprintf("%d-0", n)
	withLP := base[3] // group 10, index 21, with log-probs
	first := base[1]  // group 10, index 20, with log-probs
	missing := withLP
	missing.RolloutLogProbs = nil
	missing.Metadata = map[string]any{"rollout": n, "episode": 1, "log_probs_missing": "turn 1: the reply had no output_token_logprobs"}
	feed := func(samples ...schema.Sample) slimeFeed {
		var f slimeFeed
		f.answer(t, subject.Result(n, schema.RolePlanner), &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK,
			Samples: samples, SampleCount: len(samples), Tasks: trained(10)})
		return f
	}
	engine := engineServer(t, "4")
	for _, c := range []struct {
		name    string
		feed    slimeFeed
		args    string
		wantLP  map[int][]float64 // index -> log-probs; nil: None for all
		metrics map[string]float64
		wantErr string
	}{
		{name: "no response first", feed: feed(empty, withLP), args: `{}`,
			wantLP:  map[int][]float64{20: {}, 21: withLP.RolloutLogProbs},
			metrics: map[string]float64{"planact/log_probs_missing": 0, "planact/log_probs_dropped": 0}},
		{name: "one missing", feed: feed(first, missing), args: `{"use_tis": false}`,
			metrics: map[string]float64{"planact/log_probs_missing": 1, "planact/log_probs_dropped": 1}},
		{name: "one missing, no response first", feed: feed(empty, missing), args: `{}`,
			metrics: map[string]float64{"planact/log_probs_missing": 1, "planact/log_probs_dropped": 1}},
		{name: "one missing with --use-tis", feed: feed(first, missing), args: `{"use_tis": true}`,
			wantErr: "planact: log_probs_missing: rollout 9: 1 of 2 planner samples have no rollout_log_probs (first: group 10, index 21: turn 1: the reply had no output_token_logprobs), and --use-tis"},
		{name: "one missing with --use-rollout-logprobs", feed: feed(first, missing), args: `{"use_rollout_logprobs": true}`,
			wantErr: "and --use-rollout-logprobs trains with them"},
		{name: "one missing with --get-mismatch-metrics", feed: feed(missing, first), args: `{"get_mismatch_metrics": true}`,
			wantErr: "and --get-mismatch-metrics trains with them"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := slimeRun(t, `
try:
    out = slime_planact.generate_rollout(rollout_args(sys.argv[1], batch=1, **json.loads(sys.argv[2])), 9, DataSource(prompt_groups(1)))
except slime_planact.PlanactError as e:
    print(json.dumps({"error": str(e)}))
    sys.exit(0)
flat = [s for g in out.samples for s in g]
# what slime's _convert_samples_to_train_data takes
takes = [s.rollout_log_probs for s in flat] if flat[0].rollout_log_probs is not None else None
print(json.dumps({"samples": [sample_json(s) for s in flat], "metrics": out.metrics, "takes": takes}))
`, map[string]string{"PLANACT_ROLE": "planner", "PLANACT_ENGINE_URL": engine}, c.feed, engine, c.args)
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Error   string             `json:"error"`
				Samples []pySample         `json:"samples"`
				Metrics map[string]float64 `json:"metrics"`
				Takes   [][]float64        `json:"takes"`
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("python printed %q: %v", out, err)
			}
			if c.wantErr != "" {
				if !strings.Contains(got.Error, c.wantErr) {
					t.Errorf("error %q, want PlanactError containing %q", got.Error, c.wantErr)
				}
				return
			}
			if got.Error != "" {
				t.Fatalf("error %s", got.Error)
			}
			for _, s := range got.Samples {
				want, ok := c.wantLP[s.Index]
				if c.wantLP == nil && s.RolloutLogProbs != nil || c.wantLP != nil && (!ok || s.RolloutLogProbs == nil || !slices.Equal(s.RolloutLogProbs, want)) {
					t.Errorf("sample %d (response_length %d): rollout_log_probs %s, want %s", s.Index, s.ResponseLength, pyList(s.RolloutLogProbs), pyList(want))
				}
			}
			if (got.Takes != nil) != (c.wantLP != nil) {
				t.Errorf("slime takes log-probs %v (nil: none): want them for all samples or none (%v)", got.Takes, c.wantLP)
			}
			for i, lp := range got.Takes {
				if lp == nil || len(lp) != got.Samples[i].ResponseLength {
					t.Errorf("slime takes %v for sample %d of response_length %d", lp, got.Samples[i].Index, got.Samples[i].ResponseLength)
				}
			}
			for k, v := range c.metrics {
				if g, ok := got.Metrics[k]; !ok || g != v {
					t.Errorf("metric %s = %v, want %v (metrics %v)", k, g, v, got.Metrics)
				}
			}
		})
	}
}

// pyList is a list as Python prints it: None when nil.
func pyList(v []float64) string {
	if v == nil {
		return "None"
	}
	return fmt.Sprint(v)
}

// TestPythonSlimeAbortedGroups: an episode that ended aborted (stopped by
// max_staleness: reward 0) is not trained on, as slime trains on no
// ABORTED sample, and neither is the rest of its group, which without it
// is not the n_samples_per_prompt copies a group-relative baseline
// compares. With --partial-rollout each such group goes back to the data
// source once, as it was read, like the groups stopped before they ended,
// and is never both trained on and given back. The actor's samples of an
// aborted episode (its acts completed) are known by the task's state.
func TestPythonSlimeAbortedGroups(t *testing.T) {
	t.Parallel()
	engine := engineServer(t, "4")
	t.Run("planner", func(t *testing.T) {
		const n = 9
		base := plannerSamples(n)
		ep := func(s schema.Sample, gi, index, e int, status string, reward float64) schema.Sample {
			s.GroupIndex, s.Index, s.RolloutID, s.Status, s.Reward = gi, index, fmt.Sprintf("%d-%d", n, e), status, reward
			s.Metadata = map[string]any{"rollout": n, "episode": e}
			if status == schema.EpisodeAborted {
				s.Metadata["end_reason"] = "stale: planner weights 4 versions behind"
			}
			return s
		}
		samples := []schema.Sample{base[1], base[3], // group 10: trained
			ep(base[1], 11, 22, 2, schema.EpisodeCompleted, 1), ep(base[3], 11, 23, 3, schema.EpisodeAborted, 0), // one copy aborted
			ep(base[1], 12, 24, 4, schema.EpisodeAborted, 0), ep(base[3], 12, 25, 5, schema.EpisodeAborted, 0)} // every copy aborted
		tasks := trained(10, 11, 12)
		for _, i := range []int{3, 4, 5} {
			tasks[i].State, tasks[i].Reason = schema.TaskAborted, "stale: planner weights 4 versions behind"
		}
		var feed slimeFeed
		feed.answer(t, subject.Result(n, schema.RolePlanner), &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK,
			Samples: samples, SampleCount: len(samples), Tasks: tasks})
		out, err := slimeRun(t, `
ds = DataSource(prompt_groups(3))
print_rollout(slime_planact.generate_rollout(rollout_args(sys.argv[1], batch=3, partial_rollout=True), 9, ds), ds)
`, map[string]string{"PLANACT_ROLE": "planner", "PLANACT_ENGINE_URL": engine}, feed, engine)
		if err != nil {
			t.Fatal(err)
		}
		r := decodeRollout(t, out)
		checkBatch(t, r.Groups, byGroup(samples[:2], nil), schema.RolePlanner)
		var back []string
		for _, g := range r.Added {
			back = append(back, fmt.Sprintf("%d:%d", g[0].GroupIndex, len(g)))
			for _, s := range g {
				if s.Status != "PENDING" || len(s.Tokens) != 0 {
					t.Errorf("given back sample %d: status %s, %d tokens: want the data source's Sample as it was read", s.Index, s.Status, len(s.Tokens))
				}
			}
		}
		if !slices.Equal(back, []string{"11:2", "12:2"}) {
			t.Errorf("given back to the data source (group:samples) %v, want groups 11 and 12 once each", back)
		}
		for k, v := range map[string]float64{"planact/samples": 6, "planact/aborted_groups_left_out": 2,
			"planact/aborted_samples_left_out": 4, "planact/groups_returned": 2, "planact/tasks_aborted": 3} {
			if g, ok := r.Metrics[k]; !ok || g != v {
				t.Errorf("metric %s = %v, want %v (metrics %v)", k, g, v, r.Metrics)
			}
		}
	})
	t.Run("actor", func(t *testing.T) {
		const n = 8
		samples := actorSamples(n)
		tasks := trained(0, 2)
		tasks[3].State, tasks[3].Reason = schema.TaskAborted, "stale: actor weights 3 versions behind" // episode 5
		var feed slimeFeed
		feed.answer(t, subject.Result(n, schema.RoleActor), &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK,
			Samples: samples, SampleCount: len(samples), Tasks: tasks})
		out, err := slimeRun(t, `
ds = DataSource([])
print_rollout(slime_planact.generate_rollout(rollout_args(sys.argv[1]), 8, ds), ds)
`, map[string]string{"PLANACT_ROLE": "actor", "PLANACT_ENGINE_URL": engine}, feed, engine)
		if err != nil {
			t.Fatal(err)
		}
		r := decodeRollout(t, out)
		checkBatch(t, r.Groups, byGroup(samples, func(s schema.Sample) bool { return s.GroupIndex == 0 }), schema.RoleActor)
		for k, v := range map[string]float64{"planact/aborted_groups_left_out": 1, "planact/aborted_samples_left_out": 2, "planact/groups_returned": 0} {
			if g, ok := r.Metrics[k]; !ok || g != v {
				t.Errorf("metric %s = %v, want %v (metrics %v)", k, g, v, r.Metrics)
			}
		}
	})
}

// TestPythonGroupSampleCount: a group message that holds other than the
// samples it counts (sample_count) is refused, naming both counts, by
// slime_planact (groups taken as they come) and by trainer.py (groups a
// result names delivered): samples lost or doubled on the way are never
// trained on.
func TestPythonGroupSampleCount(t *testing.T) {
	t.Parallel()
	const n = 10
	groupSamples := byGroup(actorSamples(n), nil)
	tasks := trained(0, 2)
	var feed slimeFeed
	for i, g := range []int{0, 2} {
		count := len(groupSamples[g])
		if g == 2 {
			count++ // one sample more than the message holds
		}
		feed.store(t, subject.Group(n, schema.RoleActor, g), &schema.Group{Rollout: n, Role: schema.RoleActor, GroupIndex: g,
			Samples: groupSamples[g], SampleCount: count, Tasks: tasks[2*i : 2*i+2], Delivered: []int{0, 2}[:i+1], Groups: 2})
	}
	feed.answer(t, subject.Result(n, schema.RoleActor), &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK,
		Tasks: tasks, DeliveredGroups: []int{0, 2}, GroupSamples: len(groupSamples[0]) + len(groupSamples[2])})
	want := fmt.Sprintf("group 2 of rollout %d (actor) holds %d samples and counts %d (sample_count)", n, len(groupSamples[2]), len(groupSamples[2])+1)
	t.Run("slime", func(t *testing.T) {
		out, err := slimeRun(t, `
try:
    slime_planact.generate_rollout(rollout_args("http://slime-router:30000"), 10, DataSource([]))
    print("no error")
except slime_planact.PlanactError as e:
    print(f"PlanactError: {e}")
`, map[string]string{"PLANACT_ROLE": "actor", "PLANACT_ENGINE_URL": engineServer(t, "6"), "PLANACT_CONFIG": `{"stream_groups": true}`,
			"PLANACT_TIMEOUT_S": "5"}, feed)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(out)); got != fmt.Sprintf("PlanactError: planact: miscounted: rollout %d (actor): %s", n, want) {
			t.Errorf("got  %s\nwant PlanactError: planact: miscounted: rollout %d (actor): %s", got, n, want)
		}
	})
	t.Run("trainer", func(t *testing.T) {
		out, err := slimeRun(t, `
import asyncio, time, trainer
async def main():
    nc = await nats.connect()
    try:
        await trainer.accept(nc, "actor", await trainer.last_on(nc, sys.argv[1]), "", deadline=time.monotonic() + 5)
        print("no error")
    except trainer.Miscounted as e:
        print(f"Miscounted: {e}")
asyncio.run(main())
`, nil, feed.stored(), subject.Result(n, schema.RoleActor))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(out)); got != "Miscounted: "+want {
			t.Errorf("got  %s\nwant Miscounted: %s", got, want)
		}
	})
}

// pyAnswerArrivals plays planact for scripts that run slime's drivers: an
// arrival (rollout.N.arrive.ROLE) is answered with a result of sys.argv[1]
// (base64 msgpack by kind, encoded by Go): "eval" from
// PLANACT_EVAL_ROLLOUT_OFFSET on, else "train", with the arrival's rollout,
// role and id, finished after it; a rollout id arrived for before gets
// planact's refusal ("rejected") instead. arrivals lists the rollout ids
// in order.
const pyAnswerArrivals = `
import msgpack, os, trainer
templates = {k: base64.b64decode(v) for k, v in json.loads(sys.argv[1]).items()}
eval_from = int(os.environ["PLANACT_EVAL_ROLLOUT_OFFSET"])
used, arrivals = set(), []

def answer(m):
    parts = m.subject.split(".")
    if len(parts) != 4 or parts[0] != "rollout" or parts[2] != "arrive":
        return
    n, role = int(parts[1]), parts[3]
    arrivals.append(n)
    kind = "rejected" if n in used else "eval" if n >= eval_from else "train"
    used.add(n)
    r = msgpack.unpackb(templates[kind], raw=False)
    r["rollout"], r["role"], r["arrival_id"] = n, role, m.headers["Nats-Msg-Id"]
    if kind != "rejected":  # after the arrival: a later arrival passes over it, as over any earlier rollout's
        r.setdefault("stats", {})["finished_ms"] = trainer.arrival_ms(r["arrival_id"]) + 1
    nats.store(f"rollout.{n}.result.{role}" + (".rejected" if kind == "rejected" else ""), msgpack.packb(r, use_bin_type=True))

nats.on_publish.append(answer)
`

// answerTemplates are pyAnswerArrivals' results, as its sys.argv[1].
func answerTemplates(t *testing.T, train, eval *schema.Result) string {
	t.Helper()
	enc := func(r *schema.Result) string { return base64.StdEncoding.EncodeToString(marshal(t, r)) }
	return jsonOf(t, map[string]string{"train": enc(train), "eval": enc(eval),
		"rejected": enc(&schema.Result{Status: schema.ResultInvalid, Reason: "rollout already ended", Rejected: true})})
}

// evalResult is an evaluation's result of dataset nq, its episodes as
// given.
func evalResult(status string, episodes ...schema.EpisodeOutcome) *schema.Result {
	r := &schema.Result{Status: status, Evaluation: true}
	for i := range episodes {
		episodes[i].Episode, episodes[i].Index, episodes[i].Dataset = i, i, "nq"
		state := schema.TaskEvaluated
		if episodes[i].Status == schema.TaskUnfinished || episodes[i].Status == schema.TaskAborted {
			state = episodes[i].Status
		}
		r.Tasks = append(r.Tasks, schema.TaskOutcome{Episode: i, GroupIndex: episodes[i].GroupIndex, Index: i, State: state, Reason: episodes[i].Reason})
	}
	r.Episodes = episodes
	return r
}

// TestPythonSlimeEvalRolloutIDs: both jobs, run by slime's drivers in
// their call order (train.py: an evaluation at rollout_id 0 before
// training and, with --eval-interval 1, again after rollout 0; a restart
// with a new PLANACT_ROLLOUT_OFFSET from a later --start-rollout-id;
// train_async.py, which generates rollout r+1 before evaluating r), arrive
// for a fresh planact rollout id every time, the same in both jobs:
// PLANACT_EVAL_ROLLOUT_OFFSET + 2 * (PLANACT_ROLLOUT_OFFSET + rollout_id),
// + 1 after training rollout rollout_id. planact refuses a rollout id
// that ran before, which would stop training.
func TestPythonSlimeEvalRolloutIDs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	evalData := filepath.Join(dir, "nq.jsonl")
	if err := os.WriteFile(evalData, []byte(`{"question": "What is the capital of France?", "answer": "Paris"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eval := evalResult(schema.ResultOK, schema.EpisodeOutcome{Status: schema.EpisodeCompleted, Reward: 1, Correct: true, Turns: 1},
		schema.EpisodeOutcome{Status: schema.EpisodeCompleted, Turns: 2})
	const first = 1000 // PLANACT_EVAL_ROLLOUT_OFFSET
	want := []int{
		// train.py, PLANACT_ROLLOUT_OFFSET 100, --num-rollout 2, --eval-interval 1
		first + 200, 100, first + 201, 101, first + 203,
		// restarted from --start-rollout-id 1 with PLANACT_ROLLOUT_OFFSET 200, --num-rollout 3
		201, first + 403, 202, first + 405,
		// train_async.py, PLANACT_ROLLOUT_OFFSET 300, --num-rollout 2
		300, 301, first + 601, first + 603,
	}
	engine := engineServer(t, "4")
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		t.Run(role, func(t *testing.T) {
			t.Parallel()
			train := &schema.Result{Status: schema.ResultOK, Samples: actorSamples(0)[:3], SampleCount: 3, Tasks: trained(0)}
			if role == schema.RolePlanner {
				ps := plannerSamples(0)
				train = &schema.Result{Status: schema.ResultOK, Samples: []schema.Sample{ps[1], ps[3]}, SampleCount: 2, Tasks: trained(10)}
			}
			out, err := slimeRun(t, pyAnswerArrivals+`
import importlib
from slime.rollout.base_types import call_rollout_fn
from slime.utils.misc import should_run_periodic_action

args = rollout_args(sys.argv[2], batch=1, eval_prompt_data=["nq", sys.argv[3]], input_key="question", label_key="answer",
                    n_samples_per_eval_prompt=2, eval_interval=1, skip_eval_before_train=False)
ds = DataSource(prompt_groups(1))

def run(r, evaluation):
    call_rollout_fn(slime_planact.generate_rollout, args, r, ds, evaluation=evaluation)

def train_py(start, num_rollout):  # slime's train.py, its rollout and eval calls
    if num_rollout == 0 and args.eval_interval is not None:
        run(0, True)
    for r in range(start, num_rollout):
        if args.eval_interval is not None and r == 0 and not args.skip_eval_before_train:
            run(r, True)
        run(r, False)
        if should_run_periodic_action(r, args.eval_interval, None):
            run(r, True)

def train_async_py(start, num_rollout):  # slime's train_async.py
    run(start, False)
    for r in range(start, num_rollout):
        if r + 1 < num_rollout:
            run(r + 1, False)
        if should_run_periodic_action(r, args.eval_interval, None):
            run(r, True)

error = None
try:
    for offset, driver, start, num_rollout in ((100, train_py, 0, 2), (200, train_py, 1, 3), (300, train_async_py, 0, 2)):
        os.environ["PLANACT_ROLLOUT_OFFSET"] = str(offset)
        importlib.reload(slime_planact)  # a new process
        driver(start, num_rollout)
except slime_planact.PlanactError as e:
    error = str(e)
print(json.dumps({"arrivals": arrivals, "error": error}))
`, map[string]string{"PLANACT_ROLE": role, "PLANACT_ENGINE_URL": engine, "PLANACT_EVAL_ROLLOUT_OFFSET": fmt.Sprint(first),
				"PLANACT_TIMEOUT_S": "5"}, slimeFeed{}, answerTemplates(t, train, eval), engine, evalData)
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Arrivals []int  `json:"arrivals"`
				Error    string `json:"error"`
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("python printed %q: %v", out, err)
			}
			if got.Error != "" || !slices.Equal(got.Arrivals, want) {
				t.Errorf("arrived for %v (error %q)\nwant        %v", got.Arrivals, got.Error, want)
			}
		})
	}
}

// TestPythonSlimeEvalUnended: an evaluation's episode that did not end
// with a reward (unfinished at the rollout's time-out, or aborted) is in
// none of slime's eval lists and in no mean; its status is counted. With
// --log-passrate and --n-samples-per-eval-prompt 2, slime reshapes each
// dataset's rewards into groups of 2 (compute_pass_rate asserts they fill
// them): a group whose episodes did not all end is left out whole, and
// counted.
func TestPythonSlimeEvalUnended(t *testing.T) {
	t.Parallel()
	eval := evalResult(schema.ResultPartial,
		schema.EpisodeOutcome{GroupIndex: 0, Status: schema.EpisodeCompleted, Reward: 1, Correct: true, Turns: 1},
		schema.EpisodeOutcome{GroupIndex: 0, Status: schema.EpisodeCompleted, Turns: 2, Acts: 2},
		schema.EpisodeOutcome{GroupIndex: 1, Status: schema.EpisodeCompleted, Reward: 1, Correct: true, Turns: 1},
		schema.EpisodeOutcome{GroupIndex: 1, Status: schema.TaskAborted, Reason: "stopped: cancelled"},
		schema.EpisodeOutcome{GroupIndex: 2, Status: schema.TaskUnfinished, Reason: "still running at the rollout's time-out"},
		schema.EpisodeOutcome{GroupIndex: 2, Status: schema.EpisodeTruncated, Turns: 3})
	engine := engineServer(t, "4")
	for _, c := range []struct {
		name     string
		passrate bool
		rewards  []float64
		groups   []int
		metrics  map[string]float64
	}{
		{name: "means", rewards: []float64{1, 0, 1, 0}, groups: []int{0, 0, 1, 2},
			metrics: map[string]float64{"episodes": 6, "ended": 4, "mean_reward": 0.5, "accuracy": 0.5, "mean_turns": 7.0 / 4,
				"episodes_aborted": 1, "episodes_unfinished": 1}},
		{name: "log-passrate", passrate: true, rewards: []float64{1, 0}, groups: []int{0, 0},
			metrics: map[string]float64{"episodes": 6, "ended": 2, "mean_reward": 0.5, "groups_dropped": 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := slimeRun(t, pyAnswerArrivals+`
from slime.rollout.base_types import call_rollout_fn
args = rollout_args(sys.argv[2], n_samples_per_eval_prompt=2, log_passrate=json.loads(sys.argv[3]),
                    eval_prompt_data=["nq", "/nowhere/nq.jsonl"])  # the actor's job reads no eval file
output = call_rollout_fn(slime_planact.generate_rollout, args, 7, DataSource([]), evaluation=True)
d = output.data["nq"]
# slime's compute_pass_rate (slime/observability/metric_utils.py), its reshape
group_size = args.n_samples_per_eval_prompt
passrate = len(d["rewards"]) == (len(d["rewards"]) // group_size) * group_size
print(json.dumps({"rewards": d["rewards"], "groups": [s.group_index for s in d["samples"]], "metrics": output.metrics,
                  "passrate_ok": passrate, "lengths": [len(d["rewards"]), len(d["truncated"]), len(d["samples"])]}))
`, map[string]string{"PLANACT_ROLE": "actor", "PLANACT_ENGINE_URL": engine, "PLANACT_EVAL_ROLLOUT_OFFSET": "1000", "PLANACT_TIMEOUT_S": "5"},
				slimeFeed{}, answerTemplates(t, &schema.Result{}, eval), engine, fmt.Sprint(c.passrate))
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Rewards    []float64          `json:"rewards"`
				Groups     []int              `json:"groups"`
				Metrics    map[string]float64 `json:"metrics"`
				PassrateOK bool               `json:"passrate_ok"`
				Lengths    []int              `json:"lengths"`
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("python printed %q: %v", out, err)
			}
			if !slices.Equal(got.Rewards, c.rewards) || !slices.Equal(got.Groups, c.groups) {
				t.Errorf("rewards %v of groups %v, want %v of %v", got.Rewards, got.Groups, c.rewards, c.groups)
			}
			if got.Lengths[1] != got.Lengths[0] || got.Lengths[2] != got.Lengths[0] {
				t.Errorf("rewards, truncated and samples of lengths %v: want one each per episode", got.Lengths)
			}
			if c.passrate && !got.PassrateOK {
				t.Errorf("%d rewards: slime's compute_pass_rate asserts they fill groups of 2", len(got.Rewards))
			}
			for k, v := range c.metrics {
				for _, prefix := range []string{"planact_eval/nq/", "planact_eval/"} {
					if g, ok := got.Metrics[prefix+k]; !ok || g != v {
						t.Errorf("metric %s%s = %v, want %v (metrics %v)", prefix, k, g, v, slices.Sorted(maps.Keys(got.Metrics)))
					}
				}
			}
		})
	}
}
