// Package replay runs a recorded rollout again through today's planact, the
// real services on an embedded NATS server (plan-parser, act-dispatcher,
// gateways, session-store), with the recorded engine outputs in place of
// the engines, and reports every difference from the recording: turns and
// their DAGs, answers and parse errors, observations, trajectories, acts,
// episode ends, samples bit for bit, rewards, task states and statuses.
//
// A Recording is read from the streams (Record) or from a file (Load), one
// JSON object a line: the header (arrivals and tasks), one line per episode
// (its turns, trajectory, acts and end), one per role's result (its samples
// as digests, its tasks and stats).
package replay

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
)

// Format names the file format, on the header line.
const Format = "planact.replay/1"

// Recording is what a rollout did, as the streams hold it.
type Recording struct {
	Format  string `json:"format"`
	Rollout int64  `json:"rollout"`
	// Arrivals are the trainers' arrivals by role, as sent, less their
	// tasks (in Tasks).
	Arrivals map[string]*schema.Arrive `json:"arrivals"`
	// TasksFrom is the role whose arrival brought the tasks.
	TasksFrom string        `json:"tasks_from"`
	Tasks     []schema.Task `json:"tasks"`
	// Episodes, by index, those recorded (all, or the ones asked for).
	Episodes []*Episode `json:"-"`
	// Results by role.
	Results map[string]*Result `json:"-"`
}

// Episode is one episode as the streams hold it.
type Episode struct {
	Episode int    `json:"episode"`
	Turns   []Turn `json:"turns"`
	// Trajectory is the last planner output's: every turn's prompt or
	// observation and generation, token by token.
	Trajectory []schema.Segment `json:"trajectory,omitempty"`
	// Acts are the act outcomes, by key, without their timings.
	Acts []schema.ActDone   `json:"acts,omitempty"`
	End  *schema.EpisodeEnd `json:"end,omitempty"`
}

// Turn is one planner turn: what was asked, what came out, what it parsed to.
type Turn struct {
	Turn int `json:"turn"`
	// Observation is the plan request's (turns after the first).
	Observation   string `json:"observation,omitempty"`
	Text          string `json:"text"`
	FinishReason  string `json:"finish_reason,omitempty"`
	Truncated     string `json:"truncated,omitempty"`
	WeightVersion string `json:"weight_version,omitempty"`
	// Output says whether the turn's output was published (a turn the
	// planner could not be asked has none, only an error).
	Output bool `json:"output"`
	// Partials counts the partial DAGs of a streamed turn.
	Partials int        `json:"partials,omitempty"`
	DAG      *plan.Plan `json:"dag,omitempty"`
	Answers  []string   `json:"answers,omitempty"`
	Error    *PlanError `json:"error,omitempty"`
}

// PlanError is a turn's plan error.
type PlanError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// Result is one role's result, its samples as digests.
type Result struct {
	Role        string                  `json:"role"`
	Status      string                  `json:"status"`
	Reason      string                  `json:"reason,omitempty"`
	SampleCount int                     `json:"sample_count"`
	Samples     []Sample                `json:"samples,omitempty"`
	Tasks       []schema.TaskOutcome    `json:"tasks,omitempty"`
	Stats       schema.Stats            `json:"stats"`
	Evaluation  bool                    `json:"evaluation,omitempty"`
	Episodes    []schema.EpisodeOutcome `json:"episodes,omitempty"`
}

// Sample is a sample as its fields' values or digests: two samples with
// the same Sample are equal bit for bit, but for their timings
// (metadata's started_ms, ended_ms, latency_ms, which a replay cannot
// reproduce).
type Sample struct {
	RolloutID      string   `json:"rollout_id"`
	Key            string   `json:"key,omitempty"` // the act of an actor sample
	GroupIndex     int      `json:"group_index"`
	Index          int      `json:"index"`
	Status         string   `json:"status"`
	Reward         float64  `json:"reward"`
	ResponseLength int      `json:"response_length"`
	WeightVersions []string `json:"weight_versions,omitempty"`
	Label          string   `json:"label,omitempty"`
	// Tokens, LossMask and LogProbs are "<count> sha256:<hex>" of the ids,
	// the mask and the log-probs' IEEE 754 bits; LogProbs is "" when the
	// sample has none. Prompt and Response are digests of their text.
	Tokens   string         `json:"tokens"`
	LossMask string         `json:"loss_mask"`
	LogProbs string         `json:"rollout_log_probs,omitempty"`
	Prompt   string         `json:"prompt"`
	Response string         `json:"response"`
	Metadata map[string]any `json:"metadata,omitempty"`
}

// timings are the metadata keys a replay cannot reproduce.
var timings = []string{"started_ms", "ended_ms", "latency_ms"}

// sampleOf is s as a Sample.
func sampleOf(s schema.Sample) Sample {
	out := Sample{
		RolloutID: s.RolloutID, GroupIndex: s.GroupIndex, Index: s.Index, Status: s.Status, Reward: s.Reward,
		ResponseLength: s.ResponseLength, WeightVersions: s.WeightVersions, Label: s.Label,
		Tokens: digestInts(s.Tokens), LossMask: digestInts(s.LossMask), Prompt: digestText(s.Prompt), Response: digestText(s.Response),
	}
	if s.RolloutLogProbs != nil {
		out.LogProbs = digestFloats(s.RolloutLogProbs)
	}
	if k, ok := s.Metadata["key"].(string); ok {
		out.Key = k
	}
	if len(s.Metadata) > 0 {
		m := make(map[string]any, len(s.Metadata))
		for k, v := range s.Metadata {
			m[k] = v
		}
		for _, k := range timings {
			delete(m, k)
		}
		out.Metadata = jsonMap(m)
	}
	return out
}

// jsonMap is m as JSON reads it back (numbers float64, lists []any), so
// that metadata read from msgpack and from a file compare alike.
func jsonMap(m map[string]any) map[string]any {
	data, err := json.Marshal(m)
	if err != nil {
		return map[string]any{"unreadable": err.Error()}
	}
	var out map[string]any
	_ = json.Unmarshal(data, &out)
	return out
}

func digestInts(v []int) string {
	h := sha256.New()
	var b [8]byte
	for _, x := range v {
		binary.LittleEndian.PutUint64(b[:], uint64(int64(x)))
		h.Write(b[:])
	}
	return fmt.Sprintf("%d sha256:%x", len(v), h.Sum(nil)[:12])
}

func digestFloats(v []float64) string {
	h := sha256.New()
	var b [8]byte
	for _, x := range v {
		binary.LittleEndian.PutUint64(b[:], math.Float64bits(x))
		h.Write(b[:])
	}
	return fmt.Sprintf("%d sha256:%x", len(v), h.Sum(nil)[:12])
}

func digestText(s string) string {
	sum := sha256.Sum256([]byte(s))
	return fmt.Sprintf("%dB sha256:%x", len(s), sum[:12])
}

// Episode returns the recorded episode e, or nil.
func (r *Recording) Episode(e int) *Episode {
	for _, ep := range r.Episodes {
		if ep.Episode == e {
			return ep
		}
	}
	return nil
}

// Save writes the recording to w, one JSON object a line.
func (r *Recording) Save(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	r.Format = Format
	if err := enc.Encode(r); err != nil {
		return err
	}
	for _, ep := range r.Episodes {
		if err := enc.Encode(struct {
			Kind string `json:"kind"`
			*Episode
		}{"episode", ep}); err != nil {
			return err
		}
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		if res := r.Results[role]; res != nil {
			if err := enc.Encode(struct {
				Kind string `json:"kind"`
				*Result
			}{"result", res}); err != nil {
				return err
			}
		}
	}
	return nil
}

// SaveFile writes the recording to path.
func (r *Recording) SaveFile(path string) error {
	var b bytes.Buffer
	if err := r.Save(&b); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// Load reads a recording that Save wrote; an error names the line.
func Load(rd io.Reader) (*Recording, error) {
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	var r *Recording
	line := 0
	for sc.Scan() {
		line++
		data := bytes.TrimSpace(sc.Bytes())
		if len(data) == 0 {
			continue
		}
		if r == nil {
			r = &Recording{}
			if err := strictJSON(data, r); err != nil {
				return nil, fmt.Errorf("line %d (the header): %w", line, err)
			}
			if r.Format != Format {
				return nil, fmt.Errorf("line %d: format %q: this planact reads %q", line, r.Format, Format)
			}
			r.Results = map[string]*Result{}
			continue
		}
		var kind struct {
			Kind string `json:"kind"`
		}
		if err := json.Unmarshal(data, &kind); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		switch kind.Kind {
		case "episode":
			var ep struct {
				Kind string `json:"kind"`
				Episode
			}
			if err := strictJSON(data, &ep); err != nil {
				return nil, fmt.Errorf("line %d (an episode): %w", line, err)
			}
			r.Episodes = append(r.Episodes, &ep.Episode)
		case "result":
			var res struct {
				Kind string `json:"kind"`
				Result
			}
			if err := strictJSON(data, &res); err != nil {
				return nil, fmt.Errorf("line %d (a result): %w", line, err)
			}
			r.Results[res.Role] = &res.Result
		default:
			return nil, fmt.Errorf("line %d: kind %q: want episode or result", line, kind.Kind)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if r == nil {
		return nil, errors.New("empty: no header line")
	}
	return r, nil
}

// LoadFile reads the recording in path.
func LoadFile(path string) (*Recording, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := Load(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Record reads rollout n from the streams of the server nc is connected
// to: its arrivals and tasks, every episode's plan requests, outputs,
// DAGs, answers and errors, act outcomes and end, and both results with
// their samples (from the object stores when they are there). It reads
// with direct gets, no consumer. A rollout the streams do not hold, or
// that has not ended, is an error that says so.
func Record(ctx context.Context, nc *nats.Conn, n int64) (*Recording, error) {
	r := &Recording{Format: Format, Rollout: n, Arrivals: map[string]*schema.Arrive{}, Results: map[string]*Result{}}
	eps := map[int]*Episode{}
	episode := func(e int) *Episode {
		if eps[e] == nil {
			eps[e] = &Episode{Episode: e}
		}
		return eps[e]
	}
	turns := map[[2]int]*Turn{}
	turn := func(e, t int) *Turn {
		k := [2]int{e, t}
		if turns[k] == nil {
			turns[k] = &Turn{Turn: t}
		}
		return turns[k]
	}
	last := map[int]*schema.PlanOutput{}
	acts := map[int]map[string]schema.ActDone{}
	samples := map[string][]schema.Sample{}

	type arrival struct {
		id string
		a  *schema.Arrive
	}
	var arrivals []arrival
	rejected := map[string]bool{}
	var err error
	// Each trainer's arrivals are in its own stream (the streams are split
	// by writer), the rest of the rollout in ROLLOUT.
	for _, role := range bus.Roles {
		err = eachMsg(ctx, nc, bus.StreamTrainer(role), subject.Arrive(n, role), func(sm *bus.StoredMsg) error {
			var a schema.Arrive
			if err := schema.UnmarshalTrainer(sm.Data, sm.Header, &a); err != nil || schema.CheckRouting(sm.Subject, sm.Header, &a) != nil {
				return nil // refused when it came: not the rollout's
			}
			// Named as the session-store names it, so that its refusal,
			// if it was refused, is matched with it.
			id := schema.TrainerMsgID(sm.Header.Get(jetstream.MsgIDHeader), sm.Seq)
			arrivals = append(arrivals, arrival{id, &a})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	err = each(ctx, nc, bus.StreamRollout, "rollout."+strconv.FormatInt(n, 10)+".>", func(subj string, h nats.Header, data []byte) error {
		p, err := subject.Parse(subj)
		if err != nil {
			return nil // not a subject of planact's grammar
		}
		switch {
		case p.Verb == "result" && strings.HasSuffix(subj, ".rejected"):
			var res schema.Result
			if err := schema.Unmarshal(data, &res); err == nil {
				rejected[res.ArrivalID] = true
			}
		case p.Verb == "end":
			var end schema.EpisodeEnd
			if err := schema.Unmarshal(data, &end); err != nil {
				return fmt.Errorf("%s: %w", subj, err)
			}
			episode(end.Episode).End = &end
		case p.Verb == "result" && strings.Count(subj, ".") == 3:
			var res schema.Result
			if err := schema.Unmarshal(data, &res); err != nil {
				return fmt.Errorf("%s: %w", subj, err)
			}
			if res.SamplesObject != "" {
				if res.Samples, err = objectSamples(ctx, nc, res.Role, res.SamplesObject); err != nil {
					return err
				}
			}
			samples[res.Role] = res.Samples
			r.Results[res.Role] = resultOf(&res)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The rollout's arrivals are each role's first that was not refused
	// (a later one with the same body changes nothing; one with another is
	// refused).
	for _, a := range arrivals {
		if r.Arrivals[a.a.Role] == nil && !rejected[a.id] {
			r.Arrivals[a.a.Role] = a.a
		}
	}
	err = each(ctx, nc, bus.StreamPlan, "plan."+strconv.FormatInt(n, 10)+".>", func(subj string, _ nats.Header, data []byte) error {
		p, err := subject.Parse(subj)
		if err != nil {
			return nil
		}
		switch p.Verb {
		case "req":
			var m schema.PlanRequest
			if err := schema.Unmarshal(data, &m); err != nil {
				return fmt.Errorf("%s: %w", subj, err)
			}
			episode(m.Episode)
			turn(m.Episode, m.Turn).Observation = m.Observation
		case "out":
			var m schema.PlanOutput
			if err := schema.Unmarshal(data, &m); err != nil {
				return fmt.Errorf("%s: %w", subj, err)
			}
			t := turn(m.Episode, m.Turn)
			t.Text, t.FinishReason, t.Truncated, t.WeightVersion, t.Output = m.Text, m.FinishReason, m.Truncated, m.WeightVersion, true
			if l := last[m.Episode]; l == nil || l.Turn <= m.Turn {
				last[m.Episode] = &m
			}
		case "dag":
			var m schema.PlanDAG
			if err := schema.Unmarshal(data, &m); err != nil {
				return fmt.Errorf("%s: %w", subj, err)
			}
			if m.Partial {
				turn(m.Episode, m.Turn).Partials++
			} else {
				dag := m.Plan
				turn(m.Episode, m.Turn).DAG = &dag
			}
		case "answer":
			var m schema.PlanAnswer
			if err := schema.Unmarshal(data, &m); err != nil {
				return fmt.Errorf("%s: %w", subj, err)
			}
			turn(m.Episode, m.Turn).Answers = m.Answers
		case "error":
			var m schema.PlanError
			if err := schema.Unmarshal(data, &m); err != nil {
				return fmt.Errorf("%s: %w", subj, err)
			}
			turn(m.Episode, m.Turn).Error = &PlanError{Kind: m.ErrorKind, Message: m.Message}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = each(ctx, nc, bus.StreamAct, subject.ActDoneFilter(n), func(subj string, _ nats.Header, data []byte) error {
		var d schema.ActDone
		if err := schema.Unmarshal(data, &d); err != nil {
			return fmt.Errorf("%s: %w", subj, err)
		}
		if acts[d.Episode] == nil {
			acts[d.Episode] = map[string]schema.ActDone{}
		}
		// Timings, and which replicas ran and retried it, are the run's,
		// not the act's: no replay reproduces them.
		d.ReleasedMs, d.StartedMs, d.EndedMs, d.Replica, d.Retries = 0, 0, 0, "", nil
		if d.Generation != nil {
			d.Generation.LatencyMs = 0
		}
		acts[d.Episode][d.Key] = d
		episode(d.Episode)
		return nil
	})
	if err != nil {
		return nil, err
	}

	from := ""
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		a := r.Arrivals[role]
		if a == nil {
			return nil, fmt.Errorf("rollout %d: the streams hold no %s arrival (is it a rollout of this server, still in its history?)", n, role)
		}
		if from == "" && (len(a.Tasks) > 0 || a.TasksObject != "") {
			from = role
			if a.TasksObject != "" {
				tl := schema.TaskList{Object: a.TasksObject, From: role, Digest: schema.DigestSHA256 + a.TasksSHA256}
				r.Tasks, err = session.ReadTaskList(ctx, nc, tl)
				if errors.Is(err, jetstream.ErrObjectNotFound) {
					return nil, fmt.Errorf("rollout %d: %w: its tasks came as an object (the %s's list was over the client's inline limit, %d KiB by default), which planact removes when the rollout ends, so a rollout that ended cannot be recorded without them; record one whose tasks came inline",
						n, err, role, client.DefaultInlineTasksLimit>>10)
				}
				if err != nil {
					return nil, fmt.Errorf("rollout %d: the %s's task list %s: %w", n, role, a.TasksObject, err)
				}
			} else {
				r.Tasks = a.Tasks
			}
		}
		cp := *a
		cp.Tasks, cp.TasksObject, cp.TasksSHA256 = nil, "", ""
		r.Arrivals[role] = &cp
	}
	r.TasksFrom = from
	for role := range samples {
		if r.Results[role] == nil {
			continue
		}
		for _, s := range samples[role] {
			r.Results[role].Samples = append(r.Results[role].Samples, sampleOf(s))
		}
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		if r.Results[role] == nil {
			return nil, fmt.Errorf("rollout %d: no %s result in the streams: has the rollout ended?", n, role)
		}
	}
	for k, t := range turns {
		ep := episode(k[0])
		ep.Turns = append(ep.Turns, *t)
	}
	for e, ep := range eps {
		sort.Slice(ep.Turns, func(i, j int) bool { return ep.Turns[i].Turn < ep.Turns[j].Turn })
		if l := last[e]; l != nil {
			ep.Trajectory = l.Segments
		}
		keys := make([]string, 0, len(acts[e]))
		for k := range acts[e] {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return actBefore(acts[e][keys[i]], acts[e][keys[j]]) })
		for _, k := range keys {
			ep.Acts = append(ep.Acts, acts[e][k])
		}
		if e >= 0 && e < len(r.Tasks) {
			r.Episodes = append(r.Episodes, ep)
		}
	}
	sort.Slice(r.Episodes, func(i, j int) bool { return r.Episodes[i].Episode < r.Episodes[j].Episode })
	return r, nil
}

func actBefore(a, b schema.ActDone) bool {
	if a.Turn != b.Turn {
		return a.Turn < b.Turn
	}
	return a.Key < b.Key
}

// resultOf is res without its samples (added as digests by the caller)
// and without its timings.
func resultOf(res *schema.Result) *Result {
	st := res.Stats
	st.StartedMs, st.FinishedMs, st.WallMs = 0, 0, 0
	return &Result{Role: res.Role, Status: res.Status, Reason: res.Reason, SampleCount: res.SampleCount, Tasks: res.Tasks, Stats: st,
		Evaluation: res.Evaluation, Episodes: res.Episodes}
}

// each calls fn with every message of stream on subjects matching filter,
// in stream order, read with direct gets (no consumer).
func each(ctx context.Context, nc *nats.Conn, stream, filter string, fn func(subject string, h nats.Header, data []byte) error) error {
	return eachMsg(ctx, nc, stream, filter, func(sm *bus.StoredMsg) error { return fn(sm.Subject, sm.Header, sm.Data) })
}

// eachMsg is each, handing fn the whole stored message (its sequence too).
func eachMsg(ctx context.Context, nc *nats.Conn, stream, filter string, fn func(sm *bus.StoredMsg) error) error {
	for seq := uint64(1); ; {
		req, _ := json.Marshal(map[string]any{"seq": seq, "next_by_subj": filter})
		m, err := nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+stream, req)
		if err != nil {
			return fmt.Errorf("read %s %s from %d: %w", stream, filter, seq, err)
		}
		// The server's answer, not what the message's own headers say: an
		// arrival holds what its trainer wrote.
		sm, err := bus.DirectMsg(stream, m)
		if err != nil {
			return fmt.Errorf("read %s %s from %d: %w", stream, filter, seq, err)
		}
		if sm == nil {
			return nil
		}
		if err := fn(sm); err != nil {
			return err
		}
		seq = sm.Seq + 1
	}
}

func objectSamples(ctx context.Context, nc *nats.Conn, role, name string) ([]schema.Sample, error) {
	data, err := bus.ReadObject(ctx, nc, bus.ObjectResults(role), name, 0)
	if err != nil {
		return nil, fmt.Errorf("samples %s: %w (gone with the result retention?)", name, err)
	}
	var samples []schema.Sample
	if err := schema.Unmarshal(data, &samples); err != nil {
		return nil, fmt.Errorf("samples %s: %w", name, err)
	}
	return samples, nil
}
