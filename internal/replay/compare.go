package replay

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"

	"github.com/planact/planact/pkg/schema"
)

// Difference is one thing the replay did otherwise than the recording.
type Difference struct {
	// Where names it: "episode 3 turn 2 dag", "planner sample 7-3 tokens".
	Where string `json:"where"`
	Want  string `json:"recorded"`
	Got   string `json:"replayed"`
}

func (d Difference) String() string {
	return fmt.Sprintf("%s: recorded %s, replayed %s", d.Where, d.Want, d.Got)
}

// Compare lists what got (a replay) did otherwise than want (the
// recording), for want's episodes: their turns (observations, outputs,
// DAGs, answers, parse errors), trajectories token by token, acts, ends,
// and each role's samples of them bit for bit (timings aside), task
// states and, with whole (a replay of every episode), the results'
// statuses, reasons and stats.
func Compare(want, got *Recording, whole bool) []Difference {
	var ds []Difference
	add := func(where string, w, g any) {
		ds = append(ds, Difference{Where: where, Want: show(w), Got: show(g)})
	}
	check := func(where string, w, g any) {
		if !reflect.DeepEqual(w, g) {
			add(where, w, g)
		}
	}
	for _, wep := range want.Episodes {
		gep := got.Episode(wep.Episode)
		where := fmt.Sprintf("episode %d", wep.Episode)
		if gep == nil {
			add(where, "recorded", "not replayed")
			continue
		}
		compareTurns(where, wep, gep, add, check)
		compareTrajectory(where, wep.Trajectory, gep.Trajectory, add, check)
		compareActs(where, wep.Acts, gep.Acts, add, check)
		switch {
		case (wep.End == nil) != (gep.End == nil):
			add(where+" end", endText(wep.End), endText(gep.End))
		case wep.End != nil:
			check(where+" status", wep.End.Status, gep.End.Status)
			check(where+" reason", wep.End.Reason, gep.End.Reason)
			check(where+" answers", wep.End.Answers, gep.End.Answers)
			check(where+" turns", wep.End.Turns, gep.End.Turns)
			check(where+" acts", wep.End.Acts, gep.End.Acts)
		}
	}
	episodes := map[int]bool{}
	for _, ep := range want.Episodes {
		episodes[ep.Episode] = true
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		compareResult(role, want, got, episodes, whole, add, check)
	}
	return ds
}

func compareTurns(where string, w, g *Episode, add func(string, any, any), check func(string, any, any)) {
	if len(w.Turns) != len(g.Turns) {
		add(where+" turns", len(w.Turns), len(g.Turns))
	}
	for i := range min(len(w.Turns), len(g.Turns)) {
		wt, gt := w.Turns[i], g.Turns[i]
		at := fmt.Sprintf("%s turn %d", where, wt.Turn)
		check(at+" number", wt.Turn, gt.Turn)
		check(at+" observation", wt.Observation, gt.Observation)
		check(at+" output", wt.Output, gt.Output)
		check(at+" text", wt.Text, gt.Text)
		check(at+" finish reason", wt.FinishReason, gt.FinishReason)
		check(at+" truncated", wt.Truncated, gt.Truncated)
		check(at+" weight version", wt.WeightVersion, gt.WeightVersion)
		check(at+" partial dags", wt.Partials, gt.Partials)
		check(at+" dag", jsonOf(wt.DAG), jsonOf(gt.DAG))
		check(at+" answers", wt.Answers, gt.Answers)
		check(at+" plan error", wt.Error, gt.Error)
	}
}

func compareTrajectory(where string, w, g []schema.Segment, add func(string, any, any), check func(string, any, any)) {
	if len(w) != len(g) {
		add(where+" trajectory segments", len(w), len(g))
	}
	for i := range min(len(w), len(g)) {
		ws, gs := w[i], g[i]
		at := fmt.Sprintf("%s trajectory segment %d (%s, turn %d)", where, i, ws.Kind, ws.Turn)
		check(at+" kind", ws.Kind, gs.Kind)
		check(at+" text", ws.Text, gs.Text)
		if d := firstIntDiff(ws.IDs, gs.IDs); d >= 0 {
			add(at+" ids", idsAt(ws.IDs, d), idsAt(gs.IDs, d))
		}
		if d := firstFloatDiff(ws.LogProbs, gs.LogProbs); d >= 0 {
			add(at+" log-probs", floatsAt(ws.LogProbs, d), floatsAt(gs.LogProbs, d))
		}
		check(at+" weight version", ws.Version, gs.Version)
		check(at+" log_probs_missing", ws.LogProbsMissing, gs.LogProbsMissing)
		check(at+" staleness_unchecked", ws.StalenessUnchecked, gs.StalenessUnchecked)
	}
}

func compareActs(where string, w, g []schema.ActDone, add func(string, any, any), check func(string, any, any)) {
	gotActs := map[string]schema.ActDone{}
	for _, d := range g {
		gotActs[d.Key] = d
	}
	seen := map[string]bool{}
	for _, wd := range w {
		seen[wd.Key] = true
		at := fmt.Sprintf("%s act %s", where, wd.Key)
		gd, ok := gotActs[wd.Key]
		if !ok {
			add(at, actText(wd), "no outcome")
			continue
		}
		check(at+" tool", wd.Tool, gd.Tool)
		check(at+" input", wd.Input, gd.Input)
		check(at+" status", wd.Status, gd.Status)
		check(at+" output", wd.Output, gd.Output)
		check(at+" error kind", wd.ErrorKind, gd.ErrorKind)
		check(at+" attempts", wd.Attempts, gd.Attempts)
		wg, gg := wd.Generation, gd.Generation
		if (wg == nil) != (gg == nil) {
			add(at+" generation", wg != nil, gg != nil)
			continue
		}
		if wg == nil {
			continue
		}
		check(at+" prompt", wg.Prompt, gg.Prompt)
		if d := firstIntDiff(wg.PromptIDs, gg.PromptIDs); d >= 0 {
			add(at+" prompt ids", idsAt(wg.PromptIDs, d), idsAt(gg.PromptIDs, d))
		}
		if d := firstIntDiff(wg.OutputIDs, gg.OutputIDs); d >= 0 {
			add(at+" output ids", idsAt(wg.OutputIDs, d), idsAt(gg.OutputIDs, d))
		}
		if d := firstFloatDiff(wg.LogProbs, gg.LogProbs); d >= 0 {
			add(at+" log-probs", floatsAt(wg.LogProbs, d), floatsAt(gg.LogProbs, d))
		}
		check(at+" text", wg.Text, gg.Text)
		check(at+" finish reason", wg.FinishReason, gg.FinishReason)
		check(at+" weight version", wg.WeightVersion, gg.WeightVersion)
		check(at+" truncated", wg.Truncated, gg.Truncated)
	}
	for _, gd := range g {
		if !seen[gd.Key] {
			add(fmt.Sprintf("%s act %s", where, gd.Key), "none", actText(gd))
		}
	}
}

func compareResult(role string, want, got *Recording, episodes map[int]bool, whole bool, add func(string, any, any), check func(string, any, any)) {
	wr, gr := want.Results[role], got.Results[role]
	where := role + " result"
	if wr == nil || gr == nil {
		if (wr == nil) != (gr == nil) {
			add(where, wr != nil, gr != nil)
		}
		return
	}
	if whole {
		check(where+" status", wr.Status, gr.Status)
		check(where+" reason", wr.Reason, gr.Reason)
		check(where+" sample count", wr.SampleCount, gr.SampleCount)
		check(where+" stats", jsonOf(wr.Stats), jsonOf(gr.Stats))
		check(where+" evaluation", wr.Evaluation, gr.Evaluation)
	}
	gotTasks := map[int]schema.TaskOutcome{}
	for _, t := range gr.Tasks {
		gotTasks[t.Episode] = t
	}
	for _, t := range wr.Tasks {
		if episodes[t.Episode] {
			check(fmt.Sprintf("%s task %d", where, t.Episode), t, gotTasks[t.Episode])
		}
	}
	gotEps := map[int]schema.EpisodeOutcome{}
	for _, o := range gr.Episodes {
		gotEps[o.Episode] = o
	}
	for _, o := range wr.Episodes {
		if episodes[o.Episode] {
			check(fmt.Sprintf("%s episode outcome %d", where, o.Episode), jsonOf(o), jsonOf(gotEps[o.Episode]))
		}
	}
	key := func(s Sample) string { return strings.TrimSpace(s.RolloutID + " " + s.Key) }
	mine := func(s Sample) bool {
		var n int64
		var e int
		_, err := fmt.Sscanf(s.RolloutID, "%d-%d", &n, &e)
		return err == nil && episodes[e]
	}
	gotSamples := map[string]Sample{}
	for _, s := range gr.Samples {
		gotSamples[key(s)] = s
	}
	seen := map[string]bool{}
	for _, ws := range wr.Samples {
		if !mine(ws) {
			continue
		}
		k := key(ws)
		seen[k] = true
		at := fmt.Sprintf("%s sample %s", role, k)
		gs, ok := gotSamples[k]
		if !ok {
			add(at, "a sample", "none")
			continue
		}
		wv, gv := reflect.ValueOf(ws), reflect.ValueOf(gs)
		for i := range wv.NumField() {
			f := wv.Type().Field(i)
			if f.Name == "Reward" {
				if math.Float64bits(ws.Reward) != math.Float64bits(gs.Reward) {
					add(at+" reward", ws.Reward, gs.Reward)
				}
				continue
			}
			check(at+" "+jsonName(f.Tag.Get("json")), wv.Field(i).Interface(), gv.Field(i).Interface())
		}
	}
	for _, gs := range gr.Samples {
		if k := key(gs); mine(gs) && !seen[k] {
			add(fmt.Sprintf("%s sample %s", role, k), "none", "a sample")
		}
	}
}

func jsonName(tag string) string {
	for i, c := range tag {
		if c == ',' {
			return tag[:i]
		}
	}
	return tag
}

func firstIntDiff(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

func firstFloatDiff(a, b []float64) int {
	for i := range min(len(a), len(b)) {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// idsAt says what ids holds at position d, where it differs from another.
func idsAt(ids []int, d int) string {
	if d >= len(ids) {
		return fmt.Sprintf("%d ids (ends before position %d)", len(ids), d)
	}
	return fmt.Sprintf("%d ids, from position %d: %v", len(ids), d, ids[d:min(d+8, len(ids))])
}

func floatsAt(v []float64, d int) string {
	if d >= len(v) {
		return fmt.Sprintf("%d values (ends before position %d)", len(v), d)
	}
	return fmt.Sprintf("%d values, at position %d: %v", len(v), d, v[d])
}

func endText(e *schema.EpisodeEnd) string {
	if e == nil {
		return "no end"
	}
	return fmt.Sprintf("%s (%s)", e.Status, e.Reason)
}

func actText(d schema.ActDone) string {
	return fmt.Sprintf("%s %s(%q): %s", d.NodeID, d.Tool, d.Input, d.Status)
}

func jsonOf(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(data)
}

// show is how a difference prints a value: strings quoted, the rest as JSON.
func show(v any) string {
	switch t := v.(type) {
	case string:
		if len(t) > 0 && (t[0] == '{' || t[0] == '[' || t == "null") {
			return t
		}
		s := fmt.Sprintf("%q", t)
		if len(s) > 300 {
			s = s[:300] + "…"
		}
		return s
	}
	s := jsonOf(v)
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
