package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/planact/planact/pkg/schema"
)

// Throughput is figure 4 (and 8) at one plan width.
type Throughput struct {
	Width              int     `json:"width"`
	Rollouts           int     `json:"rollouts"`
	EpisodesPerRollout int     `json:"episodes_per_rollout"`
	RolloutsInFlight   int     `json:"rollouts_in_flight"`
	Episodes           int     `json:"episodes"`
	Acts               int     `json:"acts"`
	WallSeconds        float64 `json:"wall_s"`
	ActsPerS           float64 `json:"acts_per_s"`
	RatioToRaw         float64 `json:"ratio_to_publish_consume"`
	// CoresBusy is the process's CPU time over the wall time: near the
	// machine's cores, the run was bound by CPU, not by the client.
	CoresBusy float64 `json:"cores_busy"`
	PerAct    PerAct  `json:"per_act"`
}

// Dist is a distribution of milliseconds.
type Dist struct {
	N     int     `json:"n"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	Mean  float64 `json:"mean_ms"`
	Ratio float64 `json:"p50_ratio_to_request_reply"`
}

func dist(v []float64, rr float64) Dist {
	if len(v) == 0 {
		return Dist{} // and check says a figure is missing
	}
	d := Dist{N: len(v), P50: percentile(v, 50), P99: percentile(v, 99), Mean: mean(v)}
	if rr > 0 {
		d.Ratio = d.P50 / rr
	}
	return d
}

// Light is figure 5 at one plan width: one episode in flight at a time.
type Light struct {
	Width    int  `json:"width"`
	Rollouts int  `json:"rollouts"`
	PerAct   Dist `json:"added_per_act"`
	PerTurn  Dist `json:"added_per_turn"`
	// PerTurn split: turns that released acts (plan.out → next plan.req)
	// and turns that ended the episode (plan.out → rollout.N.end.E).
	PerActingTurn Dist `json:"added_per_turn_with_acts"`
	PerFinalTurn  Dist `json:"added_per_final_turn"`
	// Engine latencies at full precision (planact_engine_request_seconds):
	// latency_ms in act.done and plan.out is whole milliseconds, so an
	// engine faster than 1 ms counts in full as added latency.
	ActorEngineMeanMs   float64 `json:"actor_engine_mean_ms"`
	PlannerEngineMeanMs float64 `json:"planner_engine_mean_ms"`
	// PerActLessEngineP50 is PerAct.P50 less what latency_ms left out of
	// the actor engine's time, at its mean: ActorEngineMeanMs − the mean
	// latency_ms of the same acts.
	PerActLessEngineP50 float64 `json:"added_per_act_p50_less_sub_ms_engine_time"`
}

// Eager is figure 7 at one load.
type Eager struct {
	InFlight       int     `json:"episodes_in_flight"`
	Episodes       int     `json:"episodes"`
	Acts           int     `json:"acts"`
	MeanRatio      float64 `json:"mean_makespan_over_critical_path"`
	P95Ratio       float64 `json:"p95_makespan_over_critical_path"`
	MeanMakespanMs float64 `json:"mean_makespan_ms"`
	MeanCriticalMs float64 `json:"mean_critical_path_ms"`
}

// Report is everything one run measured.
type Report struct {
	Machine    Machine      `json:"machine"`
	Setup      string       `json:"setup"`
	Options    options      `json:"options"`
	Engines    string       `json:"engines"`
	Baselines  *Baselines   `json:"baselines"`
	Throughput []Throughput `json:"throughput"`
	Light      []Light      `json:"light_load"`
	Barrier    Dist         `json:"barrier"`
	Eager      []Eager      `json:"eager"`
	Goals      []Goal       `json:"goals"`
	Notes      []string     `json:"notes"`
	Seconds    float64      `json:"run_s"`
}

func run(ctx context.Context, o options, log io.Writer) (*Report, error) {
	p := &progress{w: log, start: time.Now()}
	rep := &Report{Options: o, Machine: describeMachine()}
	s, err := startServers(o.Cluster)
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	defer s.stop()
	rep.Setup = s.describe(o.InProcess)
	p.say("servers up: %s", rep.Setup)

	if rep.Baselines, err = runBaselines(ctx, o, s, p); err != nil {
		return nil, err
	}

	pa, err := startPlanact(ctx, o, s)
	if err != nil {
		return nil, err
	}
	// A service that failed stops the run: its error comes with what the
	// run was doing.
	if err := errors.Join(measurePlanact(o, s, pa, rep, p), pa.stop()); err != nil {
		return nil, err
	}
	rep.Machine.LoadAfter = firstLine("/proc/loadavg")
	rep.Seconds = time.Since(p.start).Seconds()
	rep.evaluate()
	return rep, rep.check()
}

func measurePlanact(o options, s *servers, pa *planact, rep *Report, p *progress) error {
	ctx := pa.ctx
	nc, js, err := dial(s.serviceURL, "overhead-reader")
	if err != nil {
		return err
	}
	defer nc.Close()
	pa.dump = func(n int64) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := dumpRollout(ctx, js, p.w, n); err != nil {
			p.say("rollout %d: cannot read its messages: %v", n, err)
		}
	}
	rep.Engines = fmt.Sprintf("simulated, over HTTP: throughput and light load with zero latency (TTFT 0, per token 0, jitter 0), planner plans of PlanWidth independent lookups; eager: planner TTFT %v + %v/token, actor TTFT %v, jitter 0, the world's questions planned whole (PlannerStepwise 0)",
		o.PlannerTTFT, o.PlannerPerToken, o.ActorTTFT)
	cfg := schema.DefaultConfig()
	// A plan of 28 lookups is about 1.5 kB, and the simulated planner's
	// tokens are bytes: the default 1024 new tokens would cut it short.
	cfg.PlannerSampling.MaxNewTokens = 4096
	oneTask := func(n int64) []schema.Task { return worldTasks(1, 1, n) }
	rr := rep.Baselines.Requests.P50Ms

	// 5, 6: light load, one episode at a time; every rollout also times the barrier.
	var barriers []float64
	for _, w := range o.LightWidths {
		before, err := takeSnapshot(ctx, js, s)
		if err != nil {
			return err
		}
		b, err := pa.runBatch(o.LightRollouts, 1, pa.engines.wide[w], pa.engines.actor, oneTask, cfg)
		if err != nil {
			return fmt.Errorf("light load, width %d: %w", w, err)
		}
		after, err := takeSnapshot(ctx, js, s)
		if err != nil {
			return err
		}
		tr, err := readTraces(ctx, js, before.streams, b.first, b.last)
		if err != nil {
			return err
		}
		all, acting, final := tr.addedPerTurn()
		l := Light{Width: w, Rollouts: len(b.results), PerAct: dist(tr.addedPerAct(), rr),
			PerTurn: dist(all, rr), PerActingTurn: dist(acting, rr), PerFinalTurn: dist(final, rr),
			ActorEngineMeanMs: meanEngineMs(before, after, schema.RoleActor), PlannerEngineMeanMs: meanEngineMs(before, after, schema.RolePlanner)}
		l.PerActLessEngineP50 = l.PerAct.P50 - (l.ActorEngineMeanMs - tr.meanActEngineMs())
		// Every episode plans its lookups in turn 1 and answers in turn 2:
		// anything else means the streams were not read whole.
		if n := len(b.results); l.PerAct.N != n*w || l.PerActingTurn.N != n || l.PerFinalTurn.N != n {
			return fmt.Errorf("light load, width %d: the streams hold %d acts, %d turns with acts and %d answering turns of %d one-episode rollouts: want %d, %d and %d",
				w, l.PerAct.N, l.PerActingTurn.N, l.PerFinalTurn.N, n, n*w, n, n)
		}
		rep.Light = append(rep.Light, l)
		bs := tr.barriers(b.acks)
		if len(bs) != len(b.results) {
			return fmt.Errorf("light load, width %d: %d rollout.N.start of %d rollouts found in the ROLLOUT stream", w, len(bs), len(b.results))
		}
		barriers = append(barriers, bs...)
		p.say("light load, width %d: %d rollouts; added per act p50 %.3f ms p99 %.3f ms; per turn p50 %.3f ms p99 %.3f ms",
			w, l.Rollouts, l.PerAct.P50, l.PerAct.P99, l.PerTurn.P50, l.PerTurn.P99)
	}
	rep.Barrier = dist(barriers, rr)
	if rep.Barrier.N == 0 {
		return errors.New("barrier: no rollout.N.start found in the ROLLOUT stream")
	}
	p.say("barrier: %d rollouts, p50 %.3f ms, p99 %.3f ms", rep.Barrier.N, rep.Barrier.P50, rep.Barrier.P99)

	// 4, 8: throughput at every width, many episodes in flight.
	for _, w := range o.Widths {
		rollouts := max(o.MinRollouts, (o.ActsPerRun+o.Episodes*w-1)/(o.Episodes*w))
		tasks := func(n int64) []schema.Task { return worldTasks(o.Episodes, 4, n) }
		before, err := takeSnapshot(ctx, js, s)
		if err != nil {
			return err
		}
		b, err := pa.runBatch(rollouts, o.Concurrent, pa.engines.wide[w], pa.engines.actor, tasks, cfg)
		if err != nil {
			return fmt.Errorf("throughput, width %d: %w", w, err)
		}
		after, err := takeSnapshot(ctx, js, s)
		if err != nil {
			return err
		}
		t := Throughput{Width: w, Rollouts: len(b.results), EpisodesPerRollout: o.Episodes, RolloutsInFlight: o.Concurrent,
			Episodes: b.episodes(), Acts: b.acts(), WallSeconds: b.wall.Seconds()}
		if t.Acts == 0 {
			return fmt.Errorf("throughput, width %d: %d rollouts ran no act", w, t.Rollouts)
		}
		if want := t.Episodes * w; t.Acts != want {
			return fmt.Errorf("throughput, width %d: %d acts, want %d (%d episodes × width %d)", w, t.Acts, want, t.Episodes, w)
		}
		t.ActsPerS = float64(t.Acts) / t.WallSeconds
		t.RatioToRaw = t.ActsPerS / rep.Baselines.PubSub.Median
		t.PerAct = perAct(before, after, t.Acts)
		t.CoresBusy = (after.cpu - before.cpu).Seconds() / t.WallSeconds
		rep.Throughput = append(rep.Throughput, t)
		p.say("throughput, width %d: %d acts in %.2fs = %.0f acts/s (%.3f of raw); per act %.1f stored msgs, %.1f NATS msgs, %.1f kv ops, %.3f CAS conflicts, %.2f ms CPU",
			w, t.Acts, t.WallSeconds, t.ActsPerS, t.RatioToRaw, t.PerAct.StoredMsgs, t.PerAct.NATSMsgs, t.PerAct.KVOps, t.PerAct.CASConflicts, t.PerAct.CPUMs)
	}

	// 7: eager release against the critical path, engines that take time.
	for _, load := range []struct{ inFlight, rollouts, tasks int }{
		{1, o.EagerSequential, 1},
		{o.EagerBatch, o.EagerRollouts, o.EagerBatch},
	} {
		before, err := takeSnapshot(ctx, js, s)
		if err != nil {
			return err
		}
		tasks := func(n int64) []schema.Task { return worldTasks(load.tasks, 1, n) }
		b, err := pa.runBatch(load.rollouts, 1, pa.engines.slowPlanner, pa.engines.slowActor, tasks, cfg)
		if err != nil {
			return fmt.Errorf("eager, %d in flight: %w", load.inFlight, err)
		}
		tr, err := readTraces(ctx, js, before.streams, b.first, b.last)
		if err != nil {
			return err
		}
		ratios, spans, paths := tr.eager()
		if want := b.episodes(); len(ratios) != want {
			return fmt.Errorf("eager, %d in flight: %d of %d episodes with a makespan and a critical path in the streams", load.inFlight, len(ratios), want)
		}
		e := Eager{InFlight: load.inFlight, Episodes: len(ratios), Acts: b.acts(), MeanRatio: mean(ratios), P95Ratio: percentile(ratios, 95),
			MeanMakespanMs: mean(spans), MeanCriticalMs: mean(paths)}
		rep.Eager = append(rep.Eager, e)
		p.say("eager, %d in flight: %d episodes, makespan/critical path mean %.3f p95 %.3f (makespan %.1f ms, critical path %.1f ms)",
			e.InFlight, e.Episodes, e.MeanRatio, e.P95Ratio, e.MeanMakespanMs, e.MeanCriticalMs)
	}
	return nil
}
