package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/planact/planact/internal/freeport"

	"github.com/planact/planact/internal/chaos"
)

// Process groups: what each figure adds up or leaves out.
const (
	groupPlanact = "planact" // the services: what planact costs
	groupNATS    = "nats"    // nats-server: what planact costs JetStream
	groupEngines = "engines" // simulated engines: left out of planact's cost
	groupTrainer = "trainer" // the trainers: left out of planact's cost
)

// proc is one process of the run.
type proc struct {
	*chaos.Proc
	Group string
}

// cluster is every process of the run. Processes start while the sampler
// reads them: list them with all.
type cluster struct {
	dir   string
	mu    sync.Mutex
	procs []*proc
}

// all lists the processes started so far.
func (c *cluster) all() []*proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.procs)
}

func (c *cluster) start(ctx context.Context, name, group, path string, args []string, ready string) (*proc, error) {
	return c.startEnv(ctx, name, group, path, args, nil, ready)
}

// startEnv is start with env added to the process's environment.
func (c *cluster) startEnv(ctx context.Context, name, group, path string, args, env []string, ready string) (*proc, error) {
	p := &proc{Proc: &chaos.Proc{Name: name, Kind: group, Path: path, Args: args, Env: env, Log: filepath.Join(c.dir, name+".log")}, Group: group}
	if err := p.Start(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	if ready == "" {
		return p, nil
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return p, p.WaitLog(wctx, ready)
}

// stop ends every process, the last started first.
func (c *cluster) stop() {
	procs := c.all()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Retire()
	}
}

// freePorts returns n free loopback ports that no outgoing connection
// takes before the process binds them (internal/freeport).
func freePorts(n int) ([]int, error) { return freeport.Ports(n) }

// clockTicks is Linux's USER_HZ, the unit of /proc/PID/stat's times (100
// on every architecture Go runs Linux on).
const clockTicks = 100

// procStat is a process's CPU time and memory, from /proc.
type procStat struct {
	CPU    time.Duration // utime + stime
	RSS    int64         // VmRSS, bytes
	PeakRS int64         // VmHWM, bytes: the peak resident set
}

func readProc(pid int) (procStat, error) {
	var s procStat
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// The command name may hold spaces: fields count from after its ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return s, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return s, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return s, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	s.CPU = time.Duration(ut+st) * time.Second / clockTicks
	fh, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	defer fh.Close()
	err = eachField(fh, func(key, value string) error {
		var to *int64
		switch key {
		case "VmRSS":
			to = &s.RSS
		case "VmHWM":
			to = &s.PeakRS
		}
		if fs := strings.Fields(value); to != nil && len(fs) > 0 { // "1234 kB"
			kb, _ := strconv.ParseInt(fs[0], 10, 64)
			*to = kb << 10
		}
		return nil
	})
	return s, err
}

// sample is every process's CPU and memory at one moment.
type sample struct {
	At    time.Time
	Stats map[string]procStat // by process name
}

func (c *cluster) sample() sample {
	s := sample{At: time.Now(), Stats: map[string]procStat{}}
	for _, p := range c.all() {
		if pid := p.PID(); pid != 0 {
			if st, err := readProc(pid); err == nil {
				s.Stats[p.Name] = st
			}
		}
	}
	return s
}

// sampler samples the processes every period until stopped.
type sampler struct {
	mu      sync.Mutex
	samples []sample
	stop    chan struct{}
	done    chan struct{}
}

func (c *cluster) sampleEvery(period time.Duration) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			smp := c.sample()
			s.mu.Lock()
			s.samples = append(s.samples, smp)
			s.mu.Unlock()
			select {
			case <-t.C:
			case <-s.stop:
				return
			}
		}
	}()
	return s
}

func (s *sampler) end() []sample {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

// varz is what the NATS server counted (GET /varz).
type varz struct {
	InMsgs   int64 `json:"in_msgs"`
	OutMsgs  int64 `json:"out_msgs"`
	InBytes  int64 `json:"in_bytes"`
	OutBytes int64 `json:"out_bytes"`
}

func getVarz(ctx context.Context, monitor string) (varz, error) {
	var v varz
	err := getJSON(ctx, monitor+"/varz", &v)
	return v, err
}

func getJSON(ctx context.Context, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
