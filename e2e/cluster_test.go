package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/freeport"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/internal/web"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	actdispatcher "github.com/planact/planact/services/act-dispatcher"
)

// The users of compose/nats/accounts.conf, by the environment variable
// that holds their password.
var composeUsers = map[string]string{
	"session-store":   "PLANACT_PW_SESSION_STORE",
	"planner-gateway": "PLANACT_PW_PLANNER_GATEWAY",
	"plan-parser":     "PLANACT_PW_PLAN_PARSER",
	"act-dispatcher":  "PLANACT_PW_ACT_DISPATCHER",
	"actor-gateway":   "PLANACT_PW_ACTOR_GATEWAY",
	"trainer-planner": "PLANACT_PW_TRAINER_PLANNER",
	"trainer-actor":   "PLANACT_PW_TRAINER_ACTOR",
	"viewer":          "PLANACT_PW_VIEWER",
	"admin":           "PLANACT_PW_ADMIN",
	"sys":             "PLANACT_PW_SYS",
}

var composeEnvOnce sync.Once

// violations collects the permission violations a server logs.
type violations struct {
	mu    sync.Mutex
	lines []string
}

func (v *violations) log(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	if strings.Contains(s, "Violation") {
		v.mu.Lock()
		v.lines = append(v.lines, s)
		v.mu.Unlock()
	}
}
func (v *violations) Noticef(f string, a ...any) { v.log(f, a...) }
func (v *violations) Warnf(f string, a ...any)   { v.log(f, a...) }
func (v *violations) Fatalf(f string, a ...any)  { v.log(f, a...) }
func (v *violations) Errorf(f string, a ...any)  { v.log(f, a...) }
func (v *violations) Debugf(f string, a ...any)  { v.log(f, a...) }
func (v *violations) Tracef(f string, a ...any)  { v.log(f, a...) }

func (v *violations) take() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := v.lines
	v.lines = nil
	return out
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// composeCluster starts the three servers of compose/nats from their
// config files, moved to loopback ports and temporary stores, and returns
// their client URLs.
func composeCluster(t *testing.T, v *violations) []string {
	t.Helper()
	composeEnvOnce.Do(func() {
		// The same value for every test, set once for the process and
		// never unset: tests that start clusters run in parallel (which
		// t.Setenv forbids), and each reads what the others would set.
		for user, env := range composeUsers {
			if err := os.Setenv(env, "pw-"+user); err != nil {
				panic(err)
			}
		}
	})
	routes := make([]int, 3)
	for i := range routes {
		routes[i] = freePort(t)
	}
	var routeURLs []string
	for _, p := range routes {
		routeURLs = append(routeURLs, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	var servers []*server.Server
	var urls []string
	for i := range 3 {
		opts, err := server.ProcessConfigFile(filepath.Join("..", "compose", "nats", fmt.Sprintf("nats-%d.conf", i+1)))
		if err != nil {
			t.Fatalf("nats-%d.conf: %v", i+1, err)
		}
		if !opts.JetStream || opts.Cluster.Name != "planact" || len(opts.Routes) != 3 || opts.SystemAccount != "SYS" {
			t.Fatalf("nats-%d.conf: jetstream %v, cluster %q, %d routes, system account %q", i+1, opts.JetStream, opts.Cluster.Name, len(opts.Routes), opts.SystemAccount)
		}
		if opts.SyncInterval == 0 && !opts.SyncAlways {
			t.Fatalf("nats-%d.conf: no explicit sync_interval in its jetstream block (README, Durability)", i+1)
		}
		opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
		opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", routes[i]
		opts.Routes = server.RoutesFromStr(strings.Join(routeURLs, ","))
		opts.StoreDir = t.TempDir()
		opts.NoSigs = true
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("nats-%d: %v", i+1, err)
		}
		s.SetLoggerV2(v, false, false, false)
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		servers = append(servers, s)
	}
	for i, s := range servers {
		if !s.ReadyForConnections(patience) {
			t.Fatalf("nats-%d not ready", i+1)
		}
		urls = append(urls, s.ClientURL())
	}
	// JetStream needs a meta leader before anything can be provisioned.
	deadline := time.Now().Add(patience)
	ready := func() bool {
		leader := false
		for _, s := range servers {
			if !s.JetStreamIsCurrent() {
				return false
			}
			leader = leader || s.JetStreamIsLeader()
		}
		return leader
	}
	for !ready() {
		if time.Now().After(deadline) {
			t.Fatal("the cluster elected no JetStream meta leader")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return urls
}

// withUser puts user's compose credentials into a client URL.
func withUser(raw, user string) string {
	u, _ := url.Parse(raw)
	u.User = url.UserPassword(user, "pw-"+user)
	return u.String()
}

// TestComposeCluster runs planact the way compose/ deploys it: a
// three-node JetStream cluster from compose/nats, every service as its own
// user with its least-privilege permissions and R3 streams and buckets,
// each trainer as its role's user. A rollout must complete without a single
// permission violation, and every action of the forbidden list is refused.
func TestComposeCluster(t *testing.T) {
	t.Parallel()
	v := &violations{}
	urls := composeCluster(t, v)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	planner, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RolePlanner, Seed: 11, WeightVersion: "planner-v7"})
	if err != nil {
		t.Fatal(err)
	}
	actor, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RoleActor, Seed: 12, WeightVersion: "actor-v3"})
	if err != nil {
		t.Fatal(err)
	}
	serveCluster(t, ctx, urls, 0)
	t.Cleanup(func() {
		for _, line := range v.take() {
			t.Errorf("permission violation: %s", line)
		}
	})
	admin := bustest.Conn(t, withUser(urls[0], "admin"))

	trainer := func(i int, role string) *client.Client {
		nc := bustest.Conn(t, withUser(urls[i%len(urls)], "trainer-"+role))
		c, err := client.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	pc, ac := trainer(1, schema.RolePlanner), trainer(2, schema.RoleActor)
	pc.InlineTasksLimit = 256 // the batch goes through the object store, as a large one would
	const n = 5
	tasks := (&env{world: sim.DefaultWorld()}).tasks(3, 2, n)
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer rcancel()
	if err := pc.Arrive(rctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: planner, Protocol: "sglang"}, WeightVersion: "planner-v7", Tasks: tasks}); err != nil {
		t.Fatal(err)
	}
	if err := ac.Arrive(rctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: actor, Protocol: "sglang"}, WeightVersion: "actor-v3"}); err != nil {
		t.Fatal(err)
	}
	pr, err := pc.Result(rctx, n, schema.RolePlanner)
	if err != nil {
		t.Fatalf("planner result: %v (violations: %v)", err, v.take())
	}
	ar, err := ac.Result(rctx, n, schema.RoleActor)
	if err != nil {
		t.Fatalf("actor result: %v (violations: %v)", err, v.take())
	}
	if pr.SamplesObject == "" || ar.SamplesObject == "" {
		t.Errorf("results stayed inline (%q, %q): the object-store permissions go untested", pr.SamplesObject, ar.SamplesObject)
	}
	if pr.Status != schema.ResultOK || len(pr.Samples) != len(tasks) || ar.Status != schema.ResultOK || len(ar.Samples) == 0 {
		t.Errorf("planner %s with %d samples, actor %s with %d samples", pr.Status, len(pr.Samples), ar.Status, len(ar.Samples))
	}
	for _, line := range v.take() {
		t.Errorf("permission violation during the rollout: %s", line)
	}
	// A trainer pauses and resumes its own role, as its own user.
	paused, err := pc.Pause(rctx, schema.RolePlanner, client.PauseOptions{Timeout: time.Minute})
	if err != nil || len(paused.Drained) != 1 || len(paused.Missing) != 0 {
		t.Errorf("pause as trainer-planner: %+v, %v (violations %v)", paused, err, v.take())
	}
	if err := pc.Resume(rctx, schema.RolePlanner, "planner-v8"); err != nil {
		t.Errorf("resume as trainer-planner: %v", err)
	}

	// One more process started without --replicas (so, 1) must not
	// shrink them.
	if err := bus.Provision(ctx, bustest.Conn(t, withUser(urls[1], "admin")), bustest.Logger(), bus.Provisioning{Replicas: 1}); err != nil {
		t.Fatalf("provision with one replica: %v", err)
	}

	// Streams and buckets are replicated on all three servers.
	js, err := admin.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{bus.StreamRollout, bus.StreamPlan, bus.StreamAct, bus.StreamControl, bus.StreamTimeout, bus.StreamTrainer(schema.RolePlanner), bus.StreamTrainer(schema.RoleActor),
		"KV_" + bus.BucketSession, "KV_" + bus.BucketRuns, "OBJ_" + bus.ObjectTasks(schema.RolePlanner), "OBJ_" + bus.ObjectTasks(schema.RoleActor),
		"OBJ_" + bus.ObjectResults(schema.RolePlanner), "OBJ_" + bus.ObjectResults(schema.RoleActor)} {
		info, err := js.StreamInfo(name)
		if err != nil {
			t.Errorf("stream %s: %v", name, err)
			continue
		}
		if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Errorf("stream %s: %d replicas configured, cluster %+v", name, info.Config.Replicas, info.Cluster)
		}
	}

	// The web view runs as the read-only viewer user and shows the rollout;
	// so do planact inspect and planact watch.
	checkWebAsViewer(t, ctx, urls[2], n, len(tasks))
	checkCommandsAsViewer(t, urls[1], n)
	for _, line := range v.take() {
		t.Errorf("permission violation of the web view: %s", line)
	}

	checkForbidden(t, urls[0], v, n)
}

// checkWebAsViewer serves the web view as compose's viewer user and reads
// rollout n from its JSON: finished ok, with its episodes.
func checkWebAsViewer(t *testing.T, ctx context.Context, url string, n int64, episodes int) {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() {
		served <- stack.Serve(wctx, []string{web.Name}, stack.Options{Conn: bus.ConnOptions{URL: withUser(url, "viewer")}, Log: bustest.Logger(), WebAddr: addr})
	}()
	defer func() {
		stop()
		if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("web view as viewer: %v", err)
		}
	}()
	var ro struct {
		Status      string `json:"status"`
		EpisodeList []struct {
			Status string `json:"status"`
		} `json:"episode_list"`
	}
	deadline := time.Now().Add(patience)
	for {
		resp, err := http.Get(fmt.Sprintf("http://%s/api/rollouts/%d", addr, n))
		if err == nil {
			err = func() error {
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("status %s", resp.Status)
				}
				return json.NewDecoder(resp.Body).Decode(&ro)
			}()
		}
		if err == nil && ro.Status == schema.ResultOK && len(ro.EpisodeList) == episodes {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("web view as viewer: rollout %d: %+v, %v", n, ro, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkCommandsAsViewer runs planact inspect and planact watch as the
// viewer: both read without creating anything, and show rollout n ended.
func checkCommandsAsViewer(t *testing.T, url string, n int64) {
	t.Helper()
	_, path := natsCLI(t) // a PATH on which planact is this tree's build
	run := func(limit time.Duration, args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		bin := filepath.Join(filepath.SplitList(path)[0], "planact")
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "PATH="+path, "NATS_URL="+withUser(url, "viewer"))
		out, _ := cmd.CombinedOutput() // watch runs until it is stopped
		return string(out)
	}
	if out := run(patience, "inspect", fmt.Sprint(n)); !strings.Contains(out, "ok") {
		t.Errorf("planact inspect %d as viewer:\n%s", n, out)
	}
	// watch runs until it is stopped: it is stopped once it has said what
	// the test waits for (or after patience), however long it takes to
	// start and connect.
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(filepath.SplitList(path)[0], "planact"), "watch", fmt.Sprint(n))
	cmd.Env = append(os.Environ(), "PATH="+path, "NATS_URL="+withUser(url, "viewer"))
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { pw.CloseWithError(cmd.Wait()) }()
	var out strings.Builder
	for sc := bufio.NewScanner(pr); sc.Scan(); {
		out.WriteString(sc.Text() + "\n")
		if strings.Contains(out.String(), fmt.Sprintf("rollout %d", n)) && strings.Contains(out.String(), "ok") {
			cancel()
			break
		}
	}
	go io.Copy(io.Discard, pr) // until watch has exited
	if !strings.Contains(out.String(), fmt.Sprintf("rollout %d", n)) || !strings.Contains(out.String(), "ok") {
		t.Errorf("planact watch %d as viewer:\n%s", n, out.String())
	}
}

// serveCluster provisions R3 streams and buckets and starts every service as
// its compose user, each on one of the cluster's servers, with two
// act-dispatchers; it returns when they all answer. stall sets the
// act-dispatcher's watchdog (0: its default).
func serveCluster(t *testing.T, ctx context.Context, urls []string, stall time.Duration) {
	t.Helper()
	serveClusterWith(t, ctx, urls, stall, bus.Provisioning{Replicas: 3})
}

// serveClusterWith is serveCluster with provisioning p.
func serveClusterWith(t *testing.T, ctx context.Context, urls []string, stall time.Duration, p bus.Provisioning) {
	t.Helper()
	// The admin provisions, as `planact provision` does, before the
	// services start; the services' users may create nothing.
	o := stack.Options{Conn: bus.ConnOptions{URL: withUser(urls[0], "admin")}, Log: bustest.Logger(), Provisioning: p, InlineLimit: 2048}
	if err := stack.Provision(ctx, o); err != nil {
		t.Fatalf("provision: %v", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, len(stack.Services))
	for i, name := range stack.Services {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := stack.Serve(ctx, []string{name}, stack.Options{
				Conn: bus.ConnOptions{URL: withUser(urls[i%len(urls)], name)}, Log: bustest.Logger(),
				Provisioning: p,
				Replicas:     map[string]int{actdispatcher.Name: 2},
				InlineLimit:  2048, // results go through the object store too
				Stall:        stall,
			})
			if err != nil && !errors.Is(err, context.Canceled) {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("service: %v", err)
		}
	})
	waitServices(t, bustest.Conn(t, withUser(urls[0], "admin")))
}

// TestClusterRolloutsAllEnd: on a three-node cluster with R3 buckets, reads
// may be answered by a follower a moment behind. A dispatcher that read a
// run state just written, got the old value and dropped its work item left
// about one rollout in twenty waiting forever. Every decision now rests on
// a read that cannot be stale; with the watchdog out of the way (an hour),
// every rollout of a busy run ends, with every sample, once.
func TestClusterRolloutsAllEnd(t *testing.T) {
	t.Parallel()
	v := &violations{}
	urls := composeCluster(t, v)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	planner, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RolePlanner, Seed: 13, WeightVersion: "planner-v7"})
	if err != nil {
		t.Fatal(err)
	}
	actor, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RoleActor, Seed: 14, WeightVersion: "actor-v3"})
	if err != nil {
		t.Fatal(err)
	}
	serveCluster(t, ctx, urls, time.Hour)
	trainer := func(i int, role string) *client.Client {
		c, err := client.New(bustest.Conn(t, withUser(urls[i%len(urls)], "trainer-"+role)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	e := &env{planner: schema.Engine{URL: planner}, actor: schema.Engine{URL: actor}, world: sim.DefaultWorld()}
	const rollouts, inFlight = 24, 6
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	outs := make([]outcome, rollouts)
	for i := range rollouts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			n := int64(100 + i)
			outs[i] = e.rollout(t, trainer(i, schema.RolePlanner), trainer(i+1, schema.RoleActor), n, e.tasks(2, 2, n), nil, i%2 == 0)
		}()
	}
	wg.Wait()
	for i, o := range outs {
		if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK || len(o.planner.Samples) != 4 {
			t.Errorf("rollout %d: planner %v, actor %v, %d planner samples", 100+i, o.perr, o.aerr, len(o.planner.Samples))
			continue
		}
		seen := map[string]bool{}
		for _, s := range o.actor.Samples {
			k := s.RolloutID + "/" + fmt.Sprint(s.Metadata["key"])
			if seen[k] {
				t.Errorf("rollout %d: act %s sampled twice", 100+i, k)
			}
			seen[k] = true
		}
		if len(seen) != o.actor.Stats.Acts {
			t.Errorf("rollout %d: %d actor samples for %d acts", 100+i, len(seen), o.actor.Stats.Acts)
		}
	}
	for _, line := range v.take() {
		t.Errorf("permission violation: %s", line)
	}
}

// checkForbidden tries, as each user, actions its permissions must refuse,
// and shows each refused: by the server's error (publish and subscribe
// violations) or by no answer (a request whose subject is denied).
func checkForbidden(t *testing.T, url string, v *violations, n int64) {
	t.Helper()
	type action struct {
		user, what string
		publish    string // a publish that must be a violation
		request    string // a JetStream API request that must get no answer
		subscribe  string // a subscription that must be a violation
	}
	r := func(s string) string { return strings.ReplaceAll(s, "N", fmt.Sprint(n)) }
	actions := []action{
		{user: "trainer-planner", what: "publish an act's outcome", publish: r("act.N.done.0.t9-X")},
		{user: "trainer-planner", what: "arrive as the actor", publish: r("rollout.N.arrive.actor")},
		{user: "trainer-planner", what: "cancel as the actor", publish: r("rollout.N.cancel.actor")},
		{user: "trainer-planner", what: "pause the actor", publish: "control.actor.pause"},
		{user: "trainer-planner", what: "say a gateway drained", publish: "control.planner.drained.x"},
		{user: "trainer-planner", what: "forge a refusal of its own pause", publish: "control.planner.refused"},
		{user: "trainer-planner", what: "forge the answer to a resume", publish: "control.actor.resumed"},
		{user: "trainer-planner", what: "follow the actor's refusals", subscribe: "control.actor.refused"},
		{user: "trainer-actor", what: "read the planner's refusals", request: "$JS.API.DIRECT.GET.CONTROL.control.planner.refused"},
		{user: "trainer-planner", what: "say a gateway runs", publish: "presence.planner.x"},
		{user: "trainer-actor", what: "say a gateway stopped", publish: "presence.actor.x"},
		{user: "viewer", what: "say a gateway runs", publish: "presence.planner.x"},
		{user: "actor-gateway", what: "say a planner-gateway runs", publish: "presence.planner.x"},
		{user: "planner-gateway", what: "say an actor-gateway stopped", publish: "presence.actor.x"},
		{user: "session-store", what: "say a gateway runs", publish: "presence.actor.x"},
		{user: "trainer-planner", what: "read the actor's result", request: r("$JS.API.DIRECT.GET.ROLLOUT.rollout.N.result.actor")},
		{user: "trainer-planner", what: "subscribe to the actor's results", subscribe: "rollout.*.result.actor"},
		{user: "trainer-planner", what: "open the actor's result objects", request: "$JS.API.STREAM.INFO.OBJ_results_actor"},
		{user: "trainer-planner", what: "read the actor's result objects", request: "$JS.API.DIRECT.GET.OBJ_results_actor.$O.results_actor.M.x"},
		{user: "trainer-actor", what: "read the planner's result", request: r("$JS.API.DIRECT.GET.ROLLOUT.rollout.N.result.planner")},
		{user: "trainer-actor", what: "arrive as the planner", publish: r("rollout.N.arrive.planner")},
		{user: "trainer-actor", what: "read the sessions bucket", request: r("$JS.API.DIRECT.GET.KV_sessions.$KV.sessions.N")},
		{user: "trainer-actor", what: "follow the ROLLOUT stream with a consumer", request: "$JS.API.CONSUMER.CREATE.ROLLOUT"},
		{user: "trainer-actor", what: "publish a result", publish: r("rollout.N.result.actor")},
		{user: "act-dispatcher", what: "delete a bucket", request: "$JS.API.STREAM.DELETE.KV_runs"},
		{user: "act-dispatcher", what: "delete a stream", request: "$JS.API.STREAM.DELETE.ACT"},
		{user: "act-dispatcher", what: "purge the history", request: "$JS.API.STREAM.PURGE.ACT"},
		{user: "actor-gateway", what: "publish a plan", publish: r("plan.N.dag.0")},
		{user: "actor-gateway", what: "write a run state", publish: r("$KV.runs.N.0.1")},
		{user: "plan-parser", what: "publish an act's outcome", publish: r("act.N.done.0.t1-s1")},
		{user: "planner-gateway", what: "publish a result", publish: r("rollout.N.result.planner")},
		{user: "planner-gateway", what: "write a session", publish: r("$KV.sessions.N")},
		{user: "session-store", what: "publish an act's outcome", publish: r("act.N.done.0.t1-s1")},
		{user: "viewer", what: "arrive as a trainer", publish: r("rollout.N.arrive.planner")},
		{user: "viewer", what: "publish a plan", publish: r("plan.N.dag.0")},
		{user: "viewer", what: "write a run state", publish: r("$KV.runs.N.0.1")},
		{user: "viewer", what: "create a stream", request: "$JS.API.STREAM.CREATE.ROLLOUT"},
		{user: "viewer", what: "delete a stream", request: "$JS.API.STREAM.DELETE.PLAN"},
		{user: "viewer", what: "read the sessions bucket", request: r("$JS.API.DIRECT.GET.KV_sessions.$KV.sessions.N")},
		{user: "viewer", what: "read a result's samples", request: "$JS.API.STREAM.INFO.OBJ_results_planner"},
		{user: "viewer", what: "take work from a service's consumer", request: "$JS.API.CONSUMER.MSG.NEXT.PLAN.plan-parser"},
		{user: "viewer", what: "delete a service's consumer", request: "$JS.API.CONSUMER.DELETE.PLAN.act-dispatcher-plan"},
		{user: "viewer", what: "change a service's consumer", request: "$JS.API.CONSUMER.CREATE.ROLLOUT.session-store"},
		{user: "viewer", what: "create a consumer of its own", request: "$JS.API.CONSUMER.CREATE.PLAN.mine"},
		{user: "viewer", what: "read everyone's inboxes", subscribe: "_INBOX.>"},
		{user: "viewer", what: "answer for a gateway", subscribe: "$SRV.PING.planner-gateway"},
		{user: "trainer-planner", what: "read everyone's inboxes", subscribe: "_INBOX.>"},
		{user: "trainer-planner", what: "read the actor's inboxes", subscribe: "_INBOX_trainer-actor.>"},
		{user: "trainer-planner", what: "read the actor's result objects chunk by chunk", request: "$JS.API.STREAM.MSG.GET.OBJ_results_actor"},
		{user: "trainer-planner", what: "write the actor's task lists", publish: "$O.tasks_actor.M.x"},
		{user: "trainer-planner", what: "purge its own task lists", request: "$JS.API.STREAM.PURGE.OBJ_tasks_planner"},
		{user: "trainer-planner", what: "create a consumer on its results", request: "$JS.API.CONSUMER.CREATE.OBJ_results_planner.mine"},
		{user: "trainer-actor", what: "read the planner's task lists", request: "$JS.API.STREAM.MSG.GET.OBJ_tasks_planner"},
		{user: "trainer-actor", what: "fire a time-out", publish: r("rollout.N.timeout.rollout")},
		{user: "trainer-actor", what: "schedule into the time-outs", publish: r("rollout.N.schedule.rollout")},
		{user: "actor-gateway", what: "change a stream", request: "$JS.API.STREAM.UPDATE.ROLLOUT"},
		{user: "actor-gateway", what: "answer for the planner-gateway", subscribe: "$SRV.PING.planner-gateway"},
		{user: "plan-parser", what: "create a stream", request: "$JS.API.STREAM.CREATE.EVIL"},
		{user: "plan-parser", what: "change its durable consumer", request: "$JS.API.CONSUMER.CREATE.PLAN.plan-parser"},
		{user: "session-store", what: "purge a stream of planact's history", request: "$JS.API.STREAM.PURGE.ROLLOUT"},
		{user: "session-store", what: "read another's inboxes", subscribe: "_INBOX_act-dispatcher.>"},
	}
	// Every action is tried at once, each on its own connection (a refused
	// request shows only as a second without an answer), then reported
	// as its own subtest.
	problems := make([][]string, len(actions))
	var wg sync.WaitGroup
	for i, a := range actions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			problems[i] = tryForbidden(url, a.user, a.publish, a.request, a.subscribe)
		}()
	}
	wg.Wait()
	for i, a := range actions {
		t.Run(a.user+" may not "+a.what, func(t *testing.T) {
			for _, p := range problems[i] {
				t.Errorf("%s: %s", a.what, p)
			}
		})
	}
	// The refused actions, and only those, are in the server's log.
	for _, line := range v.take() {
		ok := false
		for _, a := range actions {
			ok = ok || strings.Contains(line, "user:"+a.user)
		}
		if !ok {
			t.Errorf("permission violation: %s", line)
		}
	}
}

// tryForbidden does, as user, one of a publish, a JetStream API request or
// a subscription that its permissions must refuse, and says what was not
// refused as it must be.
func tryForbidden(url, user, publish, request, subscribe string) (problems []string) {
	denied := make(chan error, 4)
	nc, err := bustest.Connect(withUser(url, user), nats.CustomInboxPrefix(bus.InboxPrefix(user)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case denied <- err:
			default:
			}
		}))
	if err != nil {
		return []string{err.Error()}
	}
	defer nc.Close()
	switch {
	case publish != "":
		if err := nc.Publish(publish, []byte("x")); err != nil {
			return []string{err.Error()}
		}
	case subscribe != "":
		if _, err := nc.SubscribeSync(subscribe); err != nil {
			return []string{err.Error()}
		}
	case request != "":
		if _, err := nc.Request(request, []byte("{}"), time.Second); err == nil {
			return []string{request + " was answered"}
		}
	}
	_ = nc.Flush()
	select {
	case err := <-denied:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			return []string{fmt.Sprintf("%v, want a permission violation", err)}
		}
	case <-time.After(patience):
		return []string{"no permission violation"}
	}
	return nil
}
