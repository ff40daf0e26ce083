package client_test

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/natsbin"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
)

func TestArrivalsPlanactCannotAnswerAreRefusedAtOnce(t *testing.T) {
	_, url := bustest.Server(t)
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, a := range []*schema.Arrive{
		{Rollout: 1, Role: "critic", Engine: schema.Engine{URL: "http://e"}},
		{Rollout: -1, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://e"}},
		{Rollout: 1, Role: schema.RolePlanner},
	} {
		if err := c.Arrive(ctx, a); !errors.Is(err, client.ErrRejected) {
			t.Errorf("%+v: %v, want ErrRejected", a, err)
		}
	}
}

// TestRolesPlanactDoesNotHaveAreRefusedAtOnce: waiting for the result or
// the groups of a role planact does not have used to wait for ever (no
// result comes on rollout.N.result.critic), and a cancel, pause or resume
// of one was sent; each is refused at once, naming the role.
func TestRolesPlanactDoesNotHaveAreRefusedAtOnce(t *testing.T) {
	_, url := bustest.Server(t)
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const want = `role "critic": want planner or actor`
	if _, err := c.Result(ctx, 1, "critic"); !errors.Is(err, client.ErrRejected) || !strings.Contains(err.Error(), want) {
		t.Errorf("result: %v", err)
	}
	for _, err := range c.Groups(ctx, 1, "critic") {
		if !errors.Is(err, client.ErrRejected) || !strings.Contains(err.Error(), want) {
			t.Errorf("groups: %v", err)
		}
		break
	}
	_, perr := c.Pause(ctx, "critic", client.PauseOptions{})
	for what, err := range map[string]error{"cancel": c.Cancel(ctx, 1, "critic", ""), "pause": perr, "resume": c.Resume(ctx, "critic", "v2")} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", what, err)
		}
	}
}

// TestResultTimesOut: with nobody to answer, waiting ends with ErrTimeout
// when the caller's context does, so a trainer can fall back.
func TestResultTimesOut(t *testing.T) {
	_, url := bustest.Server(t)
	bustest.Bus(t, url, "provision") // the streams exist, planact does not run
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	res, err := c.Result(ctx, 9, schema.RoleActor)
	if !errors.Is(err, client.ErrTimeout) || res != nil {
		t.Errorf("%v %v, want ErrTimeout and no result", res, err)
	}
}

// TestOldServerRefused: a trainer on a nats-server older than planact
// needs learns so when it makes its client, in one line naming both
// versions, instead of arriving and waiting for its whole time-out.
func TestOldServerRefused(t *testing.T) {
	old := natsbin.Old(t)
	c, err := client.New(bustest.Conn(t, old.URL))
	want := "nats-server too old for planact: " + old.URL + " runs " + old.Version + ", planact needs 2.12.0 or later"
	if c != nil || !errors.Is(err, bus.ErrServerTooOld) || !strings.Contains(err.Error(), want) {
		t.Errorf("client on nats-server %s: %v, want ErrServerTooOld saying %q", old.Version, err, want)
	}
}

// TestArrivalsAreForgotten: a client remembers its arrival for a rollout
// and role (to tell its answer from an earlier arrival's) until planact
// answered it, Result or Rollout returning, and a bounded number of those
// never answered: a trainer that runs for weeks does not grow with every
// rollout.
func TestArrivalsAreForgotten(t *testing.T) {
	_, b, c, ctx := planactClient(t)
	arrival := func(n int64) *schema.Arrive {
		return &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://e"}, AtMs: time.Now().UnixMilli(),
			Nonce: "0f0f0f0f0f0f0f0f"} // set, so that a.MsgID() is the id sent
	}
	for i := range 20 {
		n := int64(200 + i)
		a := arrival(n)
		// The result names the arrival it answers, as planact's do.
		if err := b.Publish(ctx, &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK, ArrivalID: a.MsgID()}); err != nil {
			t.Fatal(err)
		}
		var err error
		if i%2 == 0 {
			if err := c.Arrive(ctx, a); err != nil {
				t.Fatal(err)
			}
			_, err = c.Result(ctx, n, schema.RoleActor)
		} else {
			_, err = c.Rollout(ctx, a, 0)
		}
		if err != nil {
			t.Fatalf("rollout %d: %v", n, err)
		}
	}
	if k := client.Arrivals(c); k != 0 {
		t.Errorf("%d arrivals remembered after their results, want none", k)
	}
	defer client.KeepArrivals(8)()
	for i := range 20 {
		if err := c.Arrive(ctx, arrival(int64(300+i))); err != nil {
			t.Fatal(err)
		}
	}
	if k := client.Arrivals(c); k != 8 {
		t.Errorf("%d arrivals never answered remembered, want the last 8", k)
	}
}

// TestAnAnswerNamingNoArrivalIsNotMine: planact's answers name the arrival
// they answer. One that names none (left by a session-store before that:
// the answer to an earlier rollout of the number, whose role came late)
// was taken for the result of the arrival the client had made; now it is
// passed over, and taken only by a client that made no arrival.
func TestAnAnswerNamingNoArrivalIsNotMine(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planact")
	ctx := context.Background()
	const n = 401
	if err := b.Publish(ctx, &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultTimeout,
		Reason: "arrived after the rollout ended: barrier time-out: the other role never arrived"}); err != nil {
		t.Fatal(err)
	}
	arrived, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	if err := arrived.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://e"}}); err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if res, err := arrived.Result(wait, n, schema.RoleActor); !errors.Is(err, client.ErrTimeout) || res != nil {
		t.Errorf("after an arrival: %+v, %v; want no result (ErrTimeout): the one there answers no arrival", res, err)
	}
	reader, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := reader.Result(ctx, n, schema.RoleActor); res == nil || res.Status != schema.ResultTimeout || !errors.Is(err, client.ErrTimeout) {
		t.Errorf("without an arrival: %+v, %v; want the result there", res, err)
	}
}

// TestPauseBoundsItsWait: a pause planact would refuse is an error before
// it is sent (the session-store refused it and answered nothing, and the
// trainer waited as long as its context allowed); an answer that does not
// come ends the wait past the pause's time-out, with ErrTimeout, however
// long the caller's context.
func TestPauseBoundsItsWait(t *testing.T) {
	_, url := bustest.Server(t)
	bustest.Bus(t, url, "provision") // the streams exist, planact does not run
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, timeout := range []time.Duration{500 * time.Millisecond, -time.Second} {
		if _, err := c.Pause(ctx, schema.RoleActor, client.PauseOptions{Timeout: timeout}); err == nil || errors.Is(err, client.ErrTimeout) {
			t.Errorf("a pause of %v: %v; want it refused at once", timeout, err)
		}
	}
	defer client.SetPauseAnswerMargin(100 * time.Millisecond)()
	_, err = c.Pause(ctx, schema.RoleActor, client.PauseOptions{Timeout: time.Second})
	if !errors.Is(err, client.ErrTimeout) {
		t.Errorf("a pause nobody answers: %v; want ErrTimeout after its time-out", err)
	}
}

// TestNotUpNamesWhatIsMissing: a trainer that starts before planact has
// provisioned is told which stream or object store is not there: its
// role's (TRAINER_<ROLE>, tasks_<role>), where its messages go. The error
// named the ROLLOUT stream, which the trainer never writes, or, when ctx
// ended within an attempt (a publish to no stream was retried inside it),
// said only that the context ended.
func TestNotUpNamesWhatIsMissing(t *testing.T) {
	_, url := bustest.Server(t) // nothing provisioned
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	c.InlineTasksLimit = 1
	a := &schema.Arrive{Rollout: 1, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://e"}}
	withTasks := *a
	withTasks.Tasks = []schema.Task{{Prompt: "q"}}
	// Each waits long enough to find nothing there, all at once.
	calls := map[string]func(context.Context) error{
		"arrive": func(ctx context.Context) error { return c.Arrive(ctx, a) },
		"tasks":  func(ctx context.Context) error { return c.Arrive(ctx, &withTasks) },
		"cancel": func(ctx context.Context) error { return c.Cancel(ctx, 1, schema.RoleActor, "") },
		"pause": func(ctx context.Context) error {
			_, err := c.Pause(ctx, schema.RoleActor, client.PauseOptions{})
			return err
		},
		"resume": func(ctx context.Context) error { return c.Resume(ctx, schema.RoleActor, "v2") },
	}
	want := map[string]string{"tasks": "no tasks_actor object store"}
	var mu sync.Mutex
	errs := map[string]error{}
	var wg sync.WaitGroup
	for what, call := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			err := call(ctx)
			mu.Lock()
			errs[what] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	for what, err := range errs {
		w := cmp.Or(want[what], "no TRAINER_ACTOR stream")
		if err == nil || !strings.Contains(err.Error(), w) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: %v; want an error saying %q, and that ctx ended", what, err, w)
		}
	}
}

// TestRolloutRefusesANegativeTimeout: a negative timeout (a deadline
// already past) is an error naming it, before anything is sent; Rollout
// and Evaluate took it for none and waited until ctx ended.
func TestRolloutRefusesANegativeTimeout(t *testing.T) {
	_, url := bustest.Server(t)
	bustest.Bus(t, url, "provision") // the streams exist, planact does not run
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := &schema.Arrive{Rollout: 1, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://e"}}
	_, rerr := c.Rollout(ctx, a, -time.Second)
	_, eerr := c.Evaluate(ctx, a, -time.Second)
	for what, err := range map[string]error{"rollout": rerr, "evaluate": eerr} {
		if err == nil || errors.Is(err, client.ErrTimeout) || !strings.Contains(err.Error(), "timeout -1s") {
			t.Errorf("%s: %v; want an error naming the timeout", what, err)
		}
	}
	if k := client.Arrivals(c); k != 0 {
		t.Errorf("%d arrivals sent, want none", k)
	}
}

// TestResultRefusesSamplesThatAreNotTheirDigest: a samples object whose
// data is not what its metadata's digest says is an error at once, naming
// it: no read mends it. Result read it again until ctx ended.
func TestResultRefusesSamplesThatAreNotTheirDigest(t *testing.T) {
	_, b, c, ctx := planactClient(t)
	const n, name = 140, "rollout-140-actor.samples"
	samples := []schema.Sample{{RolloutID: "140-0"}}
	data, err := schema.Marshal(&samples)
	if err != nil {
		t.Fatal(err)
	}
	store, err := b.JS.ObjectStore(ctx, bus.ObjectResults(schema.RoleActor))
	if err != nil {
		t.Fatal(err)
	}
	info, err := store.PutBytes(ctx, name, data)
	if err != nil {
		t.Fatal(err)
	}
	// The metadata, written again with another digest.
	info.Digest = "SHA-256=" + strings.Repeat("A", 43) + "="
	meta, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	subj := "$O." + bus.ObjectResults(schema.RoleActor) + ".M." + base64.URLEncoding.EncodeToString([]byte(name))
	if _, err := b.JS.Publish(ctx, subj, meta); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK, SamplesObject: name, SampleCount: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Result(ctx, n, schema.RoleActor)
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "does not match its digest") || !strings.Contains(err.Error(), name) {
		t.Errorf("samples that are not their digest: %v; want an error naming the object, before ctx ends", err)
	}
}
