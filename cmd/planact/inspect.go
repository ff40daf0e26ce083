package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/view"
)

// runInspect prints what planact's streams hold of a rollout (its episodes,
// each turn's plan with node statuses and timings) or of one episode (its
// turns, plan and act timeline, critical path), or either as a Graphviz
// graph with --dot.
func runInspect(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var conn bus.ConnOptions
	conn.AddFlags(fs, "")
	dot := fs.Bool("dot", false, "print the plans as a Graphviz digraph (planact inspect --dot N E | dot -Tsvg > e.svg)")
	status := fs.String("status", "", "only episodes in this status: "+strings.Join(view.EpisodeStatuses, ", "))
	lowest := fs.Int("lowest", 0, "only the N ended episodes with the lowest rewards, lowest first")
	wait := fs.Duration("timeout", 30*time.Second, "how long inspect may take: reading the streams' history, and the episodes it reads again")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: planact inspect [flags] <rollout> [episode]")
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 1 || len(pos) > 2 {
		fs.Usage()
		return fmt.Errorf("inspect: name a rollout, and optionally one of its episodes")
	}
	n, err := strconv.ParseInt(pos[0], 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("inspect: rollout %q: want a rollout id (a number ≥ 0)", pos[0])
	}
	episode := -1
	if len(pos) == 2 {
		if episode, err = strconv.Atoi(pos[1]); err != nil || episode < 0 {
			return fmt.Errorf("inspect: episode %q: want an episode index (a number ≥ 0)", pos[1])
		}
		if *status != "" || *lowest != 0 {
			return fmt.Errorf("inspect: --status and --lowest pick episodes of a rollout; an episode is named")
		}
	}
	q := url.Values{}
	if *status != "" {
		q.Set("status", *status)
	}
	if *lowest != 0 {
		q.Set("lowest", strconv.Itoa(*lowest))
	}
	filter, err := view.ParseFilter(q)
	if err != nil {
		return fmt.Errorf("inspect: --%w", err)
	}
	if *wait <= 0 {
		return fmt.Errorf("inspect: --timeout %v: want a positive duration", *wait)
	}

	conn, err = conn.Resolve(getenv)
	if err != nil {
		return err
	}
	nc, err := conn.Dial("planact-inspect")
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	defer nc.Close()
	rctx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	// A read the viewer may do (a direct get on ROLLOUT), so that inspect
	// runs as a read-only user.
	if _, err := bus.LastSeqUntil(rctx, nc, bus.StreamRollout, fmt.Sprintf("rollout.%d.>", n)); err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("inspect: no planact here: the server has no %s stream with direct reads (start planact: planact up, or planact provision and planact serve …): %w", bus.StreamRollout, err)
		}
		return fmt.Errorf("inspect: is planact there? %w", err)
	}
	r, err := view.Open(rctx, nc)
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	defer r.Close()
	if err := r.Synced(rctx); err != nil {
		return fmt.Errorf("inspect: %w (raise --timeout for a long history)", err)
	}

	inspectHistoryRead()
	// What it prints holds what trainers and their engines wrote.
	stdout = textWriter{stdout}

	// rctx bounds what follows too: the episodes of a rollout that the view
	// no longer holds in memory are read again from the streams.
	ro, err := r.RolloutContext(rctx, n, filter)
	if errors.Is(err, view.ErrNotFound) {
		return fmt.Errorf("inspect: rollout %d: the streams hold nothing of it (%s)", n, heldRollouts(r.Rollouts()))
	}
	if err != nil {
		return inspectErr(err)
	}
	if episode >= 0 {
		ep, err := r.EpisodeContext(rctx, n, episode)
		if errors.Is(err, view.ErrNotFound) {
			return fmt.Errorf("inspect: %w (rollout %d has %d episodes)", err, n, ro.Episodes)
		}
		if err != nil {
			return inspectErr(err)
		}
		if *dot {
			return writeDot(stdout, fmt.Sprintf("rollout %d episode %d", n, episode), []*view.Episode{ep})
		}
		printEpisode(stdout, ep)
		return nil
	}
	eps := make([]*view.Episode, 0, len(ro.EpisodeList))
	for _, es := range ro.EpisodeList {
		ep, err := r.EpisodeContext(rctx, n, es.Episode)
		if err != nil {
			return inspectErr(err)
		}
		eps = append(eps, ep)
	}
	if *dot {
		return writeDot(stdout, fmt.Sprintf("rollout %d", n), eps)
	}
	printRollout(stdout, ro, eps)
	return nil
}

// inspectHistoryRead is called once inspect has read the streams' history;
// tests stop the server there.
var inspectHistoryRead = func() {}

// inspectErr is a read that failed after the history was read: the
// deadline, an interrupt, or the server.
func inspectErr(err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("inspect: %w (raise --timeout)", err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("inspect: interrupted: %w", err)
	}
	return fmt.Errorf("inspect: %w", err)
}

// heldRollouts says which rollouts the streams hold, for an error.
func heldRollouts(rs []view.RolloutSummary) string {
	if len(rs) == 0 {
		return "they hold no rollout"
	}
	lo, hi := rs[0].Rollout, rs[0].Rollout
	for _, r := range rs {
		lo, hi = min(lo, r.Rollout), max(hi, r.Rollout)
	}
	return fmt.Sprintf("they hold %d rollouts, from %d to %d", len(rs), lo, hi)
}

// printRollout writes ro with its episodes (eps: those of ro.EpisodeList,
// in full, in its order).
func printRollout(w io.Writer, ro *view.Rollout, eps []*view.Episode) {
	status, reason := ro.Ending() // each role's result when they differ, as watch says it
	fmt.Fprintf(w, "rollout %d: %s", ro.Rollout, status)
	if reason != "" {
		fmt.Fprintf(w, " (%s)", reason)
	}
	fmt.Fprintf(w, ", %d/%d episodes ended, wall %s\n", ro.Ended, ro.Episodes, ms(ro.WallMs))
	fmt.Fprintf(w, "acts: %d done, %d failed, %d cached, %d skipped, %d running\n", ro.Acts.Done, ro.Acts.Failed, ro.Acts.Cached, ro.Acts.Skipped, ro.Acts.Running)
	if ro.Accuracy != nil {
		fmt.Fprintf(w, "accuracy %.3f", *ro.Accuracy)
		if ro.MeanReward != nil {
			fmt.Fprintf(w, ", mean reward %.3f", *ro.MeanReward)
		}
		fmt.Fprintln(w)
	}
	for _, role := range slices.Sorted(maps.Keys(ro.WeightVersions)) { // the same order each time
		fmt.Fprintf(w, "%s weights: %s\n", role, strings.Join(ro.WeightVersions[role], ", "))
	}
	if ro.Filter.Status != "" || ro.Filter.Lowest > 0 {
		fmt.Fprintf(w, "episodes shown: %s\n", describeFilter(ro.Filter))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "episode\tstatus\treward\tturns\tacts\twall\tanswer\tplans: node(status duration)")
	for i, es := range ro.EpisodeList {
		reward := "-"
		if es.Reward != nil {
			reward = fmt.Sprintf("%.3f", *es.Reward)
		}
		acts := es.Acts.Done + es.Acts.Failed + es.Acts.Cached
		var plans []string
		if i < len(eps) {
			ep := eps[i]
			for _, t := range ep.TurnList {
				plans = append(plans, fmt.Sprintf("t%d: %s", t.Turn, compactPlan(t, ep)))
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", es.Episode, es.Status, reward, es.Turns, acts, ms(es.WallMs),
			clip(strings.Join(es.Answers, " | "), 30), strings.Join(plans, "; "))
	}
	tw.Flush()
}

func describeFilter(f view.Filter) string {
	var parts []string
	if f.Status != "" {
		parts = append(parts, "status "+f.Status)
	}
	if f.Lowest > 0 {
		parts = append(parts, fmt.Sprintf("the %d with the lowest rewards", f.Lowest))
	}
	return strings.Join(parts, ", ")
}

// compactPlan is a turn in a few words: its outcome, or its nodes with
// their statuses and how long each ran.
func compactPlan(t view.Turn, ep *view.Episode) string {
	switch t.Outcome {
	case view.OutcomeAnswer:
		return "answer " + clip(strings.Join(t.Answers, " | "), 30)
	case view.OutcomeError:
		return "error " + clip(t.Error, 40)
	case "":
		return "planner writing"
	}
	acts := timeline(ep)
	var nodes []string
	for _, n := range t.Graph.Nodes {
		s := n.ID
		if len(n.Deps) > 0 {
			s += "<-" + strings.Join(n.Deps, ",")
		}
		s += "(" + n.Status
		if a, ok := acts[n.Key]; ok && a.StartedMs > 0 && a.EndedMs >= a.StartedMs {
			s += " " + ms(a.EndedMs-a.StartedMs)
		}
		nodes = append(nodes, s+")")
	}
	return strings.Join(nodes, " ")
}

func timeline(ep *view.Episode) map[string]view.Act {
	out := make(map[string]view.Act, len(ep.Timeline))
	for _, a := range ep.Timeline {
		out[a.Key] = a
	}
	return out
}

func printEpisode(w io.Writer, ep *view.Episode) {
	fmt.Fprintf(w, "rollout %d episode %d: %s", ep.Rollout, ep.Episode, ep.Status)
	if ep.Reason != "" {
		fmt.Fprintf(w, " (%s)", ep.Reason)
	}
	fmt.Fprintf(w, ", %d turns, wall %s", ep.Turns, ms(ep.WallMs))
	if ep.Reward != nil {
		fmt.Fprintf(w, ", reward %.3f", *ep.Reward)
	}
	fmt.Fprintln(w)
	if ep.Question != "" {
		fmt.Fprintf(w, "question: %s\n", clip(ep.Question, 200))
	}
	if ep.Label != "" || len(ep.Answers) > 0 {
		fmt.Fprintf(w, "answer:   %q (label %q)\n", ep.Answers, ep.Label)
	}
	acts := timeline(ep)
	for _, t := range ep.TurnList {
		fmt.Fprintf(w, "\nturn %d: %s", t.Turn, cmpOr(t.Outcome, "planner writing"))
		if t.WeightVersion != "" {
			fmt.Fprintf(w, ", weights %s", t.WeightVersion)
		}
		fmt.Fprintf(w, ", planner %s\n", ms(t.LatencyMs))
		if t.Prompt != "" {
			fmt.Fprintf(w, "  prompt:      %s\n", clip(t.Prompt, 160))
		}
		fmt.Fprintf(w, "  output:      %s\n", clip(t.Output, 160))
		if t.Error != "" {
			fmt.Fprintf(w, "  error:       %s\n", t.Error)
		}
		if t.Observation != "" {
			fmt.Fprintf(w, "  observation: %s\n", clip(t.Observation, 160))
		}
		if len(t.Graph.Nodes) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  node\tdeps\ttool\tstatus\treleased\tstarted\tended\tattempts\treplica\tcritical\tinput → output")
		for _, n := range t.Graph.Nodes {
			a := acts[n.Key]
			crit := ""
			if n.Critical {
				crit = "*"
			}
			out := n.Output
			if n.Error != "" {
				out = "error: " + n.Error
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s → %s\n", n.ID, cmpOr(strings.Join(n.Deps, ","), "-"), n.Tool, n.Status,
				at(a.ReleasedMs, ep.StartMs), at(a.StartedMs, ep.StartMs), at(a.EndedMs, ep.StartMs), a.Attempts, cmpOr(a.Replica, "-"), crit,
				clip(n.Input, 40), clip(out, 40))
		}
		tw.Flush()
	}
	if len(ep.CriticalPath) > 0 {
		fmt.Fprintf(w, "\ncritical path: %s\n", strings.Join(ep.CriticalPath, " → "))
	}
	fmt.Fprintln(w, "(times are from the episode's first plan request)")
}

// at is a time of the episode's timeline, from its origin.
func at(t, origin int64) string {
	if t == 0 {
		return "-"
	}
	return "+" + ms(t-origin)
}

func ms(v int64) string { return (time.Duration(v) * time.Millisecond).String() }

func cmpOr(s, or string) string {
	if s == "" {
		return or
	}
	return s
}

// writeDot writes the episodes' plans as one Graphviz digraph: a cluster
// per episode and turn, nodes coloured by status, the critical path bold.
func writeDot(w io.Writer, title string, eps []*view.Episode) error {
	colour := map[string]string{
		"done": "palegreen", "failed": "salmon", "skipped": "lightgrey", "cached": "lightblue",
		view.ActRunning: "gold", view.ActPending: "white",
	}
	var b strings.Builder
	fmt.Fprintf(&b, "digraph planact {\n  label=%q;\n  rankdir=LR;\n  node [shape=box, style=filled, fontname=\"Helvetica\"];\n", title)
	for _, ep := range eps {
		for _, t := range ep.TurnList {
			if len(t.Graph.Nodes) == 0 {
				continue
			}
			fmt.Fprintf(&b, "  subgraph \"cluster_e%d_t%d\" {\n    label=%q;\n", ep.Episode, t.Turn,
				fmt.Sprintf("episode %d, turn %d", ep.Episode, t.Turn))
			for _, n := range t.Graph.Nodes {
				c, ok := colour[n.Status]
				if !ok {
					c = "white"
				}
				style := "filled"
				if n.Critical {
					style = "filled,bold"
				}
				fmt.Fprintf(&b, "    %q [label=%q, fillcolor=%q, style=%q];\n", dotID(ep.Episode, n.Key),
					fmt.Sprintf("%s: %s\n%s\n%s", n.ID, n.Tool, clip(n.Input, 30), n.Status), c, style)
			}
			b.WriteString("  }\n")
			for _, e := range t.Graph.Edges {
				fmt.Fprintf(&b, "  %q -> %q;\n", dotID(ep.Episode, subject.NodeKey(t.Turn, e.From)), dotID(ep.Episode, subject.NodeKey(t.Turn, e.To)))
			}
		}
	}
	b.WriteString("}\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func dotID(e int, key string) string { return fmt.Sprintf("e%d/%s", e, key) }
