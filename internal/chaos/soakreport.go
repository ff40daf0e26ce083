package chaos

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/planact/planact/pkg/bus"
)

// WriteSoak writes, for every report, soak-<topology>.csv (one row per
// sample) and soak-<topology>.png (RSS, consumers, keys over time), and for
// all of them soak.md and soak.json.
func WriteSoak(dir string, reports []*SoakReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, r := range reports {
		base := filepath.Join(dir, "soak-"+r.Topology)
		if err := writeSoakCSV(base+".csv", r); err != nil {
			return err
		}
		if len(r.Samples) > 1 {
			if err := plotSoak(base+".png", r); err != nil {
				return err
			}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "soak.md"), []byte(SoakMarkdown(reports)), 0o644); err != nil {
		return err
	}
	data, err := json.MarshalIndent(reports, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "soak.json"), append(data, '\n'), 0o644)
}

func procNames(r *SoakReport) []string {
	seen := map[string]bool{}
	for _, s := range r.Samples {
		for p := range s.RSS {
			seen[p] = true
		}
	}
	return sortedKeys(seen)
}

func writeSoakCSV(path string, r *SoakReport) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := csv.NewWriter(f)
	procs := procNames(r)
	streams := names(r.Samples, func(s BusState) map[string]int { return s.Consumers })
	buckets := names(r.Samples, func(s BusState) map[string]int { return s.Keys })
	stores := names(r.Samples, func(s BusState) map[string]int { return s.Objects })
	head := []string{"t_s", "phase", "rollouts"}
	for _, p := range procs {
		head = append(head, "rss_mb_"+p)
	}
	for _, s := range streams {
		head = append(head, "consumers_"+s)
	}
	for _, s := range streams {
		head = append(head, "messages_"+s)
	}
	for _, b := range buckets {
		head = append(head, "keys_"+b)
	}
	for _, o := range stores {
		head = append(head, "objects_"+o)
	}
	head = append(head, "err")
	if err := w.Write(head); err != nil {
		return err
	}
	for _, s := range r.Samples {
		row := []string{strconv.FormatFloat(s.Seconds, 'f', 1, 64), s.Phase, strconv.Itoa(s.Rollouts)}
		for _, p := range procs {
			row = append(row, strconv.FormatFloat(float64(s.RSS[p])/(1<<20), 'f', 1, 64))
		}
		for _, st := range streams {
			row = append(row, strconv.Itoa(s.State.Consumers[st]))
		}
		for _, st := range streams {
			row = append(row, strconv.FormatUint(s.State.Messages[st], 10))
		}
		for _, b := range buckets {
			row = append(row, strconv.Itoa(s.State.Keys[b]))
		}
		for _, o := range stores {
			row = append(row, strconv.Itoa(s.State.Objects[o]))
		}
		row = append(row, s.Err)
		if err := w.Write(row); err != nil {
			return err
		}
	}
	w.Flush()
	return w.Error()
}

// plotSoak draws three panels over time: RSS per process, consumers per
// stream, keys and objects; a dashed line marks the end of the load.
func plotSoak(path string, r *SoakReport) error {
	endLoad := 0.0
	for _, s := range r.Samples {
		if s.Phase == PhaseLoad {
			endLoad = s.Seconds
		}
	}
	// The dashed line marks the end of the load (then the drain and the
	// retention phases).
	series := func(p *plot.Plot, names []string, value func(SoakSample, string) float64) error {
		var vs []any
		for _, name := range names {
			pts := make(plotter.XYs, len(r.Samples))
			for i, s := range r.Samples {
				pts[i].X, pts[i].Y = s.Seconds, value(s, name)
			}
			vs = append(vs, name, pts)
		}
		if err := plotutil.AddLines(p, vs...); err != nil {
			return err
		}
		p.Legend.Top, p.Legend.Left = true, true
		p.X.Label.Text = "seconds"
		line, err := plotter.NewLine(plotter.XYs{{X: endLoad, Y: 0}, {X: endLoad, Y: p.Y.Max}})
		if err == nil {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
			line.Color = color.Gray{Y: 128}
			p.Add(line)
		}
		return nil
	}
	rss := plot.New()
	rss.Title.Text = fmt.Sprintf("planact soak, %s: RSS per process (MB); load ends at the dashed line", r.Topology)
	if err := series(rss, procNames(r), func(s SoakSample, p string) float64 { return float64(s.RSS[p]) / (1 << 20) }); err != nil {
		return err
	}
	cons := plot.New()
	cons.Title.Text = "consumers per stream"
	streams := names(r.Samples, func(s BusState) map[string]int { return s.Consumers })
	if err := series(cons, streams, func(s SoakSample, st string) float64 { return float64(s.State.Consumers[st]) }); err != nil {
		return err
	}
	keys := plot.New()
	keys.Title.Text = "keys per bucket, objects in all object stores"
	var lines []string
	for _, b := range names(r.Samples, func(s BusState) map[string]int { return s.Keys }) {
		lines = append(lines, "keys "+b)
	}
	lines = append(lines, "objects")
	if err := series(keys, lines, func(s SoakSample, n string) float64 {
		if b, ok := strings.CutPrefix(n, "keys "); ok {
			return float64(s.State.Keys[b])
		}
		return float64(s.State.ObjectCount())
	}); err != nil {
		return err
	}
	plots := [][]*plot.Plot{{rss}, {cons}, {keys}}
	img := vgimg.New(11*vg.Inch, 13*vg.Inch)
	dc := draw.New(img)
	canvases := plot.Align(plots, draw.Tiles{Rows: 3, Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadY: vg.Points(12)}, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		return err
	}
	return f.Close()
}

// SoakMarkdown renders soak reports: a summary row per topology, then the
// memory and consumer trends.
func SoakMarkdown(reports []*SoakReport) string {
	var b strings.Builder
	b.WriteString("| topology | load | rollouts | per second of load | not ok | memory flat after warm-up | consumers bounded | keys when the last rollout ended (sessions/runs) | objects then | left after retention (sessions/runs/objects) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range reports {
		fmt.Fprintf(&b, "| %s | %s | %d | %.1f | %d | %s | %s | %d/%d | %d | %d/%d/%d |\n",
			r.Topology, r.Settings.Span, r.Tally.Rollouts, r.RolloutsPerSec, r.Tally.Rollouts-r.Tally.OK,
			flatWord(r), boundedWord(r), r.KeysEndOfLoad[bus.BucketSession], r.KeysEndOfLoad[bus.BucketRuns], r.ObjectsEnd,
			r.Leftovers.Sessions, r.Leftovers.Runs, r.Leftovers.Objects)
	}
	for _, r := range reports {
		fmt.Fprintf(&b, "\n### %s\n\n", r.Topology)
		m := r.Machine
		fmt.Fprintf(&b, "machine: nproc %d (%s), %s GiB, %s, %s; load average at start %s\n\n", m.CPUs, m.CPU, m.MemoryGiB, m.Go, m.OS, m.Load)
		s := r.Settings
		fmt.Fprintf(&b, "%d rollouts in flight, %d tasks × %d per rollout; `planact %s`; retention: %s\n\n",
			s.Concurrency, s.Tasks, s.PerPrompt, strings.Join(s.ServeArgs, " "), r.Leftovers.Retention)
		if r.Err != "" {
			fmt.Fprintf(&b, "run failed: %s\n\n", r.Err)
		}
		fmt.Fprintf(&b, "trainers got their results after the bus stored them: median %s, p99 %s, max %s\n\n",
			secs(r.Pickup.Median), secs(r.Pickup.P99), secs(r.Pickup.Max))
		b.WriteString("| process | mean RSS, 2nd third (MB) | mean RSS, last third (MB) | ratio | max (MB) |\n|---|---|---|---|---|\n")
		mem := append([]MemoryTrend(nil), r.Memory...)
		sort.Slice(mem, func(i, j int) bool { return mem[i].Proc < mem[j].Proc })
		for _, t := range mem {
			fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.3f | %.1f |\n", t.Proc, t.WarmMB, t.LastMB, t.Ratio, t.MaxMB)
		}
		b.WriteString("\n| stream | consumers, max 1st half of the load | max 2nd half | end of load | at the end |\n|---|---|---|---|---|\n")
		for _, c := range r.Consumers {
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %d |\n", c.Stream, c.FirstHalfMax, c.SecondHalfMax, c.EndOfLoad, c.AfterRetention)
		}
		l := r.Leftovers
		fmt.Fprintf(&b, "\nafter the load: waited %s; left: keys %s; objects %s; stream messages %s\n",
			secs(l.Waited), formatCounts(l.Keys), formatCounts(l.PerStore), formatCounts(l.Messages))
		if len(r.Exits) > 0 {
			b.WriteString("\nunexpected exits:\n")
			for _, e := range r.Exits {
				fmt.Fprintf(&b, "- %s %s: %s\n", e.At.Format("15:04:05"), e.Proc, e.Err)
			}
		}
		if n := len(r.EngineCalls.Incomplete); n > 0 {
			fmt.Fprintf(&b, "\nthe engines' generation calls are not all counted (%d notes), first: %s\n", n, r.EngineCalls.Incomplete[0])
		}
		if len(r.Problems) > 0 {
			b.WriteString("\nrollouts that are not ok (first 10):\n")
			for i, c := range r.Problems {
				if i == 10 {
					break
				}
				fmt.Fprintf(&b, "- rollout %d %s: %s\n", c.Rollout, c.Verdict, strings.Join(first(c.Problems, 3), "; "))
			}
		}
	}
	fmt.Fprintf(&b, "\nMemory is flat when every process's mean RSS over the last third of the load is at most %.0f%% above its mean over the second third (the first third is warm-up). Consumers are bounded when no stream has more in the second half of the load than in the first. The harness's own consumers are counted too: three ordered consumers, plus whatever pkg/client makes to wait for results. Memory of nats-server grows until the load has lasted longer than the history: for a flat line, soak for several times --history.\n", (FlatRatio-1)*100)
	return b.String()
}

func flatWord(r *SoakReport) string {
	if len(r.Memory) == 0 {
		return "too few samples"
	}
	worst := r.Memory[0]
	for _, m := range r.Memory {
		if m.Ratio > worst.Ratio {
			worst = m
		}
	}
	word := "yes"
	if !r.MemoryFlat() {
		word = "**no**"
	}
	return fmt.Sprintf("%s (worst %s ×%.2f)", word, worst.Proc, worst.Ratio)
}

func boundedWord(r *SoakReport) string {
	if len(r.Consumers) == 0 {
		return "too few samples"
	}
	if r.ConsumersBounded() {
		return "yes"
	}
	var grew []string
	for _, c := range r.Consumers {
		if c.SecondHalfMax > c.FirstHalfMax {
			grew = append(grew, fmt.Sprintf("%s %d→%d", c.Stream, c.FirstHalfMax, c.SecondHalfMax))
		}
	}
	return "**no** (" + strings.Join(grew, ", ") + ")"
}
