package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// machine is what the figures were measured on.
type machine struct {
	CPUs      int     `json:"cpus"`
	CPUModel  string  `json:"cpu_model,omitempty"`
	MemoryGiB float64 `json:"memory_gib,omitempty"`
	Go        string  `json:"go"`
	OS        string  `json:"os"`
	DataDir   string  `json:"data_dir"`
	Device    string  `json:"device,omitempty"`
	FS        string  `json:"filesystem,omitempty"`
	// FsyncMillis is the median time to write 4 KiB and fsync it in the
	// data directory: what "always" pays per flush.
	FsyncMillis float64 `json:"fsync_4k_median_ms"`
}

func describeMachine(dir string) (machine, error) {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, DataDir: dir}
	m.CPUModel = firstField("/proc/cpuinfo", "model name")
	if kb := firstField("/proc/meminfo", "MemTotal"); kb != "" {
		var n float64
		if _, err := fmt.Sscanf(kb, "%f kB", &n); err == nil {
			m.MemoryGiB = n / (1 << 20)
		}
	}
	m.Device, m.FS = mountOf(dir)
	ms, err := fsyncProbe(dir, 200)
	if err != nil {
		return m, fmt.Errorf("fsync probe in %s: %w", dir, err)
	}
	m.FsyncMillis = ms
	return m, nil
}

// firstField is the value of the first "key : value" line of a /proc file.
func firstField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func firstLine(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(data), "\n")
	return line
}

// mountOf finds the device and file system holding dir in /proc/mounts.
func mountOf(dir string) (device, fs string) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", ""
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	data, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return "", ""
	}
	best := -1
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		mnt := f[1]
		if (abs == mnt || strings.HasPrefix(abs, strings.TrimSuffix(mnt, "/")+"/")) && len(mnt) > best {
			best, device, fs = len(mnt), f[0], f[2]
		}
	}
	return device, fs
}

func fsyncProbe(dir string, n int) (float64, error) {
	f, err := os.CreateTemp(dir, "fsync-probe-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	times := make([]float64, 0, n)
	for range n {
		start := time.Now()
		if _, err := f.Write(buf); err != nil {
			return 0, err
		}
		if err := f.Sync(); err != nil {
			return 0, err
		}
		times = append(times, float64(time.Since(start))/float64(time.Millisecond))
	}
	return median(times), nil
}

func (r *report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func (r *report) WriteTable(w io.Writer) error {
	m := r.Machine
	fmt.Fprintf(w, "planact durability benchmark: JetStream sync policies against %q (the baseline); %d rounds, the policies back to back within each;\n", r.Baseline, r.Rounds)
	fmt.Fprintf(w, "a value is the median of the rounds, a ratio the median of the per-round ratios to the baseline (min-max in brackets)\n")
	fmt.Fprintf(w, "machine: %d CPUs (%s), %.1f GiB, %s %s; data in %s on %s (%s), 4 KiB write+fsync median %.3f ms\n",
		m.CPUs, m.CPUModel, m.MemoryGiB, m.Go, m.OS, m.DataDir, m.Device, m.FS, m.FsyncMillis)
	fmt.Fprintf(w, "load average before: %s; after: %s\n", r.LoadBefore, r.LoadAfter)
	fmt.Fprintf(w, "publish: %d-byte messages, file storage, R1, %gs each (async window %d); rollouts: %d at once × %d tasks, all five services, simulated engines\n",
		r.Options.MessageBytes, r.Options.PublishSeconds, r.Options.Window, r.Options.Rollouts, r.Options.Tasks)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	head := "workload\tunit\t"
	for _, p := range r.Policies {
		head += "sync " + p + "\tratio\t\t"
	}
	fmt.Fprintln(tw, head)
	for i := 0; i < len(r.Results); i += len(r.Policies) {
		row := r.Results[i : i+len(r.Policies)]
		line := row[0].Workload + "\t" + row[0].Unit + "\t"
		for _, res := range row {
			line += fmt.Sprintf("%.1f\t%.2fx\t[%.2f-%.2f]\t", res.Median, res.Ratio, slices.Min(res.Ratios), slices.Max(res.Ratios))
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}
