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
func (s *Service) publishResults(ctx context.Context, sess *schema.Session, undelivered []string) (*published, error) {
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
				built = bareResults(n, schema.ResultFailed, "samples could not be delivered: "+strings.Join(undelivered, "; "))
			}
			if built == nil {
				if built, err = s.results(ctx, sess, giveUp); err != nil {
					return nil, err
				}
			}
			b := built[role]
			r = b.Result
			r.ArrivalID = sess.Roles[role].ArrivalID
			// The groups streamed are named in every result, whatever
			// became of the rest (a failed one too): a reader of the
			// groups reads each.
			r.StreamedGroups = sess.Delivered()
			r.Stats.StartedMs, r.Stats.FinishedMs = sess.StartedMs, sess.FinishedMs
			if err := s.publishResult(ctx, b); err != nil {
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
// samples b was to hold: those failed. Every count in it is of what it
// holds (its tokens are those of the groups it leaves out, if any). When
// even the list of tasks is too large for a message, it lists none, and
// its reason says so. It names the groups streamed, as every result does:
// a reader of the groups reads each. body is r encoded.
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
	full.Stats.TaskStates = map[string]int{}
	for i, out := range b.Tasks {
		if out.State == schema.TaskTrained && lost[episodeID(b.Rollout, out.Episode)] {
			out.State, out.Reason = schema.TaskFailed, "its samples could not be delivered"
			if slices.Contains(b.StreamedGroups, out.GroupIndex) {
				out.Reason = "its samples could not be delivered in the result (its group's message has them)"
			}
		}
		full.Tasks[i] = out
		full.Stats.TaskStates[out.State]++
	}
	if len(full.Stats.TaskStates) == 0 {
		full.Stats.TaskStates = nil
	}
	// The roles' results share what assembly counted: the tokens are
	// counted afresh.
	left := b.Stats.Tokens[b.Role] - tokens
	full.Stats.Tokens = nil
	if left > 0 {
		full.Stats.Tokens = map[string]int{b.Role: left}
	}
	if body, err = schema.Marshal(&full); err != nil {
		return nil, nil, fail.E(fail.Permanent, err)
	}
	limit := s.maxBody()
	if len(body) <= limit {
		return &full, body, nil
	}
	bare := &schema.Result{Rollout: full.Rollout, Role: full.Role, Status: schema.ResultFailed,
		Reason: fmt.Sprintf("%s; the list of its %d tasks does not fit in a message either (%d bytes, over the %d a result can have), so this result lists none",
			reason, len(full.Tasks), len(body), limit),
		Stats:     schema.Stats{StartedMs: full.Stats.StartedMs, FinishedMs: full.Stats.FinishedMs, WallMs: full.Stats.WallMs, Tokens: full.Stats.Tokens},
		ArrivalID: full.ArrivalID, StreamedGroups: full.StreamedGroups, DeliveredGroups: full.DeliveredGroups, GroupSamples: full.GroupSamples,
		Evaluation: full.Evaluation}
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
		return bare(schema.ResultFailed, "samples could not be assembled: "+err.Error()), nil
	}
	return map[string]result{schema.RolePlanner: planner, schema.RoleActor: actor}, nil
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
