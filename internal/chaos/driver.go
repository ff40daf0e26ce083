package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// DriverOptions say how the trainers play.
type DriverOptions struct {
	Planner, Actor *nats.Conn // one connection per training job
	PlannerEngine  schema.Engine
	ActorEngine    schema.Engine
	// EngineSeeds are the simulated engines' seeds per role: each sample
	// is held against what its engine generates (SampleProblems).
	EngineSeeds  map[string]int64
	FirstRollout int64
	Rollouts     int // at least this many; more while Until is open
	// Concurrency is how many rollouts are in flight at once, not counting
	// those that have run longer than StuckAfter (default 90s): a hung
	// rollout must not stop the load that the next faults need. All in
	// all at most 4×Concurrency are in flight.
	Concurrency      int
	StuckAfter       time.Duration
	Tasks, PerPrompt int // distinct tasks per rollout, copies of each
	Seed             int64
	Config           schema.Config // sent with the planner's arrival
	// Wait is how long each trainer waits for its result: the rollout's
	// deadline (Config.RolloutTimeoutS) plus a grace for planact to say so.
	Wait time.Duration
	// Until, when set, keeps the driver starting rollouts (beyond Rollouts)
	// until it is closed.
	Until <-chan struct{}
	// Done is called with every finished rollout, from the driver's goroutines.
	Done func(RolloutRecord)
}

// RolloutRecord is what the trainers saw of one rollout.
type RolloutRecord struct {
	Rollout  int64       `json:"rollout"`
	Episodes int         `json:"episodes"`
	Started  time.Time   `json:"started"`
	Ended    time.Time   `json:"ended"`
	Planner  RoleOutcome `json:"planner"`
	Actor    RoleOutcome `json:"actor"`
}

// RoleOutcome is one trainer's result, reduced to what the ledger checks.
type RoleOutcome struct {
	Status string `json:"status,omitempty"` // "" when no result came
	Reason string `json:"reason,omitempty"` // the result's
	Err    string `json:"err,omitempty"`
	Hung   bool   `json:"hung,omitempty"` // no result by the trainer's deadline
	// ClientErrors are the errors with which pkg/client gave up waiting
	// before the deadline; the trainer tried again after each.
	ClientErrors []string `json:"client_errors,omitempty"`
	// Samples are the samples' identities: "episode" for the planner,
	// "episode/turn/node" for the actor, in the order they came (a
	// duplicate shows up twice).
	Samples []string `json:"-"`
	// BadSamples say what is wrong with each sample that is not token-exact
	// or not what its engine generated (SampleProblems).
	BadSamples []string `json:"bad_samples,omitempty"`
	// Claims are the counts the result gives of itself (ClaimsOf), held
	// against what it holds and what ran; nil when no result came.
	Claims *ResultClaims `json:"-"`
}

// Drive plays both trainers until Rollouts have been started (and Until is
// closed, when set), then waits for the rollouts in flight. It returns the
// number of rollouts started.
func Drive(ctx context.Context, o DriverOptions) (int, error) {
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		if _, ok := o.EngineSeeds[role]; !ok {
			return 0, fmt.Errorf("drive: no engine seed of the %s: its samples could not be checked", role)
		}
	}
	pc, err := client.New(o.Planner)
	if err != nil {
		return 0, err
	}
	ac, err := client.New(o.Actor)
	if err != nil {
		return 0, err
	}
	world := sim.DefaultWorld()
	conc := max(o.Concurrency, 1)
	stuckAfter := o.StuckAfter
	if stuckAfter <= 0 {
		stuckAfter = 90 * time.Second
	}
	slots, all := make(chan struct{}, conc), make(chan struct{}, 4*conc)
	var wg sync.WaitGroup
	started := 0
	more := func() bool {
		if ctx.Err() != nil {
			return false
		}
		if started < o.Rollouts {
			return true
		}
		if o.Until == nil {
			return false
		}
		select {
		case <-o.Until:
			return false
		default:
			return true
		}
	}
	until := o.Until // nil once seen closed
	acquire := func(ch chan struct{}) bool {
		for {
			select {
			case ch <- struct{}{}:
				return true
			case <-ctx.Done():
				return false
			case <-until:
				until = nil
				if !more() {
					return false
				}
			case <-time.After(time.Second):
				if !more() {
					return false
				}
			}
		}
	}
	for more() {
		if !acquire(all) {
			break
		}
		if !acquire(slots) {
			<-all
			break
		}
		n := o.FirstRollout + int64(started)
		tasks := demo.Tasks(world, o.Tasks, o.PerPrompt, o.Seed+int64(started), "")
		started++
		wg.Add(1)
		go func() {
			defer func() { <-all; wg.Done() }()
			var once sync.Once
			free := func() { once.Do(func() { <-slots }) }
			stuck := time.AfterFunc(stuckAfter, free)
			defer func() { stuck.Stop(); free() }()
			rec := playRollout(ctx, pc, ac, n, tasks, o)
			if o.Done != nil {
				o.Done(rec)
			}
		}()
	}
	wg.Wait()
	return started, ctx.Err()
}

// playRollout has both jobs arrive for rollout n and wait for their results.
func playRollout(ctx context.Context, pc, ac *client.Client, n int64, tasks []schema.Task, o DriverOptions) RolloutRecord {
	rec := RolloutRecord{Rollout: n, Episodes: len(tasks), Started: time.Now()}
	ctx, cancel := context.WithDeadline(ctx, rec.Started.Add(o.Wait))
	defer cancel()
	cfg := o.Config
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		rec.Planner = play(ctx, pc, &schema.Arrive{
			Rollout: n, Role: schema.RolePlanner, Engine: o.PlannerEngine, WeightVersion: "planner-chaos",
			Tasks: tasks, Config: &cfg,
		}, o.EngineSeeds[schema.RolePlanner])
	}()
	go func() {
		defer wg.Done()
		rec.Actor = play(ctx, ac, &schema.Arrive{
			Rollout: n, Role: schema.RoleActor, Engine: o.ActorEngine, WeightVersion: "actor-chaos",
		}, o.EngineSeeds[schema.RoleActor])
	}()
	wg.Wait()
	rec.Ended = time.Now()
	return rec
}

// play is one trainer in one rollout: it arrives and waits for its result
// until ctx's deadline. Where the client gives up early (an error that is
// no result and no time-out), it is noted and the trainer tries again, as
// a careful training job would: the ledger judges planact's services, and
// the client's errors are reported on their own.
func play(ctx context.Context, c *client.Client, a *schema.Arrive, seed int64) RoleOutcome {
	var clientErrs []string
	again := func(err error) bool {
		clientErrs = append(clientErrs, err.Error())
		select {
		case <-ctx.Done():
			return false
		case <-time.After(500 * time.Millisecond):
			return true
		}
	}
	for {
		err := c.Arrive(ctx, a)
		if err == nil {
			break
		}
		if errors.Is(err, client.ErrRejected) || !again(err) {
			o := outcome(nil, err, a.Role, 0)
			o.ClientErrors = clientErrs
			return o
		}
	}
	for {
		res, err := c.Result(ctx, a.Rollout, a.Role)
		if res != nil || err == nil || errors.Is(err, client.ErrTimeout) || !again(err) {
			o := outcome(res, err, a.Role, seed)
			o.ClientErrors = clientErrs
			return o
		}
	}
}

// outcome reduces a result to what the ledger checks; seed is the seed of
// the role's simulated engine.
func outcome(res *schema.Result, err error, role string, seed int64) RoleOutcome {
	var o RoleOutcome
	if err != nil {
		o.Err = err.Error()
	}
	if res == nil {
		o.Hung = errors.Is(err, client.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)
		return o
	}
	o.Status, o.Reason, o.Claims = res.Status, res.Reason, ClaimsOf(res)
	for _, s := range res.Samples {
		o.BadSamples = append(o.BadSamples, SampleProblems(s, seed)...)
		if role == schema.RolePlanner {
			o.Samples = append(o.Samples, fmt.Sprint(metaInt(s.Metadata["episode"])))
			continue
		}
		node, _ := s.Metadata["node"].(string)
		o.Samples = append(o.Samples, ActID(metaInt(s.Metadata["episode"]), metaInt(s.Metadata["turn"]), node))
	}
	return o
}

// metaInt reads an integer from decoded sample metadata; -1 when it is none.
func metaInt(v any) int {
	if n, ok := schema.MetaInt(v); ok {
		return n
	}
	return -1
}
