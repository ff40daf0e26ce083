package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/view"
)

// The attacks of issue 17, each run as the user who would try it, with the
// real nats CLI where the attack is a command, against the three servers of
// compose/nats with compose/nats/accounts.conf verbatim and every service
// running as its own user. Every attack must be refused; where a permission
// refuses it, the server's log must show the violation.

// attackers are the cluster and what an attack needs of it.
type attackers struct {
	t       *testing.T
	urls    []string
	v       *violations
	admin   *nats.Conn
	ajs     jetstream.JetStream
	ab      *bus.Bus // admin's, for reads from the streams' leaders
	planner schema.Engine
	actor   schema.Engine
	e       *env

	mu   sync.Mutex
	seen []string // violation lines already matched
}

// cli runs the nats CLI as user, bounded by limit, and returns its output
// and error (a refused command fails; that is not the test's failure).
func (a *attackers) cli(user string, limit time.Duration, stdin []byte, args ...string) (string, error) {
	a.t.Helper()
	cli, path := natsCLI(a.t)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, cli, append(a.cliAuth(user), args...)...)
	cmd.Env = append(os.Environ(), "PATH="+path, "NATS_CONTEXT=", "HOME="+a.t.TempDir())
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// cliStart runs the nats CLI as user in the background until stop.
func (a *attackers) cliStart(user string, args ...string) (stop func() string) {
	a.t.Helper()
	cli, path := natsCLI(a.t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, cli, append(a.cliAuth(user), args...)...)
	cmd.Env = append(os.Environ(), "PATH="+path, "NATS_CONTEXT=", "HOME="+a.t.TempDir())
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return func() string {
		cancel()
		<-done
		return out.String()
	}
}

// cliAuth are the CLI's connection flags for user: with its own inbox
// prefix, which it must give to use JetStream at all.
func (a *attackers) cliAuth(user string) []string {
	return []string{"--server", a.urls[0], "--user", user, "--password", "pw-" + user, "--timeout", "3s", "--inbox-prefix", bus.InboxPrefix(user)}
}

// conn connects as user, collecting the asynchronous errors (permission
// violations) the server sends it.
func (a *attackers) conn(user string) (*nats.Conn, chan error) {
	a.t.Helper()
	errs := make(chan error, 64)
	nc, err := bustest.Connect(withUser(a.urls[1], user), nats.CustomInboxPrefix(bus.InboxPrefix(user)), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(nc.Close)
	return nc, errs
}

// trainer is role's training job on its own connection.
func (a *attackers) trainer(role string) *client.Client {
	a.t.Helper()
	nc, _ := a.conn("trainer-" + role)
	c, err := client.New(nc)
	if err != nil {
		a.t.Fatal(err)
	}
	return c
}

// violation waits until the server logged a permission violation of user
// that mentions what (a subject), and fails the test if none comes.
func (a *attackers) violation(user, what string) {
	a.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, line := range a.v.snapshot() {
			if strings.Contains(line, "user:"+user) && strings.Contains(line, what) {
				return
			}
		}
		if time.Now().After(deadline) {
			a.t.Errorf("no permission violation of %s on %q in the servers' log", user, what)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// last returns the last message on subj in the stream of planact's that
// holds it, or nil, read as admin from the stream's leader: a direct get
// may be answered by a replica that has not yet stored a message the
// leader acknowledged a moment ago (an arrival just made seemed missing
// once), and a check that nothing was stored must not rest on a replica
// that is behind either.
func (a *attackers) last(subj string) *bus.StoredMsg {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	m, err := a.ab.LastMsg(ctx, bus.StreamOf(subj), subj)
	if err != nil {
		a.t.Fatalf("read %s: %v", subj, err)
	}
	return m
}

// streamMsgs returns how many messages stream holds.
func (a *attackers) streamMsgs(name string) uint64 {
	a.t.Helper()
	return a.streamState(name).Msgs
}

// streamState returns what stream holds.
func (a *attackers) streamState(name string) jetstream.StreamState {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for {
		s, err := a.ajs.Stream(ctx, name)
		if err == nil {
			var info *jetstream.StreamInfo
			if info, err = s.Info(ctx); err == nil {
				return info.State
			}
		}
		if ctx.Err() != nil {
			a.t.Fatalf("stream %s: %v", name, err)
		}
		time.Sleep(100 * time.Millisecond) // a leader being elected
	}
}

// rollout runs rollout n with both trainers and returns their results.
func (a *attackers) rollout(n int64, tasks []schema.Task, wait time.Duration) outcome {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	pc, ac := a.trainer(schema.RolePlanner), a.trainer(schema.RoleActor)
	pc.InlineTasksLimit = 256
	var o outcome
	if err := pc.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: a.planner, WeightVersion: "planner-v7", Tasks: tasks}); err != nil {
		o.perr = err
		return o
	}
	if err := ac.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: a.actor, WeightVersion: "actor-v3"}); err != nil {
		o.aerr = err
		return o
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); o.planner, o.perr = pc.Result(ctx, n, schema.RolePlanner) }()
	go func() { defer wg.Done(); o.actor, o.aerr = ac.Result(ctx, n, schema.RoleActor) }()
	wg.Wait()
	return o
}

// ok says whether both results of o are ok.
func (o outcome) ok() bool {
	return o.perr == nil && o.aerr == nil && o.planner != nil && o.actor != nil &&
		o.planner.Status == schema.ResultOK && o.actor.Status == schema.ResultOK
}

func (o outcome) String() string {
	s := func(r *schema.Result, err error) string {
		if r == nil {
			return fmt.Sprintf("no result (%v)", err)
		}
		return fmt.Sprintf("%s %q, %d samples (%v)", r.Status, r.Reason, len(r.Samples), err)
	}
	return "planner " + s(o.planner, o.perr) + "; actor " + s(o.actor, o.aerr)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (v *violations) snapshot() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.lines...)
}

func mustMarshal(t *testing.T, m any) []byte {
	t.Helper()
	b, err := schema.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAttacksOnData runs the attacks of issue 17 on what trainers read and
// write (inboxes, arrivals, results, task lists) as the real users against
// a cluster with the shipped accounts file, and requires each to be
// refused. TestAttacksOnServices runs the rest on a cluster of its own:
// two halves that run beside each other rather than one long test.
func TestAttacksOnData(t *testing.T) {
	t.Parallel()
	a, done := startAttackers(t)
	t.Run("1 snoop: trainer-planner reads everyone's deliveries on _INBOX.>", func(t *testing.T) { a.t = t; a.snoop("trainer-planner", 11) })
	t.Run("1 snoop: viewer reads everyone's deliveries on _INBOX.>", func(t *testing.T) { a.t = t; a.snoop("viewer", 12) })
	t.Run("2 forge: trainer-actor schedules an arrival as the planner", func(t *testing.T) { a.t = t; a.scheduleArrival() })
	t.Run("2 forge: trainer-actor schedules a forged planner result", func(t *testing.T) { a.t = t; a.scheduleResult(done) })
	t.Run("2 forge: trainer-planner copies the actor's result with --schedule-source", func(t *testing.T) { a.t = t; a.scheduleSource(done) })
	t.Run("2 forge: trainer-planner claims the message id of its coming result", func(t *testing.T) { a.t = t; a.claimMsgID(21) })
	t.Run("3 tasks: trainer-planner purges the task lists", func(t *testing.T) { a.t = t; a.purgeTasks() })
	t.Run("3 tasks: trainer-actor deletes and overwrites the planner's task list", func(t *testing.T) { a.t = t; a.touchOthersTasks(31) })
	t.Run("3 tasks: trainer-planner changes its task list after arriving", func(t *testing.T) { a.t = t; a.poisonOwnTasks(32) })
	t.Run("2 forge: trainer-actor rolls up the stream it arrives on", func(t *testing.T) { a.t = t; a.rollup(done) })
	t.Run("2 forge: trainers and the viewer have the server answer onto planact's subjects", func(t *testing.T) { a.t = t; a.replySubjects(done) })
	t.Run("2 forge: trainer-actor arrives, in its own stream, as the planner of another rollout", func(t *testing.T) { a.t = t; a.forgeArrival(33) })
	a.t = t
	a.stillRuns()
}

// TestAttacksOnServices runs the attacks of issue 17 on planact's services
// and the server's limits: a viewer that naks, fakes a gateway or makes
// consumers, services that change their streams, a trainer's consumers,
// schedules, subscriptions and floods.
func TestAttacksOnServices(t *testing.T) {
	t.Parallel()
	a, _ := startAttackers(t)
	t.Run("4 viewer: -NAKs the services' deliveries", func(t *testing.T) { a.t = t; a.viewerNaks(41) })
	t.Run("4 viewer: answers $SRV.PING.planner-gateway as a fake gateway", func(t *testing.T) { a.t = t; a.fakeGateway() })
	t.Run("4 viewer: creates durable consumers", func(t *testing.T) { a.t = t; a.consumers("viewer", "ROLLOUT", 20) })
	t.Run("5 services: change the streams they use", func(t *testing.T) { a.t = t; a.servicesEdit() })
	t.Run("6 limits: trainer-planner creates durable consumers", func(t *testing.T) {
		a.t = t
		a.consumers("trainer-planner", "OBJ_results_planner", 50)
	})
	t.Run("6 limits: trainer-planner leaves schedules that keep writing", func(t *testing.T) { a.t = t; a.everySchedules() })
	t.Run("6 limits: trainer-actor opens subscriptions without end", func(t *testing.T) { a.t = t; a.subscriptions() })
	t.Run("6 limits: trainer-actor takes every connection it may", func(t *testing.T) { a.t = t; a.connections() })
	a.t = t
	a.stillRuns()
	// Last, as it leaves trainer-actor's stream full.
	t.Run("6 limits: trainer-actor floods its arrivals", func(t *testing.T) { a.t = t; a.flood(61) })
}

// startAttackers starts the cluster, the engines and planact as compose/
// deploys them, and runs a first rollout whose results the attacks go
// after; it returns that rollout's number.
func startAttackers(t *testing.T) (*attackers, int64) {
	t.Helper()
	natsCLI(t)
	v := &violations{}
	urls := composeCluster(t, v)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pu, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RolePlanner, Seed: 21, WeightVersion: "planner-v7"})
	if err != nil {
		t.Fatal(err)
	}
	au, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RoleActor, Seed: 22, WeightVersion: "actor-v3"})
	if err != nil {
		t.Fatal(err)
	}
	// A small storage, so that a flood meets its stream's limit soon.
	serveClusterWith(t, ctx, urls, 0, bus.Provisioning{Replicas: 3, Storage: 2 << 30})
	admin := bustest.Conn(t, withUser(urls[0], "admin"))
	ajs, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	ab, err := bus.Open(ctx, admin, zerolog.Nop(), bus.Provisioning{})
	if err != nil {
		t.Fatal(err)
	}
	a := &attackers{t: t, urls: urls, v: v, admin: admin, ajs: ajs, ab: ab,
		planner: schema.Engine{URL: pu, Protocol: "sglang"}, actor: schema.Engine{URL: au, Protocol: "sglang"},
		e: &env{world: sim.DefaultWorld()}}
	const done = 1
	if o := a.rollout(done, a.e.tasks(3, 2, done), 2*time.Minute); !o.ok() {
		t.Fatalf("rollout %d: %v (violations %v)", done, o, v.snapshot())
	}
	return a, done
}

// stillRuns: whatever was tried, planact still runs a rollout.
func (a *attackers) stillRuns() {
	if o := a.rollout(99, a.e.tasks(2, 2, 99), 2*time.Minute); !o.ok() {
		a.t.Errorf("rollout 99 after the attacks: %v", o)
	}
}

// snoop: user subscribes to every inbox while a rollout runs.
func (a *attackers) snoop(user string, n int64) {
	stop := a.cliStart(user, "sub", "_INBOX.>")
	time.Sleep(500 * time.Millisecond) // the CLI subscribes
	o := a.rollout(n, a.e.tasks(2, 2, n), 2*time.Minute)
	out := stop()
	if !o.ok() {
		a.t.Errorf("rollout %d: %v", n, o)
	}
	if got := strings.Count(out, "Received on"); got > 0 {
		a.t.Errorf("%s received %d messages of other users on _INBOX.> during rollout %d:\n%.1500s", user, got, n, out)
	}
	a.violation(user, "_INBOX.>")
}

// scheduleArrival: trainer-actor publishes on its own subject a schedule
// whose target is the planner's arrival subject.
func (a *attackers) scheduleArrival() {
	const n = 22
	forged := mustMarshal(a.t, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://evil.example:1", Protocol: "sglang"},
		Tasks: []schema.Task{{Prompt: "forged", Label: "x"}}, AtMs: time.Now().UnixMilli()})
	out, err := a.cli("trainer-actor", 20*time.Second, forged, "pub", fmt.Sprintf("rollout.%d.arrive.actor", n),
		"--schedule-after", "1s", "--schedule-dest", fmt.Sprintf("rollout.%d.arrive.planner", n), "--force-stdin")
	time.Sleep(2500 * time.Millisecond) // the schedule would fire after 1s
	if m := a.last(fmt.Sprintf("rollout.%d.arrive.planner", n)); m != nil {
		a.t.Errorf("trainer-actor arrived as the planner through a schedule (%v: %s)", err, out)
	}
	if err == nil {
		a.t.Errorf("the scheduled publish was accepted: %s", out)
	}
}

// scheduleResult: trainer-actor schedules a forged ok result on the
// planner's result subject of a finished rollout.
func (a *attackers) scheduleResult(n int64) {
	subj := fmt.Sprintf("rollout.%d.result.planner", n)
	before := a.last(subj)
	forged := mustMarshal(a.t, &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK,
		Samples: []schema.Sample{{Response: "FORGED"}}})
	out, err := a.cli("trainer-actor", 20*time.Second, forged, "pub", fmt.Sprintf("rollout.%d.arrive.actor", 9023),
		"--schedule-after", "1s", "--schedule-dest", subj, "--force-stdin")
	time.Sleep(2500 * time.Millisecond)
	if after := a.last(subj); after == nil || before == nil || after.Seq != before.Seq {
		a.t.Errorf("the planner's result of rollout %d was replaced through a schedule of trainer-actor (%v: %s)", n, err, out)
	}
	if err == nil {
		a.t.Errorf("the scheduled publish was accepted: %s", out)
	}
}

// scheduleSource: trainer-planner has the server copy the actor's result
// onto a subject it may read.
func (a *attackers) scheduleSource(n int64) {
	own := fmt.Sprintf("rollout.%d.result.planner", 9024)
	out, err := a.cli("trainer-planner", 20*time.Second, nil, "pub", fmt.Sprintf("rollout.%d.arrive.planner", 9024), "x",
		"--schedule-after", "1s", "--schedule-source", fmt.Sprintf("rollout.%d.result.actor", n), "--schedule-dest", own)
	time.Sleep(2500 * time.Millisecond)
	if m := a.last(own); m != nil {
		a.t.Errorf("the actor's result of rollout %d was copied to %s (%d bytes) for trainer-planner (%v: %s)", n, own, len(m.Data), err, out)
	}
	if err == nil {
		a.t.Errorf("the scheduled publish was accepted: %s", out)
	}
}

// claimMsgID: trainer-planner publishes on its own subject with the
// message id planact gives rollout n's planner result; the real result
// must still be stored.
func (a *attackers) claimMsgID(n int64) {
	out, err := a.cli("trainer-planner", 20*time.Second, nil, "pub", "-J", fmt.Sprintf("rollout.%d.cancel.planner", 9021), "x",
		"-H", fmt.Sprintf("Nats-Msg-Id:result.%d.planner", n))
	a.t.Logf("claim: %v %s", err, out)
	o := a.rollout(n, a.e.tasks(2, 2, n), 90*time.Second)
	if !o.ok() {
		a.t.Errorf("rollout %d after trainer-planner took its result's message id: %v", n, o)
	}
	// The live copy reached the waiting trainer; the stream must hold it
	// too, for a trainer that reads it later.
	if a.last(fmt.Sprintf("rollout.%d.result.planner", n)) == nil {
		a.t.Errorf("the planner's result of rollout %d is not in the stream: its message id was taken by trainer-planner", n)
	}
}

// purgeTasks: trainer-planner purges the task lists: the actor's, and
// even its own.
func (a *attackers) purgeTasks() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A witness in each store that no rollout names, so nothing of
	// planact's removes it: only a purge would. (The stores' message
	// counts move on their own, as finished rollouts' lists are deleted.)
	const witness = "attack-witness"
	roles := []string{schema.RoleActor, schema.RolePlanner}
	for _, role := range roles {
		store, err := a.ajs.ObjectStore(ctx, bus.ObjectTasks(role))
		if err != nil {
			a.t.Fatal(err)
		}
		if _, err := store.PutBytes(ctx, witness, []byte("still here")); err != nil {
			a.t.Fatalf("witness in %s: %v", bus.ObjectTasks(role), err)
		}
		a.t.Cleanup(func() { _ = store.Delete(context.Background(), witness) })
	}
	// Each refused request waits out the CLI's time-out: both at once.
	outs := make([]string, len(roles))
	errs := make([]error, len(roles))
	var wg sync.WaitGroup
	for i, role := range roles {
		wg.Go(func() {
			outs[i], errs[i] = a.cli("trainer-planner", 20*time.Second, nil, "stream", "purge", "OBJ_"+bus.ObjectTasks(role), "-f")
		})
	}
	wg.Wait()
	for i, role := range roles {
		store, err := a.ajs.ObjectStore(ctx, bus.ObjectTasks(role))
		if err != nil {
			a.t.Fatal(err)
		}
		got, gerr := store.GetBytes(ctx, witness)
		if gerr != nil || string(got) != "still here" || errs[i] == nil {
			a.t.Errorf("trainer-planner purged OBJ_%s (witness: %q, %v; the CLI: %v: %s)", bus.ObjectTasks(role), got, gerr, errs[i], outs[i])
		}
		// The CLI looks at the stream first: that is refused already.
		a.violation("trainer-planner", "$JS.API.STREAM.")
		a.violation("trainer-planner", "OBJ_"+bus.ObjectTasks(role))
	}
}

// taskObject returns the object and store of the task list role arrived
// with for rollout n.
func (a *attackers) taskObject(n int64, role string) (store, name string) {
	a.t.Helper()
	m := a.last(fmt.Sprintf("rollout.%d.arrive.%s", n, role))
	if m == nil {
		a.t.Fatalf("no arrival of %s for rollout %d", role, n)
	}
	var arr schema.Arrive
	if err := schema.Unmarshal(m.Data, &arr); err != nil || arr.TasksObject == "" {
		a.t.Fatalf("arrival of %s for rollout %d: %v, object %q", role, n, err, arr.TasksObject)
	}
	return bus.ObjectTasks(role), arr.TasksObject
}

// touchOthersTasks: trainer-actor deletes, then overwrites, the task list
// the planner arrived with (rollout n waits at the barrier for the actor).
func (a *attackers) touchOthersTasks(n int64) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pc := a.trainer(schema.RolePlanner)
	pc.InlineTasksLimit = 256
	if err := pc.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: a.planner, Tasks: a.e.tasks(3, 1, n)}); err != nil {
		a.t.Fatal(err)
	}
	bucket, name := a.taskObject(n, schema.RolePlanner)
	store, err := a.ajs.ObjectStore(ctx, bucket)
	if err != nil {
		a.t.Fatal(err)
	}
	infoBefore, err := store.GetInfo(ctx, name)
	if err != nil {
		a.t.Fatalf("the planner's task list %s: %v", name, err)
	}
	poison := mustMarshal(a.t, &schema.TaskList{Tasks: []schema.Task{{Prompt: "q", Label: "POISONED-LABEL"}}})
	file := a.t.TempDir() + "/poison"
	if err := os.WriteFile(file, poison, 0o600); err != nil {
		a.t.Fatal(err)
	}
	// Each refused request waits out the CLI's time-out: both at once.
	var put, del struct {
		out string
		err error
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		put.out, put.err = a.cli("trainer-actor", 20*time.Second, nil, "obj", "put", bucket, file, "--name", name, "-f")
	})
	wg.Go(func() {
		del.out, del.err = a.cli("trainer-actor", 20*time.Second, nil, "obj", "del", bucket, name, "-f")
	})
	wg.Wait()
	info, gerr := store.GetInfo(ctx, name)
	if gerr != nil {
		a.t.Errorf("trainer-actor deleted the planner's task list %s: %v (%v: %s)", name, gerr, del.err, del.out)
	} else if info.Digest != infoBefore.Digest {
		a.t.Errorf("trainer-actor overwrote the planner's task list %s (%v: %s)", name, put.err, put.out)
	}
	a.violation("trainer-actor", bucket)
	_ = pc.Cancel(ctx, n, schema.RolePlanner, "attack over")
}

// poisonOwnTasks: trainer-planner arrives with a task list in the object
// store, then writes other tasks under its name before the actor arrives:
// the rollout must not run on them.
func (a *attackers) poisonOwnTasks(n int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pnc, _ := a.conn("trainer-planner")
	pc, err := client.New(pnc)
	if err != nil {
		a.t.Fatal(err)
	}
	pc.InlineTasksLimit = 256
	tasks := a.e.tasks(3, 1, n)
	if err := pc.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: a.planner, Tasks: tasks}); err != nil {
		a.t.Fatal(err)
	}
	js, err := jetstream.New(pnc)
	if err != nil {
		a.t.Fatal(err)
	}
	bucket, name := a.taskObject(n, schema.RolePlanner)
	store, err := js.ObjectStore(ctx, bucket)
	if err != nil {
		a.t.Fatal(err)
	}
	var poisoned []schema.Task
	for _, tk := range tasks {
		tk.Label = "POISONED-LABEL"
		poisoned = append(poisoned, tk)
	}
	// Its store is its own: the new list takes the name (the removal of
	// the old chunks, which needs a purge, is refused, so the put waits
	// for an answer that never comes: it is over once the name is taken).
	before, err := store.GetInfo(ctx, name)
	if err != nil {
		a.t.Fatalf("its task list %s: %v", name, err)
	}
	pctx, pcancel := context.WithTimeout(ctx, time.Minute)
	putDone := make(chan error, 1)
	go func() {
		_, err := store.PutBytes(pctx, name, mustMarshal(a.t, &schema.TaskList{Tasks: poisoned}))
		putDone <- err
	}()
	for overwritten := false; !overwritten; {
		select {
		case perr := <-putDone:
			a.t.Logf("overwrite of its own list: %v", perr)
			overwritten = true
		case <-time.After(50 * time.Millisecond):
			info, err := store.GetInfo(ctx, name)
			overwritten = err == nil && info.Digest != before.Digest
		}
	}
	pcancel()
	if info, err := store.GetInfo(ctx, name); err != nil || info.Digest == before.Digest {
		a.t.Fatalf("trainer-planner could not overwrite its own task list %s (%v): the attack did not happen", name, err)
	}
	ac := a.trainer(schema.RoleActor)
	if err := ac.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: a.actor}); err != nil {
		a.t.Fatal(err)
	}
	r, err := pc.Result(ctx, n, schema.RolePlanner)
	if r == nil {
		a.t.Fatalf("rollout %d: %v", n, err)
	}
	for _, s := range r.Samples {
		if strings.Contains(fmt.Sprint(s.Label), "POISONED") {
			a.t.Fatalf("rollout %d ran on the task list changed after the arrival: sample label %v (%s %s)", n, s.Label, r.Status, r.Reason)
		}
	}
	if r.Status != schema.ResultInvalid || !strings.Contains(r.Reason, "SHA-256") {
		a.t.Errorf("rollout %d: %s %q; want invalid, naming the SHA-256 that does not match", n, r.Status, r.Reason)
	}
}

// viewerNaks: the viewer answers every delivery it can see with -NAK
// while a rollout runs.
func (a *attackers) viewerNaks(n int64) {
	nc, errs := a.conn("viewer")
	var naks atomic.Int64
	_, err := nc.Subscribe("_INBOX.>", func(m *nats.Msg) {
		if strings.HasPrefix(m.Reply, "$JS.ACK.") {
			if m.Respond([]byte("-NAK")) == nil {
				naks.Add(1)
			}
		}
	})
	if err != nil {
		a.t.Fatal(err)
	}
	_ = nc.Flush()
	o := a.rollout(n, a.e.tasks(2, 2, n), 2*time.Minute)
	if !o.ok() {
		a.t.Errorf("rollout %d: %v", n, o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	redelivered := 0
	for _, c := range []string{"planner-gateway", "plan-parser", "act-dispatcher-plan"} {
		if info, err := a.ajs.Consumer(ctx, "PLAN", c); err == nil {
			redelivered += info.CachedInfo().NumRedelivered
		}
	}
	if naks.Load() > 0 {
		a.t.Errorf("the viewer sent %d -NAKs to the services' deliveries (the PLAN consumers redelivered %d)", naks.Load(), redelivered)
	}
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			a.t.Errorf("viewer: %v, want a permission violation", err)
		}
	case <-time.After(10 * time.Second):
		a.t.Errorf("the viewer's subscription to _INBOX.> was not refused")
	}
	a.violation("viewer", "_INBOX.>")
}

// fakeGateway: the viewer answers $SRV.PING.planner-gateway, so that a
// pause waits for a gateway that does not exist.
func (a *attackers) fakeGateway() {
	ping, _ := json.Marshal(map[string]any{"name": "planner-gateway", "id": "FAKE-GATEWAY", "version": "0.1.0", "metadata": map[string]string{},
		"type": "io.nats.micro.v1.ping_response"})
	stop := a.cliStart("viewer", "reply", "$SRV.PING.planner-gateway", string(ping))
	defer stop()
	// A pause waits for the gateways whose presence is recorded: the
	// viewer and the planner's own trainer record one, and say that the
	// real planner-gateways stopped.
	fake := mustMarshal(a.t, &schema.Presence{Role: schema.RolePlanner, Gateway: "FAKE-PRESENCE", AtMs: time.Now().UnixMilli()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	real, err := a.ab.PresentGateways(ctx, schema.RolePlanner)
	for _, user := range []string{"viewer", "trainer-planner"} {
		if out, err := a.cli(user, 20*time.Second, fake, "pub", "presence.planner.FAKE-PRESENCE", "--force-stdin"); err == nil {
			a.t.Errorf("%s recorded a fake planner-gateway's presence: %s", user, out)
		}
		for _, id := range real {
			gone := mustMarshal(a.t, &schema.Presence{Role: schema.RolePlanner, Gateway: id, Gone: true, AtMs: time.Now().UnixMilli()})
			if out, err := a.cli(user, 20*time.Second, gone, "pub", "presence.planner."+id, "--force-stdin"); err == nil {
				a.t.Errorf("%s said planner-gateway %s stopped: %s", user, id, out)
			}
		}
	}
	if after, aerr := a.ab.PresentGateways(ctx, schema.RolePlanner); err != nil || aerr != nil || len(real) == 0 || !slices.Equal(after, real) {
		a.t.Errorf("planner-gateways present: %v (%v) before, %v (%v) after; want the real ones, unchanged", real, err, after, aerr)
	}
	time.Sleep(500 * time.Millisecond)
	pc := a.trainer(schema.RolePlanner)
	began := time.Now()
	paused, err := pc.Pause(ctx, schema.RolePlanner, client.PauseOptions{Timeout: 10 * time.Second})
	took := time.Since(began)
	if err != nil {
		a.t.Fatal(err)
	}
	if err := pc.Resume(ctx, schema.RolePlanner, "planner-v7"); err != nil {
		a.t.Fatal(err)
	}
	if len(paused.Missing) > 0 || strings.Contains(strings.Join(paused.Drained, ","), "FAKE") || !slices.Equal(paused.Drained, real) {
		a.t.Errorf("a pause waited %v for the viewer's fake gateway: drained %v, missing %v", took.Round(100*time.Millisecond), paused.Drained, paused.Missing)
	}
	a.violation("viewer", "$SRV.PING.planner-gateway")
	a.violation("viewer", "presence.planner.FAKE-PRESENCE")
	a.violation("trainer-planner", "presence.planner.FAKE-PRESENCE")
}

// consumers: user creates count durable consumers on stream with the CLI,
// then, with nats.go, a durable one and one that pushes the stream's
// messages onto a subject of planact's (NATS checks no right of the
// creator on a deliver subject).
func (a *attackers) consumers(user, stream string, count int) {
	// Each refused creation waits out its time-out: the CLI's, the new API's
	// and the legacy push consumer's are tried at once.
	var wg sync.WaitGroup
	wg.Go(func() {
		made := 0
		for i := range count {
			out, err := a.cli(user, 20*time.Second, nil, "consumer", "add", stream, fmt.Sprintf("%s-evil-%d", strings.ReplaceAll(user, "-", ""), i), "--pull", "--defaults")
			if err == nil {
				made++
			} else if i == 0 {
				a.t.Logf("refused: %.300s", out)
				break // refused: the others would be too
			}
		}
		if made > 0 {
			a.t.Errorf("%s created %d durable consumers on %s", user, made, stream)
		}
	})
	nc, errs := a.conn(user)
	js, err := jetstream.New(nc)
	if err != nil {
		a.t.Fatal(err)
	}
	legacy, err := nc.JetStream()
	if err != nil {
		a.t.Fatal(err)
	}
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "evil-durable", AckPolicy: jetstream.AckNonePolicy}); err == nil {
			a.t.Errorf("%s created a durable consumer on %s", user, stream)
		}
	})
	wg.Go(func() {
		if _, err := legacy.AddConsumer(stream, &nats.ConsumerConfig{Durable: "evil-push", DeliverSubject: "plan.1.req.0", AckPolicy: nats.AckNonePolicy},
			nats.MaxWait(5*time.Second)); err == nil {
			a.t.Errorf("%s created a consumer on %s that pushes onto plan.1.req.0", user, stream)
		}
	})
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			a.t.Errorf("%s: %v, want a permission violation", user, err)
		}
	case <-time.After(10 * time.Second):
		a.t.Errorf("%s: the consumer's creation was not refused", user)
	}
	wg.Wait()
	a.violation(user, "$JS.API.CONSUMER.CREATE."+stream)
}

// servicesEdit: every service user tries to change a stream's
// configuration (the actor-gateway calls engine URLs trainers supply).
func (a *attackers) servicesEdit() {
	users := []string{"session-store", "planner-gateway", "plan-parser", "act-dispatcher", "actor-gateway"}
	// Every refused edit waits out the CLI's time-out: try them all at once.
	var wg sync.WaitGroup
	for _, user := range users {
		for _, stream := range []string{"ROLLOUT", "PLAN"} {
			wg.Go(func() {
				out, err := a.cli(user, 20*time.Second, nil, "stream", "edit", stream, "--description", "changed by "+user, "-f")
				if err == nil {
					a.t.Errorf("%s changed stream %s: %s", user, stream, out)
				}
			})
		}
	}
	wg.Wait()
	for _, user := range users {
		a.violation(user, "$JS.API.STREAM.UPDATE.")
	}
}

// flood: trainer-actor publishes 100 arrivals of 1 MB and a 2 MB one; it
// must be told no long before, its stream must stay in its limit, and
// neither planact's streams nor the planner's may take any of it.
func (a *attackers) flood(n int64) {
	rolloutBefore, plannerBefore := a.streamState(bus.StreamRollout), a.streamState(bus.StreamTrainer(schema.RolePlanner))
	out, err := a.cli("trainer-actor", 2*time.Minute, nil, "pub", "-J", fmt.Sprintf("rollout.%d.arrive.actor", n), "{{ Random 1000000 1000000 }}", "--count", "100")
	if err == nil {
		a.t.Errorf("trainer-actor published 100 junk arrivals of 1 MB without a refusal: %.500s", out)
	}
	a.t.Logf("refused: %.300s", out[max(0, len(out)-300):])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s, err := a.ajs.Stream(ctx, bus.StreamTrainer(schema.RoleActor)); err == nil {
		info, _ := s.Info(ctx)
		if info != nil && info.State.Bytes > uint64(info.Config.MaxBytes) {
			a.t.Errorf("%s holds %d bytes, over its limit of %d", info.Config.Name, info.State.Bytes, info.Config.MaxBytes)
		}
	}
	big := strings.Repeat("x", 2<<20)
	out, err = a.cli("trainer-actor", 30*time.Second, nil, "pub", "-J", fmt.Sprintf("rollout.%d.arrive.actor", n+1), big)
	if err == nil {
		a.t.Errorf("trainer-actor published an arrival of 2 MB: %.300s", out)
	}
	if after := a.streamState(bus.StreamRollout); after.Bytes > rolloutBefore.Bytes+1<<20 {
		a.t.Errorf("ROLLOUT grew from %d to %d bytes during the flood", rolloutBefore.Bytes, after.Bytes)
	}
	if after := a.streamState(bus.StreamTrainer(schema.RolePlanner)); after.Msgs != plannerBefore.Msgs {
		a.t.Errorf("the planner's stream changed during the actor's flood: %d -> %d messages", plannerBefore.Msgs, after.Msgs)
	}
	// The planner still arrives.
	pnc, _ := a.conn("trainer-planner")
	js, _ := jetstream.New(pnc)
	msg, _ := bus.NewMsg(context.Background(), &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: a.planner, AtMs: time.Now().UnixMilli(), Tasks: a.e.tasks(1, 1, n)})
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		a.t.Errorf("the planner cannot arrive while the actor floods its own stream: %v", err)
	}
}

// everySchedules: trainer-planner leaves a schedule that publishes every
// second after it disconnected.
func (a *attackers) everySchedules() {
	out, err := a.cli("trainer-planner", 20*time.Second, nil, "pub", fmt.Sprintf("rollout.%d.arrive.planner", 9061), "junk",
		"--schedule-every", "1s", "--schedule-dest", fmt.Sprintf("rollout.%d.cancel.planner", 9061))
	time.Sleep(2500 * time.Millisecond)
	if m := a.last(fmt.Sprintf("rollout.%d.cancel.planner", 9061)); m != nil || err == nil {
		a.t.Errorf("trainer-planner left a schedule that writes every second (%v: %s)", err, out)
	}
}

// subscriptions: trainer-actor opens 25,000 subscriptions.
func (a *attackers) subscriptions() {
	nc, errs := a.conn("trainer-actor")
	for i := range 25000 {
		if _, err := nc.Subscribe(fmt.Sprintf("rollout.%d.result.actor", i), func(*nats.Msg) {}); err != nil {
			break
		}
	}
	_ = nc.Flush()
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "maximum subscriptions") {
			a.t.Errorf("trainer-actor's 25,000 subscriptions: %v, want the account's limit", err)
		}
	case <-time.After(10 * time.Second):
		a.t.Errorf("trainer-actor holds 25,000 subscriptions")
	}
}

// rollup: trainer-actor publishes with Nats-Rollup: all on its own arrival
// subject: the stream it lands in must not lose a message.
func (a *attackers) rollup(n int64) {
	before, own := a.streamMsgs(bus.StreamRollout), a.streamMsgs(bus.StreamTrainer(schema.RoleActor))
	out, err := a.cli("trainer-actor", 20*time.Second, nil, "pub", "-J", fmt.Sprintf("rollout.%d.arrive.actor", 9025), "x", "-H", "Nats-Rollup:all")
	if after := a.streamMsgs(bus.StreamRollout); after < before || err == nil {
		a.t.Errorf("trainer-actor rolled up ROLLOUT: %d -> %d messages (%v: %s)", before, after, err, out)
	}
	if after := a.streamMsgs(bus.StreamTrainer(schema.RoleActor)); after < own {
		a.t.Errorf("trainer-actor rolled up its own stream: %d -> %d messages", own, after)
	}
	if a.last(fmt.Sprintf("rollout.%d.result.planner", n)) == nil {
		a.t.Errorf("the results of rollout %d are gone", n)
	}
}

// forgeArrival: a trainer writes only its own subjects, but what it writes
// there is its own, body and headers. trainer-actor publishes on
// rollout.<n>.arrive.actor an arrival whose body is the planner's at
// rollout n+1, with a poisoned task list and a config. The session-store
// refuses it, on the subject's rollout and role; the viewer (the web view,
// planact inspect) must take nothing of it either. It showed rollout n+1
// waiting on a planner that never arrived, with the actor's questions and
// labels and the config it made up.
func (a *attackers) forgeArrival(n int64) {
	body := fmt.Sprintf(`{"schema": "rollout.arrive/1", "rollout": %d, "role": "planner", "at_ms": %d, "weight_version": "forged",
		"engine": {"url": %q, "protocol": "sglang"}, "tasks": [{"prompt": "poisoned", "label": "x"}], "config": {"max_turns": 9}}`,
		n+1, time.Now().UnixMilli(), a.planner.URL)
	subj := fmt.Sprintf("rollout.%d.arrive.actor", n)
	if out, err := a.cli("trainer-actor", 20*time.Second, nil, "pub", subj, body, "-H", schema.HdrContentType+":"+schema.ContentTypeJSON); err != nil {
		a.t.Fatalf("trainer-actor publishes on its own subject %s: %v: %s", subj, err, out)
	}
	refusal := fmt.Sprintf("rollout.%d.result.actor.rejected", n)
	eventually(a.t, "the session-store's refusal on "+refusal, func() bool { return a.last(refusal) != nil })
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	nc, _ := a.conn("viewer")
	r, err := view.Open(ctx, nc)
	if err != nil {
		a.t.Fatal(err)
	}
	defer r.Close()
	if err := r.Synced(ctx); err != nil {
		a.t.Fatal(err)
	}
	if got, err := r.Rollout(n+1, view.Filter{}); err == nil {
		a.t.Errorf("the viewer shows rollout %d from the actor's arrival on %s: %+v", n+1, subj, got.RolloutSummary)
	}
}

// replySubjects: a client names the subject the server answers it on,
// and NATS checks no right on a reply subject. Each attacker sends what it
// may (an arrival of its own, a direct get of its own result or one of the
// viewer's) with a reply subject of planact's: the server's answer (a
// publish acknowledgement, the message read, an empty "not found") would
// be a forged result of the other role, a JetStream API request no one
// had the right to make ($JS.API.STREAM.DELETE.<stream> with an empty body
// deletes the stream), a gateway's presence. The admin watches each target
// subject on the attacker's server; the attacker's next request, answered
// by the same server-side sender on the same path, comes after the forged
// one would have, and the admin's flush then shows whether it came.
func (a *attackers) replySubjects(n int64) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	watcher := bustest.Conn(a.t, withUser(a.urls[1], "admin"))
	attacks := []struct {
		user, what  string
		subj        string // what the attacker may send
		body        []byte
		reply       string // the subject of planact's it has the answer sent to
		barrierSubj string // the same request, answered to its own inbox
	}{
		{user: "trainer-planner", what: "its arrival's acknowledgement as the actor's result",
			subj: "rollout.9026.arrive.planner", body: []byte("x"), reply: fmt.Sprintf("rollout.%d.result.actor", n),
			barrierSubj: "rollout.9026.cancel.planner"},
		{user: "trainer-actor", what: "an empty answer as a request to delete a stream",
			subj: "$JS.API.DIRECT.GET.ROLLOUT.rollout.99999.result.actor", reply: "$JS.API.STREAM.DELETE.ATTACK_WITNESS",
			barrierSubj: "$JS.API.DIRECT.GET.ROLLOUT.rollout.99998.result.actor"},
		{user: "viewer", what: "the actor's result as a planner-gateway's presence",
			subj: "$JS.API.DIRECT.GET.ROLLOUT", body: []byte(fmt.Sprintf(`{"last_by_subj":"rollout.%d.result.actor"}`, n)), reply: "presence.planner.ATTACK-REPLY",
			barrierSubj: "$JS.API.DIRECT.GET.ROLLOUT"},
	}
	for _, at := range attacks {
		got := make(chan *nats.Msg, 16)
		sub, err := watcher.ChanSubscribe(at.reply, got)
		if err != nil {
			a.t.Fatal(err)
		}
		if err := watcher.Flush(); err != nil {
			a.t.Fatal(err)
		}
		nc, _ := a.conn(at.user)
		if err := nc.PublishMsg(&nats.Msg{Subject: at.subj, Reply: at.reply, Data: at.body}); err != nil {
			a.t.Fatal(err)
		}
		if _, err := nc.RequestWithContext(ctx, at.barrierSubj, at.body); err != nil {
			a.t.Fatalf("%s: %s: %v", at.user, at.barrierSubj, err)
		}
		if err := watcher.Flush(); err != nil {
			a.t.Fatal(err)
		}
		_ = sub.Unsubscribe()
		select {
		case m := <-got:
			a.t.Errorf("%s had the server publish %s on %s (%d bytes: %.200q)", at.user, at.what, at.reply, len(m.Data), m.Data)
		default:
		}
	}
}

// connections: trainer-actor opens connections until the server refuses
// one; the session-store (reconnecting, or a new replica) and the other
// trainer must still get in. An account's max_connections is shared by
// all its users: the trainers' and the viewer's accounts are their own.
// The server holds the limit in one of two ways: it refuses a connection
// past it, or, when the other servers' counts of the account reach it
// (trainer-actor holds connections there too) and put it over, it closes
// the newest ones. CI once saw the 1,001st connection taken after one of
// the first thousand was closed so: what is checked is that no more than
// the limit stay open, and that the limit was reached.
func (a *attackers) connections() {
	const most = 1000 // max_connections of trainer-actor's account, compose/nats/accounts.conf
	var held []*nats.Conn
	defer func() {
		for _, nc := range held {
			nc.Close()
		}
	}()
	refused := false
	for range most + 100 {
		nc, err := nats.Connect(withUser(a.urls[1], "trainer-actor"), nats.NoReconnect(), nats.CustomInboxPrefix(bus.InboxPrefix("trainer-actor")))
		if err != nil {
			a.t.Logf("trainer-actor's connection %d: %v", len(held)+1, err)
			refused = true
			break
		}
		held = append(held, nc)
	}
	open := func() int {
		n := 0
		for _, nc := range held {
			if !nc.IsClosed() {
				n++
			}
		}
		return n
	}
	eventually(a.t, "trainer-actor's connections within its account's limit", func() bool { return open() <= most })
	if n := open(); !refused && n == len(held) {
		a.t.Errorf("trainer-actor holds %d connections, none refused or closed", n)
	} else {
		a.t.Logf("trainer-actor: %d connections made, %d open, refused: %v", len(held), n, refused)
	}
	for _, user := range []string{"session-store", "trainer-planner"} {
		nc, err := nats.Connect(withUser(a.urls[1], user), nats.NoReconnect(), nats.CustomInboxPrefix(bus.InboxPrefix(user)))
		if err != nil {
			a.t.Errorf("%s cannot connect while trainer-actor holds %d connections: %v", user, len(held), err)
			continue
		}
		nc.Close()
	}
}
