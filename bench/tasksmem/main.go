// Command tasksmem measures what a rollout's task list costs the
// session-store in memory. For each size (1, 10, 50 MB of encoded tasks by
// default) it starts an embedded nats-server, runs `planact serve
// session-store` as a process of its own, and plays both trainers through
// pkg/client: the planner arrives with the tasks (in the object store, as
// pkg/client puts any list over 256 KiB), the actor arrives, the rollout
// starts (one plan request per episode), then it is cancelled and both
// results, with every task's outcome, are published. It reads the
// session-store's peak resident memory (VmHWM in /proc/PID/status) and
// prints it beside the list's size. Each size is measured again with the
// session-store restarted after the start and every episode ending at once
// (the new process reads the list again). It fails when a peak is over
// the budget that docs/deployment.md states (see budget).
//
//	go run ./bench/tasksmem [-sizes 1,10,50] [-task-bytes 4096] [-json]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench/tasksmem:", err)
		os.Exit(1)
	}
}

type options struct {
	sizes     []int // MB of encoded tasks
	taskBytes int   // bytes of prompt per task
	metadata  int   // keys in each task's metadata
	planact   string
	logDir    string // where the session-store's logs go (default: removed)
	progress  io.Writer
}

// row is one size's measurement.
type row struct {
	Scenario   string  `json:"scenario"`
	ListMB     float64 `json:"list_mb"`          // the task list as encoded (msgpack), MiB
	Tasks      int     `json:"tasks"`            // tasks, so episodes
	IdleRSSMB  float64 `json:"idle_rss_mb"`      // the session-store's resident memory before the arrivals, MiB
	PeakRSSMB  float64 `json:"peak_rss_mb"`      // its peak resident memory (VmHWM) once both results were out, MiB
	AfterRSSMB float64 `json:"after_rss_mb"`     // its resident memory then
	PerMB      float64 `json:"peak_per_list_mb"` // (peak − idle) / list size
	BudgetMB   float64 `json:"budget_mb"`        // what docs/deployment.md allows: see budget
	Seconds    float64 `json:"seconds"`          // from the first arrival (after the restart: the first end) to both results
	Status     string  `json:"status"`           // the results' status (aborted; failed: every episode failed)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tasksmem", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sizes := fs.String("sizes", "1,10,50", "task list sizes to measure, in MB of encoded tasks, comma-separated")
	taskBytes := fs.Int("task-bytes", 4096, "bytes of prompt per task (the list grows by its number of tasks)")
	metadata := fs.Int("metadata", 0, "keys in each task's metadata (a dataset's source, difficulty, tags, …)")
	planact := fs.String("planact", "", "the planact binary to run the session-store with (default: go build ./cmd/planact)")
	asJSON := fs.Bool("json", false, "print the rows as JSON")
	logDir := fs.String("logs", "", "keep the session-store's log of each size in this directory (GODEBUG=gctrace=1 shows its heap)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o := options{taskBytes: *taskBytes, metadata: *metadata, planact: *planact, logDir: *logDir, progress: stderr}
	for _, s := range strings.Split(*sizes, ",") {
		mb, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || mb <= 0 {
			return fmt.Errorf("-sizes %q: want positive whole MB, comma-separated", *sizes)
		}
		o.sizes = append(o.sizes, mb)
	}
	if o.taskBytes < 16 {
		return fmt.Errorf("-task-bytes %d: want at least 16", o.taskBytes)
	}
	if o.planact == "" {
		dir, err := os.MkdirTemp("", "tasksmem")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.planact = filepath.Join(dir, "planact")
		fmt.Fprintln(stderr, "building planact…")
		if out, err := exec.Command("go", "build", "-o", o.planact, "github.com/planact/planact/cmd/planact").CombinedOutput(); err != nil {
			return fmt.Errorf("go build: %v\n%s", err, out)
		}
	}
	var rows []row
	for _, scenario := range []string{scenarioCancel, scenarioRestart} {
		for i, mb := range o.sizes {
			r, err := measure(ctx, o, scenario, int64(i+1), mb)
			if err != nil {
				return fmt.Errorf("%d MB, %s: %w", mb, scenario, err)
			}
			rows = append(rows, r)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			return err
		}
		return overBudget(rows)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "scenario\ttask list (MB)\ttasks\tidle RSS (MB)\tpeak RSS (MB)\tpeak − idle per list MB\tbudget (MB)\tRSS after (MB)\tseconds\t\n")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%.1f\t%d\t%.0f\t%.0f\t%.1f\t%.0f\t%.0f\t%.1f\t\n", r.Scenario, r.ListMB, r.Tasks, r.IdleRSSMB, r.PeakRSSMB, r.PerMB, r.BudgetMB, r.AfterRSSMB, r.Seconds)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nbudget: idle + %d MB + %g × the list + %g KB per task (docs/deployment.md)\n", budgetFixedMB, budgetPerListMB, budgetPerTaskKB)
	return overBudget(rows)
}

// The session-store's memory budget for a rollout's task list, as
// docs/deployment.md states it: peak resident memory at most its idle
// memory, plus budgetFixedMB, plus budgetPerListMB times the encoded list,
// plus budgetPerTaskKB per task (the rollout's bookkeeping per episode).
const (
	budgetFixedMB   = 8
	budgetPerListMB = 4.0
	budgetPerTaskKB = 2.0
)

func budget(idleMB, listMB float64, tasks int) float64 {
	return idleMB + budgetFixedMB + budgetPerListMB*listMB + budgetPerTaskKB*float64(tasks)/1024
}

// overBudget is an error naming the rows whose peak went over the budget.
func overBudget(rows []row) error {
	var over []string
	for _, r := range rows {
		if r.PeakRSSMB > r.BudgetMB {
			over = append(over, fmt.Sprintf("%s, %.1f MB: peak %.0f MB, budget %.0f MB", r.Scenario, r.ListMB, r.PeakRSSMB, r.BudgetMB))
		}
	}
	if len(over) > 0 {
		return fmt.Errorf("over the memory budget: %s", strings.Join(over, "; "))
	}
	return nil
}

// The scenarios each size is measured in.
const (
	// scenarioCancel: the session-store receives both arrivals, reads the
	// task list from the object store, starts the rollout (a plan request
	// per episode), takes its cancel and publishes both results with every
	// task's outcome.
	scenarioCancel = "arrive, start, cancel"
	// scenarioRestart: the rollout starts; the session-store is restarted
	// (its cache is gone) and every episode ends at once, so that the
	// handlers of the ends all need the task list together; the last end
	// ends the rollout and both results go out. The restarted process is
	// measured.
	scenarioRestart = "restart, every episode ends"
)

// measure runs one rollout of mb MB of tasks through a session-store of
// its own in scenario and returns what it cost.
func measure(ctx context.Context, o options, scenario string, n int64, mb int) (row, error) {
	dir, err := os.MkdirTemp("", "tasksmem")
	if err != nil {
		return row{}, err
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Options{Dir: filepath.Join(dir, "nats"), Port: -1, Name: "tasksmem"})
	if err != nil {
		return row{}, err
	}
	defer srv.Stop()
	url := srv.ClientURL()
	// Provisioned here, so that the session-store's memory is its own work.
	b, err := provisioned(ctx, url)
	if err != nil {
		return row{}, err
	}
	defer b.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	logDir := dir
	if o.logDir != "" {
		logDir = o.logDir
	}
	logName := fmt.Sprintf("session-store-%dMB-%s", mb, strings.Fields(scenario)[0])
	ss, err := startSessionStore(rctx, o.planact, url, filepath.Join(logDir, logName+".log"))
	if err != nil {
		return row{}, err
	}
	defer func() { ss.stop() }()
	idle, err := memory(ss.pid())
	if err != nil {
		return row{}, err
	}

	tasks := makeTasks(mb<<20, o.taskBytes, o.metadata)
	data, err := schema.Marshal(&schema.TaskList{Tasks: tasks})
	if err != nil {
		return row{}, err
	}
	listMB := float64(len(data)) / (1 << 20)
	count := len(tasks)
	fmt.Fprintf(o.progress, "rollout %d: %d tasks, %.1f MB encoded; %s\n", n, count, listMB, scenario)

	nc, err := nats.Connect(url)
	if err != nil {
		return row{}, err
	}
	defer nc.Close()
	started := make(chan struct{})
	var once sync.Once
	sub, err := nc.Subscribe(subject.Status(n), func(m *nats.Msg) {
		var st schema.Status
		if schema.Unmarshal(m.Data, &st) == nil && st.Event == "started" {
			once.Do(func() { close(started) })
		}
	})
	if err != nil {
		return row{}, err
	}
	defer sub.Unsubscribe()
	c, err := client.New(nc)
	if err != nil {
		return row{}, err
	}
	t0 := time.Now()
	if err := c.Arrive(rctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner.invalid"}, Tasks: tasks}); err != nil {
		return row{}, err
	}
	tasks = nil // the trainer's copy is not the session-store's
	if err := c.Arrive(rctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor.invalid"}}); err != nil {
		return row{}, err
	}
	select {
	case <-started:
	case <-rctx.Done():
		return row{}, errors.New("the rollout did not start")
	}
	switch scenario {
	case scenarioCancel:
		if err := c.Cancel(rctx, n, schema.RolePlanner, "tasksmem: measured"); err != nil {
			return row{}, err
		}
	case scenarioRestart:
		ss.stop()
		if ss, err = startSessionStore(rctx, o.planact, url, filepath.Join(logDir, logName+"-restarted.log")); err != nil {
			return row{}, err
		}
		if idle, err = memory(ss.pid()); err != nil {
			return row{}, err
		}
		t0 = time.Now()
		ends := make([]schema.Message, count)
		for e := range ends {
			ends[e] = &schema.EpisodeEnd{Rollout: n, Episode: e, Status: schema.EpisodeFailed, Reason: "tasksmem: measured", AtMs: time.Now().UnixMilli()}
		}
		if err := b.PublishAll(rctx, ends...); err != nil {
			return row{}, err
		}
	}
	var status string
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		res, err := c.Result(rctx, n, role)
		if err != nil && res == nil {
			return row{}, fmt.Errorf("%s result: %w", role, err)
		}
		if len(res.Tasks) != count {
			return row{}, fmt.Errorf("%s result: %d task outcomes for %d tasks (%s: %s)", role, len(res.Tasks), count, res.Status, res.Reason)
		}
		status = res.Status
	}
	secs := time.Since(t0).Seconds()
	end, err := memory(ss.pid())
	if err != nil {
		return row{}, err
	}
	return row{Scenario: scenario, ListMB: listMB, Tasks: count, IdleRSSMB: idle.rss, PeakRSSMB: end.hwm, AfterRSSMB: end.rss,
		PerMB: (end.hwm - idle.rss) / listMB, BudgetMB: budget(idle.rss, listMB, count), Seconds: secs, Status: status}, nil
}

// sessionStore is `planact serve session-store` running as a process.
type sessionStore struct {
	cmd *exec.Cmd
	log *os.File
}

func startSessionStore(ctx context.Context, planact, url, logPath string) (*sessionStore, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(planact, "serve", "--nats", url, "--metrics", "", "session-store")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "PLANACT_LOG_LEVEL=warn")
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	ss := &sessionStore{cmd: cmd, log: log}
	if err := stack.WaitReady(ctx, bus.ConnOptions{URL: url}, []string{"session-store"}); err != nil {
		ss.stop()
		return nil, err
	}
	return ss, nil
}

func (ss *sessionStore) pid() int { return ss.cmd.Process.Pid }

// stop ends the process (SIGTERM) and waits for it; it may be called again.
func (ss *sessionStore) stop() {
	if ss.cmd.ProcessState == nil {
		_ = ss.cmd.Process.Signal(syscall.SIGTERM)
		_ = ss.cmd.Wait()
	}
	ss.log.Close()
}

// makeTasks returns tasks of about taskBytes of prompt each and metadata
// keys of metadata, size bytes in all: text of words, as prompts are, in
// groups of 8 copies.
func makeTasks(size, taskBytes, metadata int) []schema.Task {
	words := strings.Fields("what is the population of the capital of the largest neighbor country city river mountain answer step plan search find compare")
	rng := rand.New(rand.NewPCG(1, 2))
	var tasks []schema.Task
	for total := 0; total < size; {
		var sb strings.Builder
		for sb.Len() < taskBytes {
			sb.WriteString(words[rng.IntN(len(words))])
			sb.WriteByte(' ')
		}
		i := len(tasks)
		t := schema.Task{GroupIndex: i / 8, Index: i, Prompt: sb.String(), Label: strconv.Itoa(rng.IntN(1000))}
		if i%8 != 0 {
			t.Prompt, t.Label = tasks[i-i%8].Prompt, tasks[i-i%8].Label // a copy: a group is one task's copies
		}
		total += sb.Len() + 16
		if metadata > 0 {
			t.Metadata = map[string]any{}
			for k := range metadata {
				t.Metadata[fmt.Sprintf("key%d", k)] = words[rng.IntN(len(words))]
				total += 12
			}
		}
		tasks = append(tasks, t)
	}
	return tasks
}

type mem struct{ rss, hwm float64 } // MiB

// memory reads a process's resident memory now and at its peak.
func memory(pid int) (mem, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return mem{}, err
	}
	var m mem
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			m.rss = kb / 1024
		case "VmHWM":
			m.hwm = kb / 1024
		}
	}
	if m.hwm == 0 {
		return m, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
	}
	return m, nil
}

// provisioned provisions planact on url, as `planact provision` does (the
// session-store's consumers included), and opens it.
func provisioned(ctx context.Context, url string) (*bus.Bus, error) {
	o := stack.Options{Conn: bus.ConnOptions{URL: url}, Log: zerolog.Nop()}
	if err := stack.Provision(ctx, o); err != nil {
		return nil, err
	}
	return bus.Connect(ctx, o.Conn, "tasksmem", zerolog.Nop(), bus.Provisioning{})
}
