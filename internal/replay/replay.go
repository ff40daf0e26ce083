package replay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/schema"
)

// Options tune a replay.
type Options struct {
	// Episodes to replay; nil replays the whole rollout. A subset runs as a
	// rollout of those tasks alone (their groups are not whole, so group
	// streaming and filters are left out) and compares those episodes.
	Episodes []int
	// Timeout bounds the replay's rollout; default ten minutes.
	Timeout time.Duration
	Log     zerolog.Logger
}

// Report is what a replay found.
type Report struct {
	Rollout  int64
	Episodes []int // the recording's episodes replayed
	// Differences between the recording and the replay, in order: none
	// means today's planact did exactly what the recording did.
	Differences []Difference
	// Notes are what the recorded engine could not answer from the
	// recording as it was asked (today's planact asked something else),
	// and recorded calls it never asked for.
	Notes []string
	// Replayed is the replay's own recording, as its streams hold it.
	Replayed *Recording
}

// Run replays rec: it starts an embedded NATS server (in a temporary
// directory) and today's services on it, with rec's engines played by a
// recorded engine (player.go), has both trainers arrive as they did (with
// the recorded engine in place of theirs, and HTTP tools and a reward
// server pointed at it), waits for both results, reads the replay from its
// streams as Record reads any rollout, and compares it with rec.
func Run(ctx context.Context, rec *Recording, o Options) (*Report, error) {
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Minute
	}
	want, toRecorded, err := subset(rec, o.Episodes)
	if err != nil {
		return nil, err
	}
	eng, err := newEngine(want, toRecorded)
	if err != nil {
		return nil, err
	}
	defer eng.close()
	srv, err := embedded.Start(embedded.Options{Port: -1, Name: "planact-replay"})
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	conn := bus.ConnOptions{URL: srv.ClientURL()}

	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() {
		// Retries are quick (the recorded engine answers at once); what
		// they decide is the same.
		// The replay provisions in process, as `planact up` does (the
		// embedded server has no users), with what its disk offers.
		so := stack.Options{Provision: true, Conn: conn, Log: o.Log, ActRetryBase: 10 * time.Millisecond}
		so.Provisioning.Storage = min(bus.DefaultStorage, srv.Storage()/10*9)
		served <- stack.Serve(sctx, stack.Services, so)
	}()
	defer func() {
		stop()
		if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
			o.Log.Warn().Err(err).Msg("replay services")
		}
	}()
	if err := stack.WaitReady(ctx, conn, stack.Services); err != nil {
		return nil, fmt.Errorf("replay: services: %w", err)
	}
	nc, err := conn.Dial("planact-replay")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		return nil, err
	}
	if err := arriveBoth(ctx, c, want, eng.url, len(o.Episodes) > 0); err != nil {
		return nil, err
	}
	got, err := Record(ctx, nc, rec.Rollout)
	if err != nil {
		return nil, fmt.Errorf("replay: reading what it did: %w", err)
	}
	got.renumber(toRecorded)
	r := &Report{Rollout: rec.Rollout, Replayed: got, Notes: eng.Notes()}
	for _, ep := range want.Episodes {
		r.Episodes = append(r.Episodes, ep.Episode)
	}
	r.Differences = Compare(want, got, len(o.Episodes) == 0)
	return r, nil
}

// subset is rec restricted to episodes (all when nil), and the map from
// the replay's episodes (its tasks' indexes) to the recording's.
func subset(rec *Recording, episodes []int) (*Recording, map[int]int, error) {
	toRecorded := map[int]int{}
	if episodes == nil {
		for e := range rec.Tasks {
			toRecorded[e] = e
		}
		return rec, toRecorded, nil
	}
	sub := *rec
	sub.Tasks, sub.Episodes = nil, nil
	for i, e := range episodes {
		ep := rec.Episode(e)
		if ep == nil || e >= len(rec.Tasks) {
			return nil, nil, fmt.Errorf("replay: rollout %d has no episode %d (it has %d)", rec.Rollout, e, len(rec.Tasks))
		}
		toRecorded[i] = e
		sub.Tasks = append(sub.Tasks, rec.Tasks[e])
		sub.Episodes = append(sub.Episodes, ep)
	}
	return &sub, toRecorded, nil
}

// renumber gives a replay of a subset of episodes the recording's episode
// numbers, in its episodes, acts and samples.
func (r *Recording) renumber(toRecorded map[int]int) {
	id := func(e int) string { return fmt.Sprintf("%d-%d", r.Rollout, e) }
	ids := map[string]string{}
	for from, to := range toRecorded {
		ids[id(from)] = id(to)
	}
	for _, ep := range r.Episodes {
		to := toRecorded[ep.Episode]
		ep.Episode = to
		for i := range ep.Acts {
			ep.Acts[i].Episode = to
		}
		if ep.End != nil {
			ep.End.Episode = to
		}
	}
	for _, res := range r.Results {
		for i := range res.Samples {
			s := &res.Samples[i]
			s.RolloutID = ids[s.RolloutID]
			if _, ok := s.Metadata["episode"]; ok {
				if e, ok := s.Metadata["episode"].(float64); ok {
					s.Metadata["episode"] = float64(toRecorded[int(e)])
				}
			}
		}
		for i := range res.Tasks {
			res.Tasks[i].Episode = toRecorded[res.Tasks[i].Episode]
		}
		for i := range res.Episodes {
			res.Episodes[i].Episode = toRecorded[res.Episodes[i].Episode]
		}
	}
}

// arriveBoth has both trainers arrive as they did in rec, with the
// recorded engine as their engine (and the HTTP tools' and the reward
// server's URLs pointed at it), and waits for both results.
func arriveBoth(ctx context.Context, c *client.Client, rec *Recording, engineURL string, partial bool) error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, role := range []string{schema.RolePlanner, schema.RoleActor} {
		a := *rec.Arrivals[role]
		a.Engine = schema.Engine{URL: engineURL + "/" + role, Protocol: "sglang"}
		a.AtMs, a.Attempt = 0, ""
		if role == rec.TasksFrom {
			a.Tasks = rec.Tasks
		}
		if a.Config != nil {
			cfg := *a.Config
			cfg.Tools = slices.Clone(cfg.Tools)
			for i := range cfg.Tools {
				if cfg.Tools[i].Kind == schema.ToolHTTP {
					cfg.Tools[i].URL = engineURL + "/tool/" + cfg.Tools[i].Name
				}
			}
			if cfg.Reward != "" && cfg.Reward != "f1" && cfg.Reward != "em" {
				cfg.Reward = engineURL + "/reward"
			}
			if partial {
				// Not whole groups: nothing to stream or filter.
				cfg.StreamGroups, cfg.GroupFilter, cfg.TargetGroups = false, "", 0
			}
			a.Config = &cfg
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Rollout(ctx, &a, 0); err != nil && !errors.Is(err, client.ErrFailed) {
				// A failed result is a result: compared like any other.
				errs[i] = fmt.Errorf("replay: the %s's rollout: %w", role, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
