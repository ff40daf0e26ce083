package schema

import (
	"fmt"
	"testing"
)

// Decoding is on every hop: a planner output carries the episode's whole
// token trajectory, an arrival a batch of tasks. These benchmarks hold the
// success path's cost (what naming a culprit must not add to).
func BenchmarkUnmarshal(b *testing.B) {
	ids := make([]int, 4000)
	lps := make([]float64, 1000)
	for i := range ids {
		ids[i] = (i * 7919) % 151000
	}
	for i := range lps {
		lps[i] = -float64(i%97) / 31
	}
	out, err := Marshal(&PlanOutput{Rollout: 7, Episode: 3, Turn: 2, Text: "plan", FinishReason: "stop", LatencyMs: 1200,
		Segments: []Segment{{Kind: SegPrompt, Turn: 1, IDs: ids[:3000]}, {Kind: SegGenerated, Turn: 1, IDs: ids[3000:], LogProbs: lps}}})
	if err != nil {
		b.Fatal(err)
	}
	tasks := make([]Task, 256)
	for i := range tasks {
		tasks[i] = Task{GroupIndex: i / 8, Index: i, Prompt: fmt.Sprintf("What is the capital of country %d?", i), Label: "Paris"}
	}
	arrive, err := Marshal(&Arrive{Rollout: 7, Role: RolePlanner, Engine: Engine{URL: "http://e:30000", Protocol: "sglang"},
		Tasks: tasks, Config: &Config{MaxTurns: 4, ActTimeoutS: 30}, AtMs: 1767225600000})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("plan.out", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(out)))
		for b.Loop() {
			var m PlanOutput
			if err := Unmarshal(out, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	req, err := Marshal(&PlanRequest{Rollout: 7, Episode: 3, Turn: 2, Observation: "<observation>n1: 42</observation>", WeightVersion: "v3"})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("plan.req", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(req)))
		for b.Loop() {
			var m PlanRequest
			if err := Unmarshal(req, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("arrive", func(b *testing.B) {
		b.SetBytes(int64(len(arrive)))
		for b.Loop() {
			var m Arrive
			if err := Unmarshal(arrive, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("arrive-strict", func(b *testing.B) {
		b.SetBytes(int64(len(arrive)))
		for b.Loop() {
			var m Arrive
			if err := UnmarshalStrict(arrive, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkScanBody(b *testing.B) {
	ids := make([]int, 4000)
	for i := range ids {
		ids[i] = (i * 7919) % 151000
	}
	out, _ := Marshal(&PlanOutput{Rollout: 7, Episode: 3, Turn: 2, Segments: []Segment{{Kind: SegPrompt, IDs: ids}}})
	b.SetBytes(int64(len(out)))
	for b.Loop() {
		if err := scanBody(out); err != nil {
			b.Fatal(err)
		}
	}
}
