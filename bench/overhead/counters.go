package main

import (
	"context"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// snapshot is every counter the per-act figures are deltas of.
type snapshot struct {
	streams       map[string]uint64  // last sequence of every stream
	in, out       int64              // server varz, summed over the nodes
	kvOps         map[string]float64 // "bucket/op" → planact_kv_ops_total
	conflicts     map[string]float64 // bucket → planact_kv_conflicts_total
	engineSeconds map[string][2]float64
	cpu           time.Duration // this process: server(s), services, engines and client
}

func takeSnapshot(ctx context.Context, js jetstream.JetStream, s *servers) (*snapshot, error) {
	snap := &snapshot{kvOps: map[string]float64{}, conflicts: map[string]float64{}, engineSeconds: map[string][2]float64{}}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return nil, err
	}
	snap.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	var err error
	if snap.in, snap.out, err = s.varz(); err != nil {
		return nil, err
	}
	if snap.streams, err = lastSeqs(ctx, js); err != nil {
		return nil, err
	}
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return nil, err
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch f.GetName() {
			case "planact_kv_ops_total":
				snap.kvOps[labels["bucket"]+"/"+labels["op"]] += m.GetCounter().GetValue()
			case "planact_kv_conflicts_total":
				snap.conflicts[labels["bucket"]] += m.GetCounter().GetValue()
			case "planact_engine_request_seconds":
				h := m.GetHistogram()
				v := snap.engineSeconds[labels["role"]]
				snap.engineSeconds[labels["role"]] = [2]float64{v[0] + h.GetSampleSum(), v[1] + float64(h.GetSampleCount())}
			}
		}
	}
	return snap, nil
}

// PerAct is what one act costs, as deltas over a run divided by its acts.
type PerAct struct {
	StoredMsgs float64 `json:"stored_msgs"`
	// StoredByStream is stored messages per act by stream (last-sequence
	// deltas: planact purges run state when a rollout ends, so message
	// counts would miss what it wrote).
	StoredByStream map[string]float64 `json:"stored_by_stream"`
	NATSMsgs       float64            `json:"nats_msgs"` // varz in_msgs + out_msgs
	NATSIn         float64            `json:"nats_in_msgs"`
	NATSOut        float64            `json:"nats_out_msgs"`
	KVOps          float64            `json:"kv_ops"`
	KVOpsBy        map[string]float64 `json:"kv_ops_by_bucket_op"`
	CASConflicts   float64            `json:"cas_conflicts"`
	ConflictsBy    map[string]float64 `json:"cas_conflicts_by_bucket"`
	CPUMs          float64            `json:"cpu_ms"` // process CPU (server, services, engines, client) per act
}

// perAct divides what changed from a to b by acts. Streams of the
// baselines (BENCH_*) are left out.
func perAct(a, b *snapshot, acts int) PerAct {
	n := float64(acts)
	p := PerAct{StoredByStream: map[string]float64{}, KVOpsBy: map[string]float64{}, ConflictsBy: map[string]float64{}}
	for name, last := range b.streams {
		if strings.HasPrefix(name, "BENCH_") {
			continue
		}
		if d := float64(last - min(a.streams[name], last)); d > 0 {
			p.StoredByStream[name] = d / n
			p.StoredMsgs += d / n
		}
	}
	p.NATSIn, p.NATSOut = float64(b.in-a.in)/n, float64(b.out-a.out)/n
	p.NATSMsgs = p.NATSIn + p.NATSOut
	for k, v := range b.kvOps {
		if d := v - a.kvOps[k]; d > 0 {
			p.KVOpsBy[k] = d / n
			p.KVOps += d / n
		}
	}
	for k, v := range b.conflicts {
		if d := v - a.conflicts[k]; d > 0 {
			p.ConflictsBy[k] = d / n
			p.CASConflicts += d / n
		}
	}
	p.CPUMs = ms(b.cpu-a.cpu) / n
	return p
}

// meanEngineMs is the mean engine latency of role between a and b, from
// planact_engine_request_seconds (full precision, unlike latency_ms).
func meanEngineMs(a, b *snapshot, role string) float64 {
	x, y := a.engineSeconds[role], b.engineSeconds[role]
	if y[1] <= x[1] {
		return 0
	}
	return 1000 * (y[0] - x[0]) / (y[1] - x[1])
}
