package main

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var (
	blue  = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	amber = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	green = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	red   = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	plum  = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
	grey  = color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}
)

// plot draws four panels over the step's time: engine utilisation,
// generations waiting for a slot, episodes in flight, and CPU cores by
// process group; rollout ends and weight swaps are marked on each.
func (r *Report) plot(path string) error {
	s := r.Series
	at := func(i int) float64 { return (float64(i) + 0.5) * s.BinS }
	xys := func(v []float64, scale float64) plotter.XYs {
		pts := make(plotter.XYs, len(v))
		for i, y := range v {
			pts[i] = plotter.XY{X: at(i), Y: y * scale}
		}
		return pts
	}
	var panels []*plot.Plot
	newPanel := func(title, y string) *plot.Plot {
		p := plot.New()
		p.Title.Text = title
		p.Y.Label.Text = y
		p.X.Label.Text = "s from the first barrier"
		p.X.Min, p.X.Max = 0, r.Run.MakespanS
		p.Legend.Top, p.Legend.Left = true, true
		panels = append(panels, p)
		return p
	}
	line := func(p *plot.Plot, pts plotter.XYs, c color.Color, label string) error {
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color, l.Width = c, vg.Points(1.2)
		p.Add(l)
		p.Legend.Add(label, l)
		return nil
	}
	p1 := newPanel(fmt.Sprintf("engine utilisation (makespan %.0f s, engine-bound lower bound %.0f s, replay without planact %.0f s)",
		r.Run.MakespanS, r.Bound.S, r.Replay.S), "% of the engine's limit in flight")
	if err := line(p1, xys(s.PlannerUtil, 100), blue, fmt.Sprintf("planner (limit %d)", r.Planner.Limit)); err != nil {
		return err
	}
	if err := line(p1, xys(s.ActorUtil, 100), amber, fmt.Sprintf("actor (limit %d)", r.Actor.Limit)); err != nil {
		return err
	}
	p1.Y.Min, p1.Y.Max = 0, 105
	p2 := newPanel("generations waiting for an engine slot", "requests")
	if err := line(p2, xys(s.PlannerWait, 1), blue, "planner"); err != nil {
		return err
	}
	if err := line(p2, xys(s.ActorWait, 1), amber, "actor"); err != nil {
		return err
	}
	p2.Y.Min = 0
	p3 := newPanel("episodes in flight (first generation request → last generation's end)", "episodes")
	if err := line(p3, xys(s.Episodes, 1), green, "episodes"); err != nil {
		return err
	}
	p3.Y.Min = 0
	p4 := newPanel("CPU by process group (from /proc, sampled every 0.5 s)", "cores")
	for _, g := range []struct {
		name string
		c    color.Color
	}{{groupPlanact, blue}, {groupNATS, red}, {groupEngines, grey}, {groupTrainer, plum}} {
		if r.Groups[g.name].Processes == 0 {
			continue // -one-process: the server is in planact's process
		}
		v := s.CoresByGroup[g.name]
		pts := make(plotter.XYs, len(v))
		for i := range v {
			pts[i] = plotter.XY{X: s.SampleS[i], Y: v[i]}
		}
		if len(pts) == 0 {
			continue
		}
		if err := line(p4, pts, g.c, g.name); err != nil {
			return err
		}
	}
	p4.Y.Min = 0
	for _, p := range panels {
		for _, t := range s.RolloutEndS {
			markX(p, t, grey, nil)
		}
		for _, w := range s.PauseWindowsS {
			markX(p, w[0], plum, []vg.Length{vg.Points(2), vg.Points(2)})
			markX(p, w[1], plum, []vg.Length{vg.Points(2), vg.Points(2)})
		}
	}
	img := vgimg.New(14*vg.Inch, 16*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadY: vg.Millimeter * 6, PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3,
		PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 5}
	for i, p := range panels {
		p.Draw(tiles.At(dc, 0, i))
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

// markX draws a vertical line at x across the panel's data range.
func markX(p *plot.Plot, x float64, c color.Color, dashes []vg.Length) {
	lo, hi := p.Y.Min, p.Y.Max
	if hi <= lo {
		hi = lo + 1
	}
	l, err := plotter.NewLine(plotter.XYs{{X: x, Y: lo}, {X: x, Y: hi}})
	if err != nil {
		return
	}
	l.Color, l.Width, l.Dashes = c, vg.Points(0.8), dashes
	p.Add(l)
}
