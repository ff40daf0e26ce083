package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var (
	blue  = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	amber = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	red   = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	plum  = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
)

// chart draws three panels: acts/s per width as a fraction of raw
// publish+consume, latency bars (p50 and p99) against request/reply, and
// eager makespan over critical path; each with its goal as a red line.
func (r *Report) chart(path string) error {
	suffix := ""
	if r.Options.Cluster {
		suffix = " (3-node cluster)"
	}
	// 1: throughput.
	p1 := plot.New()
	p1.Title.Text = "acts/s ÷ raw publish+consume msgs/s" + suffix
	p1.Y.Label.Text = "fraction of raw JetStream"
	var vals plotter.Values
	var names []string
	for _, t := range r.Throughput {
		vals = append(vals, t.RatioToRaw)
		names = append(names, fmt.Sprintf("width %d\n%.0f acts/s", t.Width, t.ActsPerS))
	}
	top := 0.12
	for _, v := range vals {
		top = math.Max(top, v*1.15)
	}
	if err := bars(p1, vals, blue, 0, vg.Points(30)); err != nil {
		return err
	}
	p1.NominalX(names...)
	goalLine(p1, 0.10, "goal ≥ 0.10", red)
	p1.Y.Min, p1.Y.Max = 0, top

	// 2: latencies.
	p2 := plot.New()
	p2.Title.Text = "added latency, 1 episode in flight (turns: those that ran acts)" + suffix
	p2.Y.Label.Text = "ms"
	var p50, p99 plotter.Values
	names = nil
	add := func(name string, d Dist) {
		names = append(names, name)
		p50, p99 = append(p50, d.P50), append(p99, d.P99)
	}
	b := r.Baselines.Requests
	add("req/reply\n(baseline 3)", Dist{P50: b.P50Ms, P99: b.P99Ms})
	for _, l := range r.Light {
		add(fmt.Sprintf("per act\nwidth %d", l.Width), l.PerAct)
	}
	for _, l := range r.Light {
		add(fmt.Sprintf("per turn\nwidth %d", l.Width), l.PerActingTurn)
	}
	add("barrier", r.Barrier)
	w := vg.Points(14)
	if err := bars(p2, p50, blue, -w/2, w); err != nil {
		return err
	}
	if err := bars(p2, p99, amber, w/2, w); err != nil {
		return err
	}
	p2.Legend.Top = true
	p2.Legend.Add("p50", solid(blue))
	p2.Legend.Add("p99", solid(amber))
	goalLine(p2, 0.5, "goal: per act p50 < 0.5 ms", red)
	goalLine(p2, 1, "goal: barrier p50 < 1 ms", plum)
	p2.NominalX(names...)
	p2.Y.Min, p2.Y.Max = 0, 1.35*maxOf(p99, 1)
	p2.Y.Tick.Marker = evenTicks{}

	// 3: eager.
	p3 := plot.New()
	p3.Title.Text = "eager: makespan ÷ critical path" + suffix
	p3.Y.Label.Text = "makespan ÷ critical path"
	var means, p95s plotter.Values
	names = nil
	for _, e := range r.Eager {
		means, p95s = append(means, e.MeanRatio), append(p95s, e.P95Ratio)
		names = append(names, fmt.Sprintf("%d in flight", e.InFlight))
	}
	if err := bars(p3, means, blue, -w/2, w); err != nil {
		return err
	}
	if err := bars(p3, p95s, amber, w/2, w); err != nil {
		return err
	}
	p3.Legend.Add("mean", solid(blue))
	p3.Legend.Add("p95", solid(amber))
	p3.NominalX(names...)
	goalLine(p3, 1.05, "goal: mean ≤ 1.05 (64 in flight)", red)
	p3.Y.Min, p3.Y.Max = 0, 1.35*maxOf(p95s, 1.05)
	p3.Y.Tick.Marker = evenTicks{}

	img := vgimg.New(18*vg.Inch, 5.5*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 3, PadX: vg.Millimeter * 8, PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	for i, p := range []*plot.Plot{p1, p2, p3} {
		p.Draw(tiles.At(dc, i, 0))
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func bars(p *plot.Plot, v plotter.Values, c color.Color, offset, width vg.Length) error {
	if len(v) == 0 {
		return nil
	}
	clean := make(plotter.Values, len(v))
	for i, x := range v {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			clean[i] = math.Max(x, 0)
		}
	}
	b, err := plotter.NewBarChart(clean, width)
	if err != nil {
		return err
	}
	b.Color, b.LineStyle.Width, b.Offset = c, 0, offset
	p.Add(b)
	return nil
}

func solid(c color.Color) plot.Thumbnailer {
	b, _ := plotter.NewBarChart(plotter.Values{1}, 1)
	b.Color, b.LineStyle.Width = c, 0
	return b
}

func maxOf(v plotter.Values, floor float64) float64 {
	m := floor
	for _, x := range v {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			m = math.Max(m, x)
		}
	}
	return m
}

func goalLine(p *plot.Plot, y float64, label string, c color.Color) {
	f := plotter.NewFunction(func(float64) float64 { return y })
	f.Color, f.Width, f.Dashes = c, vg.Points(1.5), []vg.Length{vg.Points(5), vg.Points(3)}
	p.Add(f)
	p.Legend.Add(label, f)
	p.Legend.Top = true
}

// evenTicks labels about six evenly spaced round values.
type evenTicks struct{}

func (evenTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return nil
	}
	raw := (hi - lo) / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+step/1e6; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', 6, 64)})
	}
	return ticks
}
