package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
)

// pyEvalJobs runs slime's evaluation at rollout_id 7 in both jobs, the
// planner's and then the actor's, with slime's args from sys.argv[1]
// (JSON: "args", and with "slime" the eval datasets "datasets" and
// "defaults" resolved into args.eval_datasets by slime's own
// build_eval_dataset_configs, as slime's arguments.py does for
// --eval-config and --eval-prompt-data; without, args as slime before Oct
// 2025 had them; "actor" holds the actor's job's own, where it differs).
// It plays planact: an arrival is answered with an evaluation whose
// episodes are the planner's tasks for that rollout (one each, completed,
// reward 1 for an even index). It prints what both jobs published, and
// each job's eval data (per dataset, its samples' planact_rollout_id) or
// error.
const pyEvalJobs = `
import msgpack, os, trainer
from slime.rollout.base_types import call_rollout_fn
from slime.utils.eval_config import build_eval_dataset_configs, ensure_dataset_list

planner_tasks = {}  # rollout -> the tasks the planner's job sent

def answer(m):
    parts = m.subject.split(".")
    if len(parts) != 4 or parts[0] != "rollout" or parts[2] != "arrive":
        return
    n, role = int(parts[1]), parts[3]
    if role == "planner":
        planner_tasks[n] = msgpack.unpackb(m.data, raw=False).get("tasks") or []
    episodes = [{"episode": i, "group_index": t["group_index"], "index": t["index"], "dataset": t.get("dataset", ""),
                 "status": "completed", "reward": float(t["index"] % 2 == 0), "correct": t["index"] % 2 == 0, "turns": 1, "acts": 1}
                for i, t in enumerate(planner_tasks.get(n, []))]
    arrival = m.headers["Nats-Msg-Id"]
    r = {"schema": "rollout.result/1", "rollout": n, "role": role, "status": "ok", "evaluation": True, "episodes": episodes,
         "sample_count": 0, "arrival_id": arrival, "stats": {"finished_ms": trainer.arrival_ms(arrival) + 1}}
    nats.store(f"rollout.{n}.result.{role}", msgpack.packb(r, use_bin_type=True))

nats.on_publish.append(answer)

def job(role, spec):
    os.environ["PLANACT_ROLE"] = role
    args = rollout_args(sys.argv[2], **spec["args"])
    if spec.get("slime"):
        args.eval_datasets = build_eval_dataset_configs(args, ensure_dataset_list(spec["datasets"]), spec.get("defaults") or {})
    try:
        output = call_rollout_fn(slime_planact.generate_rollout, args, 7, DataSource([]), evaluation=True)
    except (ValueError, slime_planact.PlanactError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return {"data": {name: [s.metadata["planact_rollout_id"] for s in d["samples"]] for name, d in output.data.items()}}

spec = json.loads(sys.argv[1])
report = {"planner": job("planner", spec)}
if "error" not in report["planner"]:
    report["actor"] = job("actor", {**spec, **(spec.get("actor") or {})})
print(json.dumps({"published": published(), **report}))
`

// evalRolloutWant is what one planact rollout of an evaluation must carry.
type evalRolloutWant struct {
	rollout int64
	copies  map[string]int // dataset -> tasks per prompt (n_samples_per_eval_prompt)
	planner schema.Sampling
	actor   schema.Sampling
}

// TestPythonSlimeEvalSampling: slime_planact evaluates each of slime's eval
// datasets with the sampling slime would (THUDM/slime 624b824a,
// slime/utils/eval_config.py and sglang_rollout.eval_rollout_single_dataset):
// the dataset's own temperature, top_p, top_k, max_response_len and
// n_samples_per_eval_prompt, else eval.defaults', else --eval-temperature,
// --eval-top-p, --eval-top-k, --eval-max-response-len,
// --n-samples-per-eval-prompt, else the training flags --rollout-*,
// --n-samples-per-prompt. Each job resolves them from its own flags for
// its own model, and sends that model's sampling (temperature, top_p,
// max_new_tokens; top_k 1 is greedy, temperature 0) in its arrival, over
// its PLANACT_CONFIG's <role>_sampling, with PLANACT_EVAL_CONFIG's over
// them; the config the planner sends carries neither role's. (Before, the
// planner's job sent its own resolution for both models: the actor's
// --eval-* and --rollout-* flags played no part.) The copies come from the
// planner's job; what slime leaves unset keeps the training config's
// value, never greedy. Each dataset is a planact rollout of its own (a
// rollout has one config), with ids PLANACT_EVAL_ROLLOUT_OFFSET + datasets
// * (2 * rollout_id) + its place, the same in both jobs whatever their
// own training flags; the actor's sends neither tasks nor config. A
// setting planact cannot take, or out of its range, is an error naming the
// dataset, in the job whose flags hold it, and that job sends nothing; so
// is an actor's job whose eval args put other datasets in a rollout than
// the planner's.
func TestPythonSlimeEvalSampling(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	prompts := map[string]int{"nq": 2, "hotpotqa": 1, "aime": 1, "math": 1, "empty": 0}
	path := map[string]string{}
	for name, n := range prompts {
		var lines strings.Builder
		for i := range n {
			lines.WriteString(jsonOf(t, map[string]any{"question": fmt.Sprintf("%s question %d?", name, i), "answer": "Paris"}) + "\n")
		}
		path[name] = filepath.Join(dir, name+".jsonl")
		if err := os.WriteFile(path[name], []byte(lines.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// dataset entries of --eval-config (or of --eval-prompt-data: name and path only)
	ds := func(name string, kv ...any) map[string]any {
		d := map[string]any{"name": name, "path": path[name]}
		for i := 0; i < len(kv); i += 2 {
			d[kv[i].(string)] = kv[i+1]
		}
		return d
	}
	promptData := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, n, path[n])
		}
		return out
	}
	// slime's defaults for the flags it always has (slime/utils/arguments.py)
	flags := func(kv ...any) map[string]any {
		a := map[string]any{"input_key": "question", "label_key": "answer", "eval_temperature": nil, "rollout_temperature": 1.0,
			"eval_top_p": nil, "rollout_top_p": 1.0, "eval_top_k": nil, "rollout_top_k": -1, "eval_max_response_len": nil,
			"rollout_max_response_len": nil, "n_samples_per_eval_prompt": 1, "n_samples_per_prompt": 8}
		for i := 0; i < len(kv); i += 2 {
			a[kv[i].(string)] = kv[i+1]
		}
		return a
	}
	f, seed := schema.Float, func(v int64) *int64 { return &v }
	// PLANACT_CONFIG: the training sampling, planner's and actor's
	const config = `{"max_turns": 3, "planner_sampling": {"temperature": 0.7, "max_new_tokens": 900}, "actor_sampling": {"max_new_tokens": 64, "seed": 5}}`
	engine := engineServer(t, "4")
	for _, c := range []struct {
		name    string
		spec    map[string]any
		evalCfg string // PLANACT_EVAL_CONFIG
		want    []evalRolloutWant
		wants   string // the planner's error, else the actor's
	}{
		{name: "eval config", spec: map[string]any{"slime": true,
			"args":     flags("eval_top_p", 0.95, "rollout_temperature", 0.8, "rollout_max_response_len", 512),
			"defaults": map[string]any{"max_response_len": 300},
			"datasets": []any{ds("nq", "temperature", 0.0, "n_samples_per_eval_prompt", 3), ds("hotpotqa", "top_k", 1, "max_response_len", 200),
				ds("aime"), ds("math", "temperature", 0.0, "n_samples_per_eval_prompt", 2)}},
			// 1000 + 4 * (2 * 7) + the dataset's place
			want: []evalRolloutWant{
				{1056, map[string]int{"nq": 3},
					schema.Sampling{Temperature: f(0), TopP: f(0.95), MaxNewTokens: 300},
					schema.Sampling{Temperature: f(0), TopP: f(0.95), MaxNewTokens: 300, Seed: seed(5)}},
				{1057, map[string]int{"hotpotqa": 1}, // top_k 1: greedy
					schema.Sampling{Temperature: f(0), TopP: f(0.95), MaxNewTokens: 200},
					schema.Sampling{Temperature: f(0), TopP: f(0.95), MaxNewTokens: 200, Seed: seed(5)}},
				{1058, map[string]int{"aime": 1}, // --rollout-temperature, eval.defaults' max_response_len
					schema.Sampling{Temperature: f(0.8), TopP: f(0.95), MaxNewTokens: 300},
					schema.Sampling{Temperature: f(0.8), TopP: f(0.95), MaxNewTokens: 300, Seed: seed(5)}},
				{1059, map[string]int{"math": 2}, // nq's sampling, a rollout of its own
					schema.Sampling{Temperature: f(0), TopP: f(0.95), MaxNewTokens: 300},
					schema.Sampling{Temperature: f(0), TopP: f(0.95), MaxNewTokens: 300, Seed: seed(5)}},
			}},
		{name: "eval prompt data", spec: map[string]any{"slime": true, "datasets": []any{ds("nq"), ds("hotpotqa")},
			"args": flags("eval_prompt_data", promptData("nq", "hotpotqa"), "eval_temperature", 0.6, "rollout_top_p", 0.9,
				"eval_max_response_len", 400, "rollout_max_response_len", 700, "n_samples_per_eval_prompt", 2)},
			want: []evalRolloutWant{{1028, map[string]int{"nq": 2},
				schema.Sampling{Temperature: f(0.6), TopP: f(0.9), MaxNewTokens: 400},
				schema.Sampling{Temperature: f(0.6), TopP: f(0.9), MaxNewTokens: 400, Seed: seed(5)}},
				{1029, map[string]int{"hotpotqa": 2},
					schema.Sampling{Temperature: f(0.6), TopP: f(0.9), MaxNewTokens: 400},
					schema.Sampling{Temperature: f(0.6), TopP: f(0.9), MaxNewTokens: 400, Seed: seed(5)}}}},
		{name: "older slime", spec: map[string]any{"args": map[string]any{"eval_prompt_data": promptData("nq"), "input_key": "question",
			"label_key": "answer", "eval_temperature": nil, "rollout_temperature": 1.0, "n_samples_per_eval_prompt": nil}},
			evalCfg: `{"actor_sampling": {"temperature": 0.2}}`,
			// --n-samples-per-prompt 2 (rollout_args); no top_p or
			// max_response_len: the config's stay; PLANACT_EVAL_CONFIG wins
			want: []evalRolloutWant{{1014, map[string]int{"nq": 2},
				schema.Sampling{Temperature: f(1), MaxNewTokens: 900},
				schema.Sampling{Temperature: f(0.2), MaxNewTokens: 64, Seed: seed(5)}}}},
		{name: "nothing set", spec: map[string]any{"args": map[string]any{"eval_prompt_data": promptData("nq", "aime"), "input_key": "question"}},
			want: []evalRolloutWant{{1028, map[string]int{"nq": 2},
				schema.Sampling{Temperature: f(0.7), MaxNewTokens: 900},
				schema.Sampling{MaxNewTokens: 64, Seed: seed(5)}},
				{1029, map[string]int{"aime": 2},
					schema.Sampling{Temperature: f(0.7), MaxNewTokens: 900},
					schema.Sampling{MaxNewTokens: 64, Seed: seed(5)}}}},
		{name: "top_k", spec: map[string]any{"slime": true, "args": flags(), "datasets": []any{ds("nq", "top_k", 20)}},
			wants: "ValueError: eval dataset nq: top_k 20 (the dataset's or eval.defaults', else --eval-top-k, else --rollout-top-k): planact's sampling has no top_k"},
		{name: "rollout top_k", spec: map[string]any{"slime": true, "args": flags("rollout_top_k", 50), "datasets": []any{ds("nq")}},
			wants: "ValueError: eval dataset nq: top_k 50"},
		{name: "temperature", spec: map[string]any{"slime": true, "args": flags(), "datasets": []any{ds("aime"), ds("nq", "temperature", -0.5)}},
			wants: "ValueError: eval dataset nq: temperature -0.5"},
		{name: "top_p", spec: map[string]any{"slime": true, "args": flags("eval_top_p", 0), "datasets": []any{ds("nq")}},
			wants: "ValueError: eval dataset nq: top_p 0"},
		{name: "max_response_len", spec: map[string]any{"slime": true, "args": flags(), "datasets": []any{ds("nq", "max_response_len", 0)}},
			wants: "ValueError: eval dataset nq: max_response_len 0"},
		{name: "samples per prompt", spec: map[string]any{"slime": true, "args": flags(), "datasets": []any{ds("nq", "n_samples_per_eval_prompt", 0)}},
			wants: "ValueError: eval dataset nq: n_samples_per_eval_prompt 0"},
		{name: "empty dataset", spec: map[string]any{"slime": true, "args": flags(), "datasets": []any{ds("nq"), ds("empty", "temperature", 0.0)}},
			wants: "ValueError: eval dataset empty: " + path["empty"] + " holds no prompts"},
		// The jobs train different models, with their own flags (here
		// --rollout-max-response-len and --eval-temperature), which
		// slime's fallbacks put in each job's eval datasets: each model is
		// sampled as its own job says, in the same rollouts.
		{name: "jobs' flags differ", spec: map[string]any{"slime": true,
			"args":     flags("rollout_max_response_len", 300),
			"datasets": []any{ds("nq", "max_response_len", 300), ds("hotpotqa")},
			"actor":    map[string]any{"args": flags("rollout_max_response_len", 700, "eval_temperature", 0.3)}},
			want: []evalRolloutWant{
				{1028, map[string]int{"nq": 1},
					schema.Sampling{Temperature: f(1), TopP: f(1), MaxNewTokens: 300},
					schema.Sampling{Temperature: f(0.3), TopP: f(1), MaxNewTokens: 300, Seed: seed(5)}},
				{1029, map[string]int{"hotpotqa": 1},
					schema.Sampling{Temperature: f(1), TopP: f(1), MaxNewTokens: 300},
					schema.Sampling{Temperature: f(0.3), TopP: f(1), MaxNewTokens: 700, Seed: seed(5)}},
			}},
		// The actor's own flags hold what planact cannot take: its job
		// says so, naming the dataset.
		{name: "actor's top_k", spec: map[string]any{"slime": true, "args": flags(), "datasets": []any{ds("nq")},
			"actor": map[string]any{"args": flags("rollout_top_k", 20)}},
			wants: "ValueError: eval dataset nq: top_k 20"},
		// The actor's job evaluates the same datasets in the other order of
		// samplings: its rollouts hold the other dataset.
		{name: "jobs disagree", spec: map[string]any{"slime": true, "args": flags(),
			"datasets": []any{ds("nq", "temperature", 0.0), ds("hotpotqa")},
			"actor":    map[string]any{"datasets": []any{ds("hotpotqa", "temperature", 0.0), ds("nq")}}},
			wants: "PlanactError: planact: mismatch: evaluation 1028 (actor) holds episodes of datasets ['nq']; this job evaluates hotpotqa there"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"PLANACT_ENGINE_URL": engine, "PLANACT_EVAL_ROLLOUT_OFFSET": "1000", "PLANACT_TIMEOUT_S": "5",
				"PLANACT_CONFIG": config, "PLANACT_EVAL_CONFIG": c.evalCfg}
			out, err := slimeRun(t, pyEvalJobs, env, slimeFeed{}, jsonOf(t, c.spec), engine)
			if err != nil {
				t.Fatal(err)
			}
			type job struct {
				Data  map[string][]string `json:"data"`
				Error string              `json:"error"`
			}
			var got struct {
				Published      []pyMsg
				Planner, Actor *job
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("python printed %q: %v", out, err)
			}
			arrivals := map[string][]schema.Arrive{}
			for _, m := range got.Published {
				var a schema.Arrive
				if err := schema.UnmarshalStrict(m.body(t), &a); err != nil {
					t.Fatalf("the Go decoder refuses the arrival on %s: %v", m.Subject, err)
				}
				arrivals[a.Role] = append(arrivals[a.Role], a)
			}
			if c.wants != "" {
				e := got.Planner.Error
				if got.Actor != nil {
					e = got.Actor.Error
				}
				if !strings.HasPrefix(e, c.wants) {
					t.Errorf("got  %s\nwant %s…", e, c.wants)
				}
				if got.Actor == nil && len(got.Published) != 0 {
					t.Errorf("the planner's job published %d messages before its error: want none", len(got.Published))
				}
				return
			}
			if got.Planner.Error != "" || got.Actor.Error != "" {
				t.Fatalf("planner: %s; actor: %s", got.Planner.Error, got.Actor.Error)
			}
			planner, actor := arrivals[schema.RolePlanner], arrivals[schema.RoleActor]
			if len(planner) != len(c.want) || len(actor) != len(c.want) {
				t.Fatalf("%d planner and %d actor arrivals: want %d each, one per dataset", len(planner), len(actor), len(c.want))
			}
			datasets := map[string]int64{} // dataset -> its rollout
			for i, w := range c.want {
				p, a := planner[i], actor[i]
				if p.Rollout != w.rollout || a.Rollout != w.rollout || a.Config != nil || len(a.Tasks) != 0 {
					t.Errorf("arrival %d: the planner's for rollout %d, the actor's for %d with config %+v and %d tasks: want both %d, the actor's with neither",
						i, p.Rollout, a.Rollout, a.Config, len(a.Tasks), w.rollout)
				}
				copies := map[string]int{}
				groups := map[int]int{}
				for _, task := range p.Tasks {
					groups[task.GroupIndex]++
					copies[task.Dataset] = groups[task.GroupIndex]
					datasets[task.Dataset] = p.Rollout
				}
				if !maps.Equal(copies, w.copies) || len(p.Tasks) != sumCopies(w.copies, prompts) {
					t.Errorf("rollout %d: %d tasks, copies per prompt %v: want %v of each prompt", p.Rollout, len(p.Tasks), copies, w.copies)
				}
				if p.Config == nil || p.Sampling == nil || a.Sampling == nil {
					t.Fatalf("rollout %d: the planner's arrival has config %v, sampling %v; the actor's sampling %v: want all three",
						p.Rollout, p.Config != nil, p.Sampling != nil, a.Sampling != nil)
				}
				cfg := *p.Config
				if !cfg.Evaluation || cfg.MaxTurns != 3 || !reflect.DeepEqual(*p.Sampling, w.planner) || !reflect.DeepEqual(*a.Sampling, w.actor) ||
					!reflect.DeepEqual(cfg.PlannerSampling, schema.Sampling{}) || !reflect.DeepEqual(cfg.ActorSampling, schema.Sampling{}) {
					t.Errorf("rollout %d: config evaluation %v, max_turns %d, sampling %s and %s (the config's: %s, %s)\nwant evaluation, max_turns 3, %s, %s, none in the config",
						p.Rollout, cfg.Evaluation, cfg.MaxTurns, samplingString(*p.Sampling), samplingString(*a.Sampling),
						samplingString(cfg.PlannerSampling), samplingString(cfg.ActorSampling), samplingString(w.planner), samplingString(w.actor))
				}
				if err := cfg.TakeSampling(schema.RolePlanner, *p.Sampling, schema.RolePlanner); err != nil {
					t.Error(err)
				}
				if err := cfg.TakeSampling(schema.RoleActor, *a.Sampling, schema.RolePlanner); err != nil {
					t.Error(err)
				}
				if err := cfg.WithDefaults().Validate(); err != nil {
					t.Errorf("rollout %d: planact refuses the config: %v", p.Rollout, err)
				}
			}
			// Both jobs' eval data: every dataset, its episodes from its own rollout.
			for role, j := range map[string]*job{"planner": got.Planner, "actor": got.Actor} {
				if !slices.Equal(slices.Sorted(maps.Keys(j.Data)), slices.Sorted(maps.Keys(datasets))) {
					t.Errorf("%s: eval data of %v: want %v", role, slices.Sorted(maps.Keys(j.Data)), slices.Sorted(maps.Keys(datasets)))
				}
				for name, ids := range j.Data {
					for _, id := range ids {
						if !strings.HasPrefix(id, fmt.Sprintf("%d-", datasets[name])) {
							t.Errorf("%s: dataset %s: sample of planact episode %s: want one of rollout %d", role, name, id, datasets[name])
						}
					}
				}
			}
		})
	}
}

func sumCopies(copies, prompts map[string]int) int {
	n := 0
	for name, k := range copies {
		n += k * prompts[name]
	}
	return n
}

func samplingString(s schema.Sampling) string {
	v := func(p *float64) string {
		if p == nil {
			return "unset"
		}
		return fmt.Sprint(*p)
	}
	seed := "unset"
	if s.Seed != nil {
		seed = fmt.Sprint(*s.Seed)
	}
	return fmt.Sprintf("{temperature %s, top_p %s, max_new_tokens %d, seed %s}", v(s.Temperature), v(s.TopP), s.MaxNewTokens, seed)
}
