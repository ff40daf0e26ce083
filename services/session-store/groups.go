package sessionstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
)

// A group (the copies of one task, sharing a group_index) is delivered to
// the trainers as soon as all its tasks have ended and it passed the
// rollout's group filter, on rollout.N.result.<role>.group.<g>: an
// asynchronous trainer can train on it before the rollout ends. With
// target_groups, the rollout ends as soon as that many were delivered
// (a group with nothing to train on is never one of them: filter): the
// episodes still running are stopped (their engine requests aborted, their
// acts not retried), and the result says which tasks were.

// groupOf returns the group of episode e and the episodes in it.
func groupOf(tasks []schema.Task, e int) (g int, members []int) {
	g = tasks[e].GroupIndex
	return g, groupMembers(tasks, g)
}

// groupCount is the number of distinct groups of a batch.
func groupCount(tasks []schema.Task) int {
	seen := map[int]bool{}
	for _, t := range tasks {
		seen[t.GroupIndex] = true
	}
	return len(seen)
}

// decideGroup records how the complete group g ends (its filter's verdict,
// or surplus when target_groups were already delivered) before anything is
// published: a redo publishes what was decided, never asks the filter
// again. A delivery that reaches target_groups ends the rollout in the same
// write. It returns the session as written, and the group's episodes when
// it read them (for deliverGroup; nil when the group was decided before).
func (s *Service) decideGroup(ctx context.Context, sess schema.Session, rev uint64, g int) (schema.GroupState, schema.Session, uint64, map[int]*episode, error) {
	if gs, ok := sess.Group(g); ok {
		return gs, sess, rev, nil, nil
	}
	tl, err := s.tasksOf(ctx, &sess)
	if err != nil {
		return schema.GroupState{}, sess, rev, nil, err
	}
	tasks := tl.Tasks
	members := groupMembers(tasks, g)
	eps, err := s.gather(ctx, &sess, tasks, members, nil)
	if err != nil {
		return schema.GroupState{}, sess, rev, nil, err
	}
	verdict := s.filter(ctx, &sess, g, members, eps)
	if remoteReward(sess.Config) {
		for _, e := range members {
			if ep := eps[e]; ep.end != nil {
				verdict.Scores = append(verdict.Scores, schema.EpisodeScore{Episode: e, Reward: ep.reward, Correct: ep.correct, Error: ep.rewardErr})
			}
		}
	}
	var gs schema.GroupState
	var theirs bool // decided by another reader meanwhile, on its own reads
	written, writtenRev, _, err := bus.MutateFrom(ctx, s.Bus.Sessions, schema.SessionKey(sess.Rollout), sess, rev, func(v *schema.Session, exists bool) (bool, error) {
		if !exists {
			return false, fail.Permanentf("group %d of rollout %d, which has no session", g, sess.Rollout)
		}
		if known, ok := v.Group(g); ok {
			gs, theirs = known, true
			return false, nil
		}
		gs, theirs = verdict, false
		k := v.Config.TargetGroups
		if gs.State == schema.GroupDelivered && k > 0 && len(v.Delivered()) >= k {
			gs = schema.GroupState{Index: g, State: schema.GroupSurplus, Scores: verdict.Scores,
				Reason: fmt.Sprintf("not delivered: the %d groups asked for (target_groups) were delivered before it completed", k)}
		}
		v.Groups = append(v.Groups, gs)
		if gs.State == schema.GroupDelivered && k > 0 && len(v.Delivered()) == k && v.State == schema.SessionRunning {
			// Over-sampling: enough groups. The episodes still running are
			// stopped (the services follow the session), nothing waits for them.
			s.end(v, schema.SessionDone, schema.ResultOK, fmt.Sprintf("%d groups delivered (target_groups %d); %d of %d episodes had ended, the others were stopped",
				k, k, v.EndedCount(), v.Episodes))
		}
		return true, nil
	})
	if err != nil {
		return schema.GroupState{}, sess, rev, nil, err
	}
	if theirs {
		eps = nil // its rewards may not be the ones recorded
	}
	return gs, written, writtenRev, eps, nil
}

// deliverGroup publishes delivered group g to every role that arrived,
// each once (a role's group subject that holds a message was published),
// and returns the objects its samples went to: those of the messages found
// published too, so that a group whose publish was not followed by the
// session's write (a later effect failed, the write failed, the process
// stopped) still has its object recorded, and removed after the retention.
// eps are the group's episodes as decideGroup read them, or nil (read here).
func (s *Service) deliverGroup(ctx context.Context, sess *schema.Session, g int, eps map[int]*episode) ([]string, error) {
	n := sess.Rollout
	var missing, objects []string
	for _, role := range arrivedRoles(sess) {
		m, err := s.Bus.LastMsg(ctx, bus.StreamRollout, subject.Group(n, role, g))
		if err != nil {
			return nil, err
		}
		if m == nil {
			missing = append(missing, role)
			continue
		}
		var grp groupBody
		if err := schema.UnmarshalPart(m.Data, &schema.Group{}, &grp); err != nil {
			return nil, fmt.Errorf("group %d of rollout %d, %s: %w", g, n, role, err)
		}
		if grp.SamplesObject != "" {
			objects = append(objects, bus.ObjectResults(role)+"/"+grp.SamplesObject)
		}
	}
	if len(missing) == 0 {
		return objects, nil
	}
	tl, err := s.tasksOf(ctx, sess)
	if err != nil {
		return nil, err
	}
	tasks := tl.Tasks
	members := groupMembers(tasks, g)
	if eps == nil {
		if eps, err = s.gather(ctx, sess, tasks, members, nil); err != nil {
			return nil, err
		}
	}
	// The groups delivered so far, in the order decided, up to this one.
	var delivered []int
	for _, gs := range sess.Groups {
		if gs.State == schema.GroupDelivered {
			delivered = append(delivered, gs.Index)
		}
		if gs.Index == g {
			break
		}
	}
	for _, role := range missing {
		msg := &schema.Group{Rollout: n, Role: role, GroupIndex: g, Delivered: delivered, Groups: groupCount(tasks), AtMs: s.nowMs()}
		msg.Samples, msg.Tasks = groupShare(sess, eps, members, role)
		var counts groupCounts
		if sess.Config.LeavesOutGroups() {
			// What the results will count of the group, kept before
			// publishSamples moves large samples to the object store.
			held := make([]heldSample, len(msg.Samples))
			for i, smp := range msg.Samples {
				held[i] = built(smp)
			}
			counts = countHeld(held)
		}
		obj, err := s.publishSamples(ctx, msg, fmt.Sprintf("rollout-%d-%s.group-%d.samples", n, role, g))
		if err != nil {
			return nil, err
		}
		if sess.Config.LeavesOutGroups() {
			s.counted.put(identify(sess), role, g, counts)
		}
		if obj != "" {
			objects = append(objects, obj)
		}
	}
	return objects, nil
}

// groupShare is role's share of a delivered group (its tasks are members):
// the role's samples of its episodes, and how each of its tasks ended for
// the role (trained only with its samples here).
func groupShare(sess *schema.Session, eps map[int]*episode, members []int, role string) ([]schema.Sample, []schema.TaskOutcome) {
	var samples []schema.Sample
	for _, e := range members {
		if role == schema.RolePlanner && eps[e].planner != nil {
			samples = append(samples, *eps[e].planner)
		}
		if role == schema.RoleActor {
			samples = append(samples, eps[e].actor...)
		}
	}
	has := map[string]bool{}
	for _, smp := range samples {
		has[smp.RolloutID] = true
	}
	var outcomes []schema.TaskOutcome
	for _, e := range members {
		outcomes = append(outcomes, roleOutcome(taskOutcome(sess, e, eps[e], true), role, has[episodeID(sess.Rollout, e)], eps[e], sess.Config))
	}
	return samples, outcomes
}

func groupMembers(tasks []schema.Task, g int) []int {
	var members []int
	for e, t := range tasks {
		if t.GroupIndex == g {
			members = append(members, e)
		}
	}
	return members
}

// publishSamples publishes a group message, moving its samples to the
// role's object store (under name) when the message would be too large to
// carry them; it returns the object ("bucket/name") or "".
func (s *Service) publishSamples(ctx context.Context, m *schema.Group, name string) (string, error) {
	m.SampleCount = len(m.Samples)
	body, err := schema.Marshal(m)
	if err != nil {
		return "", fail.E(fail.Permanent, err)
	}
	obj := ""
	if len(body) > s.InlineLimit {
		data, err := schema.Marshal(m.Samples)
		if err != nil {
			return "", fail.E(fail.Permanent, err)
		}
		store := s.Bus.Results[m.Role]
		if store == nil {
			return "", fail.Permanentf("no result store for role %q", m.Role)
		}
		if _, err := store.PutBytes(ctx, name, data); err != nil {
			return "", fail.Transientf("store %s: %w", name, err)
		}
		m.Samples, m.SamplesObject, obj = nil, name, bus.ObjectResults(m.Role)+"/"+name
		_, err = s.Bus.PublishOnce(ctx, m)
		return obj, err
	}
	// Encoded once: weighed, then sent.
	_, err = s.Bus.PublishOnce(ctx, bus.Encoded{Message: m, Body: body})
	return obj, err
}

// groupSamples reads back the samples of a delivered group, as they were
// delivered. It is called for a group the session records delivered, whose
// message went out to both roles (a rollout starts only once both
// arrived): one that is not in the stream is an error, never a group that
// left the role no sample.
func (s *Service) groupSamples(ctx context.Context, n int64, role string, g int) ([]heldSample, error) {
	m, err := s.Bus.LastMsg(ctx, bus.StreamRollout, subject.Group(n, role, g))
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fail.Permanentf("rollout %d: the session records group %d as delivered, but its %s message is not in the %s stream (%s): its samples cannot be read, and are not taken as none",
			n, g, role, bus.StreamRollout, subject.Group(n, role, g))
	}
	var grp groupBody
	if err := schema.UnmarshalPart(m.Data, &schema.Group{}, &grp); err != nil {
		return nil, err
	}
	data := []byte(grp.Samples)
	if grp.SamplesObject != "" {
		if data, err = bus.ReadObject(ctx, s.Bus.NC, bus.ObjectResults(role), grp.SamplesObject, 0); err != nil {
			return nil, fail.Transientf("group %d samples %s: %w", g, grp.SamplesObject, err)
		}
	}
	held, err := splitSamples(data)
	if err != nil {
		return nil, fail.Permanentf("group %d of rollout %d, %s: %w", g, n, role, err)
	}
	return held, nil
}

// groupBody is what assembly (and deliverGroup, of a message found
// published) reads of a delivered group's message: its samples, as they
// were encoded, or the object that holds them.
type groupBody struct {
	schema.Envelope
	Samples       msgpack.RawMessage `json:"samples,omitempty"`
	SamplesObject string             `json:"samples_object,omitempty"`
}

// filter applies the rollout's group filter to a complete group. A rollout
// that selects groups (target_groups, or a filter) never delivers one with
// nothing to train on: no task of it left a sample that would be trained
// (every episode failed, aborted or quarantined, or left no sample), so
// that target_groups counts only groups a trainer can learn from, and a
// filter is not asked about one.
func (s *Service) filter(ctx context.Context, sess *schema.Session, g int, members []int, eps map[int]*episode) schema.GroupState {
	gs := schema.GroupState{Index: g, State: schema.GroupDelivered}
	var rewards []float64
	for _, e := range members {
		if ep := eps[e]; trained(ep) {
			rewards = append(rewards, ep.reward)
		}
	}
	if len(rewards) == 0 && sess.Config.Filtering() {
		gs.State, gs.Reason = schema.GroupFiltered, "nothing to train on: no task of the group left a sample trained on ("+untrained(members, eps)+")"
		return gs
	}
	switch f, k := sess.Config.GroupFilter, sess.Config.TargetGroups; {
	case f == "" || f == schema.FilterNone:
	case k > 0 && len(sess.Delivered()) >= k:
		// The groups asked for were delivered: this one is surplus
		// whatever a filter says (decideGroup), so none is asked.
	case f == schema.FilterSpread:
		if len(rewards) < 2 {
			gs.State, gs.Reason = schema.GroupFiltered, fmt.Sprintf("spread: %d reward(s), no spread to learn from", len(rewards))
		} else if slices.Min(rewards) == slices.Max(rewards) {
			gs.State, gs.Reason = schema.GroupFiltered, fmt.Sprintf("spread: all %d rewards are %g", len(rewards), rewards[0])
		}
	default:
		keep, why, err := s.remoteFilter(ctx, f, sess, g, members, eps, rewards)
		switch {
		case err != nil:
			// A filter that cannot be asked keeps the group (its samples are
			// not silently lost) and says so.
			gs.Reason = "kept: the group filter could not be asked: " + err.Error()
		case !keep:
			gs.State, gs.Reason = schema.GroupFiltered, "filter: "+why
		default:
			gs.Reason = why
		}
	}
	return gs
}

// trained says whether ep's samples would be trained on, so that its
// reward is one a group filter weighs: it ended completed or truncated (a
// task in state trained), with a sample of either role. A failed or
// aborted episode's reward is not computed (its 0 says nothing of the
// answer), a quarantined one's neither (none of its samples is
// delivered), and none of them is trained; an episode without samples
// gives the trainer nothing to compare.
func trained(ep *episode) bool {
	if ep.end == nil || ep.end.Status != schema.EpisodeCompleted && ep.end.Status != schema.EpisodeTruncated {
		return false
	}
	return ep.planner != nil || len(ep.actor) > 0
}

// untrained says how a group's episodes ended, none of them trained: their
// end statuses, counted ("2 failed, 1 quarantined"), and those that ended
// without a sample.
func untrained(members []int, eps map[int]*episode) string {
	counts := map[string]int{}
	for _, e := range members {
		switch ep := eps[e]; {
		case ep.end == nil:
			counts["not ended"]++
		case ep.end.Status == schema.EpisodeCompleted || ep.end.Status == schema.EpisodeTruncated:
			counts[ep.end.Status+" without a sample"]++
		default:
			counts[ep.end.Status]++
		}
	}
	return statesText(counts)
}

// remoteFilter asks a filter server whether to keep a group:
// POST {rollout, group_index, prompt, label, rewards, responses} → {"keep": bool, "reason": "…"}.
// rewards and responses are those of the episodes the spread filter weighs
// (trained), in the same order. It is bounded: a slow filter does not hold
// the rollout back.
func (s *Service) remoteFilter(ctx context.Context, url string, sess *schema.Session, g int, members []int, eps map[int]*episode, rewards []float64) (bool, string, error) {
	first := eps[members[0]].task
	var responses []string
	for _, e := range members {
		if ep := eps[e]; trained(ep) {
			responses = append(responses, strings.Join(ep.end.Answers, " | "))
		}
	}
	body, err := json.Marshal(map[string]any{"rollout": sess.Rollout, "group_index": g, "prompt": first.Prompt, "label": first.Label,
		"rewards": rewards, "responses": responses})
	if err != nil {
		// A reward JSON cannot carry (NaN, ±Inf): the filter is not asked
		// with an empty body.
		return false, "", fmt.Errorf("encode the request for group %d: %w", g, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, "", err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	// What the server wrote is quoted in part, and its reason cut: either
	// is the group's reason, recorded in the session (one value, under
	// the server's max_payload, for every group of the rollout) and, of a
	// group dropped, in each of its tasks in both results; an error page
	// or a judge's reasoning may be large.
	if resp.StatusCode != http.StatusOK {
		return false, "", fmt.Errorf("HTTP %d: %.200q", resp.StatusCode, bytes.TrimSpace(data))
	}
	var v struct {
		Keep   *bool  `json:"keep"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(data, &v); err != nil || v.Keep == nil {
		return false, "", fmt.Errorf("want {\"keep\": bool, \"reason\": string}, got %.200q", bytes.TrimSpace(data))
	}
	return *v.Keep, clipTo(v.Reason, maxFilterReason), nil
}

// maxFilterReason bounds the reason a filter server gives for a group.
const maxFilterReason = 512

func arrivedRoles(sess *schema.Session) []string {
	var roles []string
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		if _, ok := sess.Roles[role]; ok {
			roles = append(roles, role)
		}
	}
	return roles
}

// taskCache keeps the task lists of recent rollouts (they never change): a
// group's completion is checked at every episode end, and reading a large
// list from the object store each time would cost the rollout's size per
// episode. A list is read once however many handlers ask for it at the
// same time (after a restart, the handlers of a running rollout's episode
// ends, of its groups and of its results, each under its own lock): each
// read its own copy, the list's size and its decoding per handler.
type taskCache struct {
	mu      sync.Mutex
	lists   map[int64]schema.TaskList
	loading map[int64]*taskLoad // lists being read, by rollout
}

// taskLoad is one read of a rollout's task list, which the handlers that
// ask for it meanwhile wait for.
type taskLoad struct {
	done chan struct{}
	tl   schema.TaskList
	err  error
}

// maxCachedRollouts bounds the cache; past it, an arbitrary entry goes.
const maxCachedRollouts = 256

// loadTaskList reads a rollout's task list from the sessions bucket and the
// object store; a variable so that a test can count the reads.
var loadTaskList = session.LoadTaskList

// tasksOf returns the task list of v's rollout, the one v names. Rollout
// numbers start again when a training run does (once the earlier run's
// sessions are gone), so a list this process cached under the number may
// be an earlier rollout's: one whose digest is not the one v recorded for
// its role is read again from the bucket. A rollout that started and
// whose list is gone (settled and cleaned up meanwhile, by another
// replica) is an error that passes: what reads it again sees the session
// settled.
func (s *Service) tasksOf(ctx context.Context, v *schema.Session) (schema.TaskList, error) {
	tl, err := s.taskList(ctx, v.Rollout)
	if err == nil && refusedList(v, tl) {
		s.taskCache.drop(v.Rollout)
		tl, err = s.taskList(ctx, v.Rollout)
	}
	if err == nil && v.State != schema.SessionWaiting && v.Episodes > 0 && len(tl.Tasks) == 0 {
		return tl, fail.Transientf("rollout %d: its task list is gone (the rollout settled meanwhile?)", v.Rollout)
	}
	return tl, err
}

// taskList returns rollout n's task list, with who brought it and its
// digest; empty when it is gone.
func (s *Service) taskList(ctx context.Context, n int64) (schema.TaskList, error) {
	c := s.taskCache
	c.mu.Lock()
	if tl, ok := c.lists[n]; ok {
		c.mu.Unlock()
		return tl, nil
	}
	if l, ok := c.loading[n]; ok {
		c.mu.Unlock()
		select {
		case <-l.done:
			return l.tl, l.err
		case <-ctx.Done():
			return schema.TaskList{}, fail.Transientf("rollout %d: tasks: %w", n, ctx.Err())
		}
	}
	l := &taskLoad{done: make(chan struct{})}
	if c.loading == nil {
		c.loading = map[int64]*taskLoad{}
	}
	c.loading[n] = l
	c.mu.Unlock()

	tl, found, err := loadTaskList(ctx, s.Bus.Sessions, s.Bus.NC, n)
	if err == nil && found {
		s.keepTasks(n, tl)
	} else if err == nil {
		tl = schema.TaskList{}
	}
	c.mu.Lock()
	delete(c.loading, n)
	c.mu.Unlock()
	l.tl, l.err = tl, err
	close(l.done)
	return tl, err
}

// keepTasks caches rollout n's task list (as stored: the first list wins).
func (s *Service) keepTasks(n int64, tl schema.TaskList) {
	c := s.taskCache
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.lists) >= maxCachedRollouts {
		for k := range c.lists {
			delete(c.lists, k)
			break
		}
	}
	c.lists[n] = tl
}

// forgetTasks drops rollout n's tasks, and what its delivered groups
// count, from the caches.
func (s *Service) forgetTasks(n int64) {
	s.counted.forget(n)
	s.taskCache.drop(n)
	s.silent.forget(n)
}

func (c *taskCache) drop(n int64) {
	c.mu.Lock()
	delete(c.lists, n)
	c.mu.Unlock()
}
