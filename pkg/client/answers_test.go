package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestResultTakesTheRejectionOfItsArrival: an arrival of a role that
// arrived already and asks for something else is refused, and the rollout
// goes on with the first arrival, whose result names that arrival and ends
// after this one. Result called once both were out read the result
// subject first and returned the other arrival's result (samples of other
// tasks) with no error; the refusal of its own arrival wins.
func TestResultTakesTheRejectionOfItsArrival(t *testing.T) {
	_, b, c, ctx := planactClient(t)
	const n = 150
	a := &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://e"}, AtMs: time.Now().UnixMilli(),
		Nonce: "0f0f0f0f0f0f0f0f"} // set, so that a.MsgID() is the id sent
	if err := c.Arrive(ctx, a); err != nil {
		t.Fatal(err)
	}
	for _, m := range []schema.Message{
		&schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultInvalid, Rejected: true, ArrivalID: a.MsgID(),
			Reason: "rollout 150: the actor arrived already, asking for other tasks: tasks 8, was 16"},
		&schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK, ArrivalID: "arrive.150.actor..1",
			Samples: []schema.Sample{{RolloutID: "150-0"}}, SampleCount: 1, Stats: schema.Stats{FinishedMs: a.AtMs + 60_000}},
	} {
		if err := b.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	res, err := c.Result(ctx, n, schema.RoleActor)
	if !errors.Is(err, client.ErrRejected) || !strings.Contains(err.Error(), "tasks 8, was 16") {
		t.Fatalf("result %+v, %v; want ErrRejected with the refusal's reason", res, err)
	}
	if res != nil && len(res.Samples) > 0 {
		t.Errorf("the refused arrival got %d samples of the other's", len(res.Samples))
	}
}

// TestACallerThatStopsWaitingForSamplesGetsErrTimeout: a result (or a
// group) names its samples, in the object store or a group message, and
// they are read until ctx ends; then the caller stopped waiting, which is
// ErrTimeout (the trainer falls back), as it is for a result that never
// came. It was an error wrapping only the context's, which a trainer took
// for a failed rollout.
func TestACallerThatStopsWaitingForSamplesGetsErrTimeout(t *testing.T) {
	_, b, c, ctx := planactClient(t)
	wait := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 700*time.Millisecond) }
	for what, r := range map[string]*schema.Result{
		"an object never there": {Rollout: 160, Role: schema.RoleActor, Status: schema.ResultOK, SamplesObject: "rollout-160-actor.samples", SampleCount: 1},
		"a group never there": {Rollout: 161, Role: schema.RoleActor, Status: schema.ResultOK, DeliveredGroups: []int{0}, GroupSamples: 1,
			Tasks: []schema.TaskOutcome{{State: schema.TaskTrained}}},
	} {
		if err := b.Publish(ctx, r); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := wait()
		_, err := c.Result(wctx, r.Rollout, schema.RoleActor)
		cancel()
		if !errors.Is(err, client.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("result with %s: %v; want ErrTimeout", what, err)
		}
	}
	// A group whose samples object is never there.
	g := &schema.Group{Rollout: 162, Role: schema.RoleActor, GroupIndex: 0, Delivered: []int{0}, Groups: 1,
		SamplesObject: "rollout-162-actor-group-0.samples", SampleCount: 1, Tasks: []schema.TaskOutcome{{State: schema.TaskTrained}}}
	if err := b.Publish(ctx, g); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := wait()
	defer cancel()
	for got, err := range c.Groups(wctx, 162, schema.RoleActor) {
		if got != nil {
			t.Fatalf("group %+v, whose samples are nowhere", got)
		}
		if !errors.Is(err, client.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("groups: %v; want ErrTimeout", err)
		}
		break // as a trainer does on the first error
	}
}

// TestGroupsTellAGroupThatDoesNotDecodeOnceInItsPlace: a group message
// that does not decode is an error in its place, said once, and the
// stream goes on with the other groups, as it does for a group whose
// samples are not its count. It was said again on every read (the
// subscription, then each recheck), the groups named after it were not
// yielded while the rollout ran, and once the result was out the stream
// ended at it, without them.
func TestGroupsTellAGroupThatDoesNotDecodeOnceInItsPlace(t *testing.T) {
	_, b, c, ctx := planactClient(t)
	c.Recheck = 50 * time.Millisecond
	const n = 170
	group := func(g int, delivered ...int) *schema.Group {
		return &schema.Group{Rollout: n, Role: schema.RoleActor, GroupIndex: g, Delivered: delivered, Groups: 3,
			Samples: []schema.Sample{{GroupIndex: g, RolloutID: fmt.Sprintf("%d-%d", n, g)}}, SampleCount: 1,
			Tasks: []schema.TaskOutcome{{Episode: g, GroupIndex: g, State: schema.TaskTrained}}}
	}
	if err := b.Publish(ctx, group(0, 0)); err != nil {
		t.Fatal(err)
	}
	// Group 1's message is not msgpack of a group.
	if _, err := b.JS.Publish(ctx, fmt.Sprintf("rollout.%d.result.actor.group.1", n), []byte{0xc1}); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, group(2, 0, 1, 2)); err != nil {
		t.Fatal(err)
	}
	var got []int
	var errs []error
	resulted := false
	for g, err := range c.Groups(ctx, n, schema.RoleActor) {
		if err != nil {
			errs = append(errs, err)
		} else {
			got = append(got, g.GroupIndex)
		}
		if len(got)+len(errs) >= 3 && !resulted {
			// Several rechecks, then the result.
			time.Sleep(300 * time.Millisecond)
			resulted = true
			if err := b.Publish(ctx, &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK, StreamedGroups: []int{0, 1, 2},
				Tasks: []schema.TaskOutcome{{State: schema.TaskTrained}, {Episode: 1, GroupIndex: 1, State: schema.TaskTrained}, {Episode: 2, GroupIndex: 2, State: schema.TaskTrained}}}); err != nil {
				t.Fatal(err)
			}
		}
		if len(errs) > 5 {
			break
		}
	}
	if fmt.Sprint(got) != "[0 2]" {
		t.Errorf("groups %v; want 0 and 2", got)
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "group.1") {
		t.Errorf("errors %v; want one, naming group 1's subject", errs)
	}
	if !resulted {
		t.Error("the stream ended before the result was out")
	}
}

// TestEvaluateAsksForAnEvaluationWithTasksInTheStore: an arrival that
// brings its tasks by reference (tasks_object, put in the store before)
// brings the tasks; Evaluate set evaluation only on an arrival with a
// config or inline tasks, so this one ran a training rollout to its end,
// and Evaluate then refused its result.
func TestEvaluateAsksForAnEvaluationWithTasksInTheStore(t *testing.T) {
	_, b, c, ctx := planactClient(t)
	const n = 180
	a := &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://e"},
		TasksObject: "eval-180.tasks", TasksSHA256: strings.Repeat("0", 64)}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := c.Evaluate(wctx, a, 0); !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("evaluate with nobody to run it: %v; want ErrTimeout", err)
	}
	if a.Config != nil {
		t.Errorf("the caller's arrival was changed: config %+v", a.Config)
	}
	stream, err := b.JS.Stream(ctx, bus.StreamTrainer(schema.RolePlanner))
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetLastMsgForSubject(ctx, subject.Arrive(n, schema.RolePlanner))
	if err != nil {
		t.Fatal(err)
	}
	var sent schema.Arrive
	if err := schema.Unmarshal(m.Data, &sent); err != nil {
		t.Fatal(err)
	}
	if sent.Config == nil || !sent.Config.Evaluation || sent.TasksObject != a.TasksObject {
		t.Errorf("sent %+v; want its tasks_object and a config asking for an evaluation", sent)
	}
}

// TestNegativeSettingsAreRefused: a negative Recheck or InlineTasksLimit
// is a caller's mistake, said before anything is sent or waited for; they
// were taken for the defaults (0) without a word.
func TestNegativeSettingsAreRefused(t *testing.T) {
	defer client.SetPauseAnswerMargin(100 * time.Millisecond)()
	defer client.SetResumeAnswerWait(time.Second)()
	_, _, c, ctx := planactClient(t)
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	a := &schema.Arrive{Rollout: 190, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://e"}, Tasks: []schema.Task{{Prompt: "q"}}}

	c.InlineTasksLimit = -1
	if err := c.Arrive(wctx, a); err == nil || !strings.Contains(err.Error(), "InlineTasksLimit -1") {
		t.Errorf("arrive with InlineTasksLimit -1: %v; want an error naming it", err)
	}
	c.InlineTasksLimit = 0

	c.Recheck = -time.Second
	errs := map[string]error{}
	_, errs["result"] = c.Result(wctx, 190, schema.RoleActor)
	_, errs["rollout"] = c.Rollout(wctx, a, 0)
	for _, err := range c.Groups(wctx, 190, schema.RoleActor) {
		errs["groups"] = err
		break
	}
	_, errs["pause"] = c.Pause(wctx, schema.RoleActor, client.PauseOptions{Timeout: time.Second})
	errs["resume"] = c.Resume(wctx, schema.RoleActor, "v2")
	for what, err := range errs {
		if err == nil || errors.Is(err, client.ErrTimeout) || !strings.Contains(err.Error(), "Recheck -1s") {
			t.Errorf("%s with Recheck -1s: %v; want an error naming it", what, err)
		}
	}
	if k := client.Arrivals(c); k != 0 {
		t.Errorf("%d arrivals sent, want none", k)
	}
}
