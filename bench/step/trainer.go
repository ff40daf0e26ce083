package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
)

// TrainerLog is what a trainer process did, with wall-clock times
// (Unix nanoseconds: every process of the run shares the clock).
type TrainerLog struct {
	Role     string       `json:"role"`
	Rollouts []RolloutLog `json:"rollouts"`
	Pauses   []PauseLog   `json:"pauses,omitempty"`
	Err      string       `json:"error,omitempty"`
}

// RolloutLog is one rollout as a trainer saw it.
type RolloutLog struct {
	Rollout      int64                `json:"rollout"`
	ArriveCallNs int64                `json:"arrive_call_ns"`
	ArrivedNs    int64                `json:"arrived_ns"` // the arrival stored
	Groups       []GroupLog           `json:"groups,omitempty"`
	ResultNs     int64                `json:"result_ns"`
	Status       string               `json:"status"`
	Reason       string               `json:"reason,omitempty"`
	Samples      int                  `json:"samples"`
	Stats        schema.Stats         `json:"stats"`
	Tasks        []schema.TaskOutcome `json:"tasks,omitempty"`
	Err          string               `json:"error,omitempty"`
}

// GroupLog is one group delivered while the rollout ran (stream_groups).
type GroupLog struct {
	Index   int   `json:"index"`
	AtNs    int64 `json:"at_ns"`
	Samples int   `json:"samples"`
}

// PauseLog is one weight swap: Pause, the engine's new version, the swap
// itself, Resume.
type PauseLog struct {
	After     int64 `json:"after_rollout"`
	CalledNs  int64 `json:"called_ns"`
	PausedNs  int64 `json:"paused_ns"` // Pause answered: no generation of the role runs
	ResumedNs int64 `json:"resumed_ns"`
	Aborted   int   `json:"aborted"`
	Missing   int   `json:"missing"`
}

// trainerOptions configure one trainer process.
type trainerOptions struct {
	Role     string        `json:"role"`
	NATS     string        `json:"nats"`
	Engine   string        `json:"engine"`
	Capacity int           `json:"capacity"` // engine.max_in_flight stated in the arrival; 0: none
	First    int64         `json:"first"`
	Rollouts int           `json:"rollouts"`
	Prompts  int           `json:"prompts"`
	Target   int           `json:"target_groups"` // 0: every group
	Swap     time.Duration `json:"swap"`
	Abort    bool          `json:"pause_abort"`
	Timeout  time.Duration `json:"timeout"`
	Config   schema.Config `json:"config"`
	Model    Model         `json:"model"`
}

// runTrainer plays one training job the way docs/async.md's loop does:
// rollout N+1 arrives before the job consumes N's groups as they come;
// after N's result, the job pauses its role, swaps weights and resumes.
func runTrainer(ctx context.Context, o trainerOptions, out string) error {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	log := TrainerLog{Role: o.Role}
	err := train(ctx, o, &log)
	if err != nil {
		log.Err = err.Error()
	}
	data, jerr := json.Marshal(&log)
	if jerr != nil {
		return jerr
	}
	if werr := os.WriteFile(out, data, 0o644); werr != nil {
		return werr
	}
	return err
}

func train(ctx context.Context, o trainerOptions, log *TrainerLog) error {
	nc, err := bus.ConnOptions{URL: o.NATS}.Dial("bench-step-trainer-" + o.Role)
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		return err
	}
	version := func(step int) string { return fmt.Sprintf("%s-step-%d", o.Role, step) }
	logs := map[int64]*RolloutLog{}
	arrive := func(n int64, step int) error {
		rl := &RolloutLog{Rollout: n, ArriveCallNs: time.Now().UnixNano()}
		logs[n] = rl
		a := &schema.Arrive{Rollout: n, Role: o.Role, Engine: schema.Engine{URL: o.Engine, Protocol: "sglang", MaxInFlight: o.Capacity}, WeightVersion: version(step)}
		if o.Role == schema.RolePlanner {
			a.Tasks, a.Config = tasks(&o.Model, n, o.Prompts), &o.Config
		}
		if err := c.Arrive(ctx, a); err != nil {
			return fmt.Errorf("arrive rollout %d: %w", n, err)
		}
		rl.ArrivedNs = time.Now().UnixNano()
		return nil
	}
	if err := arrive(o.First, 0); err != nil {
		return err
	}
	defer func() {
		for i := range o.Rollouts {
			if rl := logs[o.First+int64(i)]; rl != nil {
				log.Rollouts = append(log.Rollouts, *rl)
			}
		}
	}()
	for i := range o.Rollouts {
		n := o.First + int64(i)
		if i+1 < o.Rollouts {
			if err := arrive(n+1, i); err != nil {
				return err
			}
		}
		rl := logs[n]
		var taken []int // groups whose samples this trainer has
		streamed := 0
		for g, err := range c.Groups(ctx, n, o.Role) {
			if err != nil {
				rl.Err = err.Error()
				break
			}
			rl.Groups = append(rl.Groups, GroupLog{Index: g.GroupIndex, AtNs: time.Now().UnixNano(), Samples: len(g.Samples)})
			taken, streamed = append(taken, g.GroupIndex), streamed+len(g.Samples)
		}
		// As a streaming trainer does: the groups' samples are not read twice.
		res, err := c.Result(ctx, n, o.Role, client.WithoutGroups(taken...))
		rl.ResultNs = time.Now().UnixNano()
		if res != nil {
			rl.Status, rl.Reason, rl.Samples, rl.Stats, rl.Tasks = res.Status, res.Reason, streamed+len(res.Samples), res.Stats, res.Tasks
			// The result counts what it holds, and the samples of the
			// groups it leaves out (result_samples undelivered).
			if counted := res.SampleCount + res.GroupSamples; err == nil && rl.Samples != counted {
				err = fmt.Errorf("%d samples in the groups and the result, which counts %d (sample_count %d, group_samples %d)",
					rl.Samples, counted, res.SampleCount, res.GroupSamples)
			}
		}
		if err != nil {
			rl.Err = err.Error()
			return fmt.Errorf("rollout %d: %w", n, err)
		}
		if i+1 == o.Rollouts {
			break
		}
		// The weight swap between two training steps.
		p := PauseLog{After: n, CalledNs: time.Now().UnixNano()}
		ans, err := c.Pause(ctx, o.Role, client.PauseOptions{Abort: o.Abort, Reason: fmt.Sprintf("bench/step: weight swap after rollout %d", n)})
		if err != nil {
			return err
		}
		p.PausedNs, p.Aborted, p.Missing = time.Now().UnixNano(), ans.Aborted, len(ans.Missing)
		if err := setWeightVersion(ctx, o.Engine, version(i+1)); err != nil {
			return err
		}
		select {
		case <-time.After(o.Swap):
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := c.Resume(ctx, o.Role, version(i+1)); err != nil {
			return err
		}
		p.ResumedNs = time.Now().UnixNano()
		log.Pauses = append(log.Pauses, p)
	}
	return nil
}

// tasks is rollout n's batch: prompts tasks, Model.Copies copies of each.
func tasks(m *Model, n int64, prompts int) []schema.Task {
	var ts []schema.Task
	for g := range prompts {
		p := m.TaskPrompt(n, g)
		for range m.Copies {
			ts = append(ts, schema.Task{GroupIndex: g, Index: len(ts), Prompt: p, Label: Label(g)})
		}
	}
	return ts
}

// setWeightVersion tells the engine its new weights (SGLang's POST
// /update_weight_version), as a trainer's swap ends.
func setWeightVersion(ctx context.Context, url, v string) error {
	body, _ := json.Marshal(map[string]any{"new_version": v})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/update_weight_version", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("update_weight_version: %s", resp.Status)
	}
	return nil
}
