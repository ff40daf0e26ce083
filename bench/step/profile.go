package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// profileWindow is how long each CPU profile a process is asked for runs;
// the step's profile of a process is its windows merged.
const profileWindow = 10 * time.Second

// profiler collects CPU profiles of the processes that serve them (the
// services with `planact serve --pprof`, nats-server with prof_port) from
// the moment it starts to the step's end, window after window.
type profiler struct {
	dir     string
	targets map[string]string // process name → its /debug/pprof/ address
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	files   map[string][]string // process name → its windows' files
	errs    []error
}

func newProfiler(dir string) *profiler {
	return &profiler{dir: dir, targets: map[string]string{}, stop: make(chan struct{}), files: map[string][]string{}}
}

// add names a process whose profiles to collect, at base (http://host:port).
func (p *profiler) add(name, base string) { p.targets[name] = base + "/debug/pprof/profile" }

// start begins collecting; end stops it, waiting for the windows running.
func (p *profiler) start(ctx context.Context) {
	for name, url := range p.targets {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-p.stop:
					return
				default:
				}
				path := filepath.Join(p.dir, fmt.Sprintf("%s.%03d.pb.gz", name, i))
				err := fetchProfile(ctx, fmt.Sprintf("%s?seconds=%d", url, int(profileWindow/time.Second)), path)
				p.mu.Lock()
				if err != nil {
					p.errs = append(p.errs, fmt.Errorf("%s: %w", name, err))
				} else {
					p.files[name] = append(p.files[name], path)
				}
				p.mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
}

// end stops the CPU windows, waiting for those running, and saves each
// process's heap allocations since it started (<dir>/<process>.allocs.pb.gz:
// read it with go tool pprof -sample_index=alloc_space).
func (p *profiler) end(ctx context.Context) {
	close(p.stop)
	p.wg.Wait()
	for name, url := range p.targets {
		path := filepath.Join(p.dir, name+".allocs.pb.gz")
		if err := fetchProfile(ctx, strings.TrimSuffix(url, "profile")+"allocs", path); err != nil {
			p.errs = append(p.errs, fmt.Errorf("%s allocations: %w", name, err))
		}
	}
}

func fetchProfile(ctx context.Context, url, path string) error {
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
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ProfileSummary is one process's CPU profile over the step: where its
// samples fell, by function (flat, and cumulative) and by package.
type ProfileSummary struct {
	Process  string        `json:"process"`
	SampledS float64       `json:"sampled_s"` // CPU-seconds the profile holds
	Flat     []ProfileLine `json:"flat"`
	Cum      []ProfileLine `json:"cum"`
	Packages []ProfileLine `json:"packages"`
}

// ProfileLine is a function's (or a package's) share of a profile.
type ProfileLine struct {
	Name string  `json:"name"`
	S    float64 `json:"s"`
	Pct  float64 `json:"pct"`
}

// summarise merges each process's windows into <dir>/<process>.pb.gz and
// reads its top functions and packages with `go tool pprof`.
func (p *profiler) summarise(ctx context.Context, top int) ([]ProfileSummary, error) {
	var out []ProfileSummary
	names := make([]string, 0, len(p.files))
	for name := range p.files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		merged := filepath.Join(p.dir, name+".pb.gz")
		args := append([]string{"tool", "pprof", "-proto"}, p.files[name]...)
		data, err := exec.CommandContext(ctx, "go", args...).Output()
		if err != nil {
			return nil, fmt.Errorf("merge %s's profiles: %w", name, exitErr(err))
		}
		if err := os.WriteFile(merged, data, 0o644); err != nil {
			return nil, err
		}
		for _, f := range p.files[name] {
			os.Remove(f)
		}
		s := ProfileSummary{Process: name}
		all, total, err := pprofTop(ctx, merged, false)
		if err != nil {
			return nil, err
		}
		s.SampledS = total
		s.Flat = all[:min(top, len(all))]
		s.Packages = byPackage(all, total)
		cum, _, err := pprofTop(ctx, merged, true)
		if err != nil {
			return nil, err
		}
		s.Cum = cum[:min(top, len(cum))]
		out = append(out, s)
	}
	return out, nil
}

func exitErr(err error) error {
	if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
	}
	return err
}

// pprofTop reads every function of a profile with its flat (or cumulative)
// seconds, largest first, and the profile's total.
func pprofTop(ctx context.Context, path string, cum bool) ([]ProfileLine, float64, error) {
	args := []string{"tool", "pprof", "-top", "-nodecount=100000", "-unit=s"}
	if cum {
		args = append(args, "-cum")
	}
	data, err := exec.CommandContext(ctx, "go", append(args, path)...).Output()
	if err != nil {
		return nil, 0, fmt.Errorf("go tool pprof -top %s: %w", path, exitErr(err))
	}
	var lines []ProfileLine
	total := 0.0
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		// "Showing nodes accounting for 12.34s, 98.76% of 12.50s total"
		if i := strings.Index(line, "% of "); i >= 0 && strings.HasSuffix(line, " total") {
			total, _ = parseSeconds(strings.TrimSuffix(line[i+len("% of "):], " total"))
			continue
		}
		//      flat  flat%   sum%        cum   cum%   name
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasSuffix(f[1], "%") || !strings.HasSuffix(f[4], "%") {
			continue
		}
		col := 0
		if cum {
			col = 3
		}
		secs, ok := parseSeconds(f[col])
		if !ok {
			continue
		}
		lines = append(lines, ProfileLine{Name: strings.Join(f[5:], " "), S: secs})
	}
	for i := range lines {
		if total > 0 {
			lines[i].Pct = 100 * lines[i].S / total
		}
	}
	return lines, total, sc.Err()
}

func parseSeconds(s string) (float64, bool) {
	s = strings.TrimSpace(s)
	mult := 1.0
	switch {
	case strings.HasSuffix(s, "ms"):
		s, mult = strings.TrimSuffix(s, "ms"), 1e-3
	case strings.HasSuffix(s, "us"):
		s, mult = strings.TrimSuffix(s, "us"), 1e-6
	case strings.HasSuffix(s, "s"):
		s = strings.TrimSuffix(s, "s")
	}
	v, err := strconv.ParseFloat(s, 64)
	return v * mult, err == nil
}

// byPackage sums the flat seconds of functions by their package (the
// import path before the function's name; the runtime's, the collector's
// and the scheduler's all under "runtime").
func byPackage(fns []ProfileLine, total float64) []ProfileLine {
	sum := map[string]float64{}
	for _, f := range fns {
		sum[packageOf(f.Name)] += f.S
	}
	var out []ProfileLine
	for name, s := range sum {
		pct := 0.0
		if total > 0 {
			pct = 100 * s / total
		}
		out = append(out, ProfileLine{Name: name, S: s, Pct: pct})
	}
	slices.SortFunc(out, func(a, b ProfileLine) int {
		if a.S != b.S {
			if a.S > b.S {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// packageOf is the package of a function as pprof names it:
// "github.com/nats-io/nats.go.(*Conn).processMsg" → "github.com/nats-io/nats.go",
// "encoding/json.(*decodeState).object" → "encoding/json", "runtime.mallocgc" → "runtime".
func packageOf(fn string) string {
	slash := strings.LastIndexByte(fn, '/')
	rest := fn[slash+1:]
	dot := strings.IndexByte(rest, '.')
	if dot < 0 {
		return fn
	}
	return fn[:slash+1+dot]
}

// writeProfiles writes each summary as text: its top functions by flat and
// cumulative time and its packages.
func writeProfiles(w io.Writer, sums []ProfileSummary, top int) {
	for _, s := range sums {
		fmt.Fprintf(w, "== %s: %.2f CPU-s sampled\n", s.Process, s.SampledS)
		fmt.Fprintf(w, "  by package (flat)\n")
		for _, l := range s.Packages[:min(top, len(s.Packages))] {
			fmt.Fprintf(w, "    %6.1f%%  %7.2fs  %s\n", l.Pct, l.S, l.Name)
		}
		fmt.Fprintf(w, "  functions (flat)\n")
		for _, l := range s.Flat {
			fmt.Fprintf(w, "    %6.1f%%  %7.2fs  %s\n", l.Pct, l.S, l.Name)
		}
		fmt.Fprintf(w, "  functions (cumulative)\n")
		for _, l := range s.Cum {
			fmt.Fprintf(w, "    %6.1f%%  %7.2fs  %s\n", l.Pct, l.S, l.Name)
		}
		fmt.Fprintln(w)
	}
}

// writeProfileSummaries merges the profiles and writes profiles.txt and
// profiles.json into dir.
func writeProfileSummaries(ctx context.Context, p *profiler, dir string) error {
	sums, err := p.summarise(ctx, 25)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	for _, e := range p.errs {
		fmt.Fprintf(&b, "note: %v\n", e)
	}
	writeProfiles(&b, sums, 15)
	if err := os.WriteFile(filepath.Join(dir, "profiles.txt"), b.Bytes(), 0o644); err != nil {
		return err
	}
	data, err := json.MarshalIndent(sums, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "profiles.json"), data, 0o644)
}
