package sessionstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// published is what the results of a rollout turned out to be.
type published struct {
	status, reason string                // the first role's (what the session's Status says)
	roles          map[string]roleResult // each role's
	objects        []string              // result objects, "bucket/name"
	first          bool                  // some result was published now, not found published before
	atMs           int64                 // when they were all out (published now, or found)
}

// roleResult is the status of one role's result, and why.
type roleResult struct{ status, reason string }

// publishResults publishes the result of every role that arrived, unless
// it is already on its subject (this is the redo of an interrupted
// publish): results are read back, never assembled twice. A result found
// there counts only if it answers the arrival the session holds: one that
// answers another (the result of an earlier rollout of the number, from a
// training run that counted from 0 again) is not this rollout's. When the samples
// cannot be assembled or delivered for longer than ResultPatience, or a
// group could not be delivered (undelivered says which, and why), the
// trainers get a failed result that says why instead of none.
func (s *Service) publishResults(ctx context.Context, sess *schema.Session, undelivered []lostGroup) (*published, error) {
	n := sess.Rollout
	res := &published{status: sess.Status, reason: sess.Reason, roles: map[string]roleResult{}}
	giveUp := s.givingUp(sess)
	var built map[string]result
	var roles []string
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		if _, arrived := sess.Roles[role]; arrived {
			roles = append(roles, role)
		}
	}
	for i, role := range roles {
		m, err := s.Bus.LastMsg(ctx, bus.StreamRollout, subject.Result(n, role))
		if err != nil {
			return nil, err
		}
		var r *schema.Result
		if m != nil {
			r = &schema.Result{}
			if err := schema.Unmarshal(m.Data, r); err != nil {
				return nil, err
			}
			if r.ArrivalID != sess.Roles[role].ArrivalID {
				zerolog.Ctx(ctx).Warn().Str("role", role).Str("found", r.ArrivalID).Str("arrival", sess.Roles[role].ArrivalID).
					Msg("the result subject holds the answer to another arrival (an earlier rollout of the number): publishing this rollout's")
				r = nil
			}
		}
		if r == nil {
			if built == nil && len(undelivered) > 0 {
				whys, unsent := make([]string, len(undelivered)), make([]int, len(undelivered))
				for i, l := range undelivered {
					whys[i], unsent[i] = fmt.Sprintf("group %d: %v", l.index, l.err), l.index
				}
				why := "samples could not be delivered: " + strings.Join(whys, "; ")
				if built, err = s.tasksOnly(ctx, sess, why, "its samples could not be delivered", giveUp, unsent); err != nil {
					return nil, err
				}
			}
			if built == nil {
				if built, err = s.results(ctx, sess, giveUp); err != nil {
					return nil, err
				}
			}
			b := built[role]
			r = b.Result
			r.ArrivalID = sess.Roles[role].ArrivalID
			if !b.tasksOnly {
				// The groups streamed are named in every result, whatever
				// became of the rest (a failed one too): a reader of the
				// groups reads each. (A result of tasks only names those
				// whose messages it found out.)
				r.StreamedGroups = sess.Delivered()
			}
			r.Stats.StartedMs, r.Stats.FinishedMs = sess.StartedMs, sess.FinishedMs
			if b.tasksOnly {
				// It holds no sample: it goes out as it is, never to the
				// object store.
				var body []byte
				if r, body, err = s.fit(r); err != nil {
					return nil, err
				}
				if err := s.publishAnswer(ctx, r, body); err != nil {
					return nil, err
				}
			} else if err := s.publishResult(ctx, b); err != nil {
				if fail.IsRetryable(err) && !giveUp {
					return nil, err
				}
				// The samples cannot be delivered (the object store refuses
				// them, say; or never can: no store for the role): the
				// trainer still learns that, and why, at once when no try
				// can mend it.
				zerolog.Ctx(ctx).Error().Err(err).Str("role", role).Msg("result could not be published; sending a failed one")
				var body []byte
				if r, body, err = s.undeliverable(b, err); err != nil {
					return nil, err
				}
				if err := s.publishAnswer(ctx, r, body); err != nil {
					return nil, err
				}
			}
			res.first = true
		}
		if i == 0 {
			res.status, res.reason = r.Status, r.Reason
		}
		res.roles[role] = roleResult{r.Status, r.Reason}
		if r.SamplesObject != "" {
			res.objects = append(res.objects, bus.ObjectResults(role)+"/"+r.SamplesObject)
		}
	}
	slices.Sort(res.objects)
	res.atMs = s.nowMs()
	return res, nil
}

// undeliverable is the result of b, whose samples could not be delivered
// (why), as it goes out instead: failed, holding no sample, and saying
// how every task ended for its role, as b does, but for the tasks whose
// samples b was to hold: those failed. Its stats count what it holds
// (heldStats): its tasks, and the samples of the groups it leaves out, if
// any. When even the list of tasks is too large for a message, it lists
// none, and its reason says so (fit). It names the groups streamed, as
// every result does: a reader of the groups reads each. body is r encoded.
func (s *Service) undeliverable(b result, why error) (r *schema.Result, body []byte, err error) {
	reason := "samples could not be delivered: " + why.Error()
	lost, tokens := map[string]bool{}, 0
	for _, smp := range b.samples {
		lost[smp.sample.RolloutID] = true
		tokens += smp.tokens
	}
	full := *b.Result
	full.Status, full.Reason = schema.ResultFailed, reason
	full.Samples, full.SamplesObject, full.SampleCount = nil, "", 0
	full.Tasks = make([]schema.TaskOutcome, len(b.Tasks))
	for i, out := range b.Tasks {
		if out.State == schema.TaskTrained && lost[episodeID(b.Rollout, out.Episode)] {
			out.State, out.Reason = schema.TaskFailed, "its samples could not be delivered"
			if slices.Contains(b.StreamedGroups, out.GroupIndex) {
				out.Reason = "its samples could not be delivered in the result (its group's message has them)"
			}
		}
		full.Tasks[i] = out
	}
	// The roles' results share what assembly counted: the tokens are
	// counted afresh, those of the groups it leaves out.
	full.Stats = heldStats(&full, b.Stats, b.Stats.Tokens[b.Role]-tokens)
	return s.fit(&full)
}

// fit encodes r, a failed result that holds no sample, as it goes out:
// whole when it fits in a message; otherwise (its list of tasks is too
// large) listing no task, its reason saying so, its stats counting what
// it still holds. body is the result encoded.
func (s *Service) fit(r *schema.Result) (*schema.Result, []byte, error) {
	body, err := schema.Marshal(r)
	if err != nil {
		return nil, nil, fail.E(fail.Permanent, err)
	}
	limit := s.maxBody()
	if len(body) <= limit {
		return r, body, nil
	}
	bare := &schema.Result{Rollout: r.Rollout, Role: r.Role, Status: schema.ResultFailed,
		Reason: fmt.Sprintf("%s; the list of its %d tasks does not fit in a message either (%d bytes, over the %d a result can have), so this result lists none",
			r.Reason, len(r.Tasks), len(body), limit),
		ArrivalID: r.ArrivalID, StreamedGroups: r.StreamedGroups, DeliveredGroups: r.DeliveredGroups, GroupSamples: r.GroupSamples,
		Evaluation: r.Evaluation}
	bare.Stats = heldStats(bare, r.Stats, r.Stats.Tokens[r.Role])
	if body, err = schema.Marshal(bare); err != nil {
		return nil, nil, fail.E(fail.Permanent, err)
	}
	return bare, body, nil
}

// maxBody is the largest body a result message can have: the server's
// max_payload, less room for the headers.
func (s *Service) maxBody() int {
	if s.maxResultBody > 0 {
		return s.maxResultBody
	}
	return int(s.Bus.NC.MaxPayload()) - headerRoom
}

// headerRoom is what maxBody leaves for a message's headers (its id, which
// names the arrival, the schema, the trace): far more than they take.
const headerRoom = 8 << 10

// publishAnswer publishes the result r (as body, when it is encoded
// already) under a message id that names the arrival it answers
// (resultMsgID).
func (s *Service) publishAnswer(ctx context.Context, r *schema.Result, body []byte) error {
	var m schema.Message = r
	if body != nil {
		m = bus.Encoded{Message: r, Body: body}
	}
	return s.Bus.Publish(ctx, m, jetstream.WithMsgID(resultMsgID(r)))
}

// resultMsgID is the Nats-Msg-Id of the result r: its own, with the
// arrival it answers. A result published again for the same arrival is a
// duplicate; a rollout of the same number run again (a new training run
// counting from 0, or the answer to an arrival that came late) answers
// another arrival, and its result is never dropped as a duplicate of the
// earlier one within the duplicate window.
func resultMsgID(r *schema.Result) string {
	if r.Rejected || r.ArrivalID == "" {
		return r.MsgID()
	}
	return r.MsgID() + ".for." + r.ArrivalID
}

// results builds both roles' results: the samples of a rollout that ran,
// or a bare result with the session's status for one that never started.
func (s *Service) results(ctx context.Context, sess *schema.Session, giveUp bool) (map[string]result, error) {
	n := sess.Rollout
	bare := func(status, reason string) map[string]result { return bareResults(n, status, reason) }
	if sess.Status == schema.ResultInvalid || sess.Episodes == 0 {
		return bare(sess.Status, sess.Reason), nil
	}
	planner, actor, err := s.assemble(ctx, sess)
	if err != nil && fail.IsRetryable(err) && !giveUp {
		return nil, err
	}
	if err != nil {
		zerolog.Ctx(ctx).Error().Err(err).Msg("samples could not be assembled; the rollout fails")
		return s.tasksOnly(ctx, sess, "samples could not be assembled: "+err.Error(), "its samples could not be assembled", giveUp, nil)
	}
	return map[string]result{schema.RolePlanner: planner, schema.RoleActor: actor}, nil
}

// tasksOnly are both roles' results of the finished rollout sess when its
// samples could not be delivered or assembled (why): failed, holding no
// sample, and listing how every task ended for each role, from what is at
// hand without the samples: the session, the task list, the episodes'
// ends, and the group messages that went out (each says how its tasks
// ended for its role). A task that would have been trained (or
// evaluated) is failed: its samples are not in the result (lost says why;
// those of a group whose message went out are there). Their stats count
// what they hold (heldStats): tasks, no episode figures. When the tasks
// cannot be read either, the results list none and their reason says why,
// and they name the groups recorded delivered but those of unsent, whose
// messages did not go out; a read that may pass is tried again, unless
// giveUp.
func (s *Service) tasksOnly(ctx context.Context, sess *schema.Session, why, lost string, giveUp bool, unsent []int) (map[string]result, error) {
	n := sess.Rollout
	tl, err := s.tasksOf(ctx, sess)
	var eps map[int]*episode
	if err == nil {
		eps, err = s.episodeEnds(ctx, sess, tl.Tasks)
	}
	var sent map[string]map[int]schema.TaskOutcome
	var streamed map[string][]int
	if err == nil {
		sent, streamed, err = s.groupsSent(ctx, sess)
	}
	if err != nil {
		if fail.IsRetryable(err) && !giveUp {
			return nil, err
		}
		out := bareResults(n, schema.ResultFailed, fmt.Sprintf("%s; this result lists no task: the rollout's tasks could not be read either: %v", why, err))
		// A reader of the groups waits for each group named: never for one
		// whose message did not go out.
		streamed := slices.DeleteFunc(sess.Delivered(), func(g int) bool { return slices.Contains(unsent, g) })
		for role, b := range out {
			b.StreamedGroups, b.tasksOnly = streamed, true
			out[role] = b
		}
		return out, nil
	}
	times := schema.Stats{StartedMs: sess.StartedMs, FinishedMs: sess.FinishedMs}
	if sess.FinishedMs > 0 && sess.StartedMs > 0 {
		times.WallMs = sess.FinishedMs - sess.StartedMs
	}
	filtering := sess.Config.Filtering()
	out := map[string]result{}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		r := &schema.Result{Rollout: n, Role: role, Status: schema.ResultFailed, Reason: why,
			Evaluation: sess.Config.Evaluation, StreamedGroups: streamed[role]}
		for e := range tl.Tasks {
			o, inGroup := sent[role][e]
			if !inGroup {
				o = taskOutcome(sess, e, eps[e], filtering)
			}
			if o.State == schema.TaskTrained || o.State == schema.TaskEvaluated {
				o.State, o.Reason = schema.TaskFailed, lost
				if inGroup {
					o.Reason = lost + " in the result (its group's message has them)"
				}
			}
			r.Tasks = append(r.Tasks, o)
		}
		r.Stats = heldStats(r, times, 0)
		out[role] = result{Result: r, tasksOnly: true}
	}
	return out, nil
}

// episodeEnds reads the end of every episode the session records ended,
// and nothing else of it (its acts' outcomes and its trajectory may be
// what cannot be read). An end that is not in the stream is an error, as
// it is to readEpisode: the episode ended, and its task is not reported
// unfinished or aborted.
func (s *Service) episodeEnds(ctx context.Context, sess *schema.Session, tasks []schema.Task) (map[int]*episode, error) {
	eps := make(map[int]*episode, len(tasks))
	for e, t := range tasks {
		eps[e] = &episode{task: t}
	}
	err := forEach(ctx, len(tasks), readers, func(ctx context.Context, e int) error {
		if _, ended := slices.BinarySearch(sess.Ended, e); !ended {
			return nil
		}
		m, err := s.Bus.LastMsg(ctx, bus.StreamRollout, subject.EpisodeEnd(sess.Rollout, e))
		if err != nil {
			return err
		}
		if m == nil {
			return endMissing(sess.Rollout, e)
		}
		var end schema.EpisodeEnd
		if err := schema.Unmarshal(m.Data, &end); err != nil {
			return fmt.Errorf("%s: %w", m.Subject, err)
		}
		eps[e].end = &end
		return nil
	})
	return eps, err
}

// groupsSent reads, of every group the session records delivered, each
// role's message if it went out: how its tasks ended for the role, by
// episode, and the groups whose messages are out, in the order delivered.
func (s *Service) groupsSent(ctx context.Context, sess *schema.Session) (map[string]map[int]schema.TaskOutcome, map[string][]int, error) {
	roles, groups := []string{schema.RolePlanner, schema.RoleActor}, sess.Delivered()
	read := make([][]schema.TaskOutcome, len(roles)*len(groups))
	out := make([]bool, len(read))
	err := forEach(ctx, len(read), readers, func(ctx context.Context, i int) error {
		role, g := roles[i/len(groups)], groups[i%len(groups)]
		m, err := s.Bus.LastMsg(ctx, bus.StreamRollout, subject.Group(sess.Rollout, role, g))
		if err != nil || m == nil {
			return err
		}
		var head struct {
			schema.Envelope
			Tasks []schema.TaskOutcome `json:"tasks"`
		}
		if err := schema.UnmarshalPart(m.Data, &schema.Group{}, &head); err != nil {
			return fmt.Errorf("%s: %w", m.Subject, err)
		}
		read[i], out[i] = head.Tasks, true
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	sent, streamed := map[string]map[int]schema.TaskOutcome{}, map[string][]int{}
	for i, tasks := range read {
		role, g := roles[i/len(groups)], groups[i%len(groups)]
		if !out[i] {
			continue
		}
		streamed[role] = append(streamed[role], g)
		if sent[role] == nil {
			sent[role] = map[int]schema.TaskOutcome{}
		}
		for _, o := range tasks {
			sent[role][o.Episode] = o
		}
	}
	return sent, streamed, nil
}

// lostGroup is a group given up: its message did not go out, because of err.
type lostGroup struct {
	index int
	err   error
}

// bareResults are both roles' results of rollout n without samples.
func bareResults(n int64, status, reason string) map[string]result {
	out := map[string]result{}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		out[role] = result{Result: &schema.Result{Rollout: n, Role: role, Status: status, Reason: reason}}
	}
	return out
}

// publishResult sends b's result, moving its samples to its role's object
// store when the message would be too large to carry them.
func (s *Service) publishResult(ctx context.Context, b result) error {
	r := b.Result
	r.SampleCount = len(b.samples)
	// A rollout's samples are encoded once: those of delivered groups are
	// as they were delivered. The result's body holds them as they encode
	// alone, so samples over the limit make a body over it too: to the
	// object store, without encoding the body. Under it, the samples are
	// decoded into the body, which is encoded, weighed, and sent as it is.
	data, err := encodeSamples(b.samples)
	if err != nil {
		return fail.E(fail.Permanent, err)
	}
	var body []byte
	if len(data) <= s.InlineLimit {
		if r.Samples, err = samplesOf(b.samples); err != nil {
			return fail.E(fail.Permanent, err)
		}
		if body, err = schema.Marshal(r); err != nil {
			return fail.E(fail.Permanent, err)
		}
	}
	if len(data) > s.InlineLimit || len(body) > s.InlineLimit {
		store := s.Bus.Results[r.Role]
		if store == nil {
			return fail.Permanentf("no result store for role %q", r.Role)
		}
		name := fmt.Sprintf("rollout-%d-%s.samples", r.Rollout, r.Role)
		if _, err := store.PutBytes(ctx, name, data); err != nil {
			return fail.Transientf("store %s: %w", name, err)
		}
		r.Samples, r.SamplesObject = nil, name
		return s.publishAnswer(ctx, r, nil)
	}
	return s.publishAnswer(ctx, r, body)
}

func isNotFound(err error) bool {
	return errors.Is(err, jetstream.ErrObjectNotFound) || errors.Is(err, jetstream.ErrKeyNotFound)
}

// cut splits "bucket/name".
func cut(obj string) (bucket, name string, ok bool) { return strings.Cut(obj, "/") }
