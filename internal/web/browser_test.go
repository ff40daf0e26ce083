package web_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/planact/planact/internal/stacktest"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// browser finds Chromium or Chrome on PATH, or skips the test.
func browser(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Skip("no Chromium on PATH (looked for chromium, chromium-browser, google-chrome): install it (apt-get install chromium) to run the web view's browser test")
	return ""
}

// screenshots is where the test writes its screenshots: $PLANACT_SCREENSHOTS
// (relative to this package's directory, where go test runs it, so give an
// absolute path) or a temporary directory.
func screenshots(t *testing.T) string {
	dir := os.Getenv("PLANACT_SCREENSHOTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestBrowser opens the three pages in headless Chromium while a rollout
// runs: the pages raise no error, the Rollouts page follows the rollout's
// progress without reloading, and the Episode page draws every node of
// its plans and every act on its timeline.
func TestBrowser(t *testing.T) {
	chrome := browser(t)
	dir := screenshots(t)
	// Engines slow enough that the rollout is seen running for a while.
	env := stacktest.Start(t,
		sim.Config{Seed: 1, TTFT: 300 * time.Millisecond, PerToken: 2 * time.Millisecond, PlannerStepwise: 0.5},
		sim.Config{Seed: 2, TTFT: 400 * time.Millisecond, PerToken: 3 * time.Millisecond, ActorErrorRate: 0.2})
	// A finished rollout first, so the list has history.
	env.Begin(t, 1, stacktest.Tasks(2, 1, 1), nil)
	env.Wait(t, 1)
	srv := serve(t, env.URL)

	actx, cancel := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-dev-shm-usage", true))...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start %s: %v", chrome, err)
	}
	var mu sync.Mutex
	var problems []string
	go func() {
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("%s: %s (%s:%d)", m.Type, m.Text, m.URL, m.Line))
				mu.Unlock()
			}
		}
	}()
	checkConsole := func(page string) {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range problems {
			t.Errorf("%s page: %s", page, p)
		}
		problems = nil
	}
	// Every wait has a generous deadline: the machine may be busy.
	wait := func(what, expr string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
			if err == nil && ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: still not true after 2 minutes: %s (%v)", what, expr, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	shoot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot %s", filepath.Join(dir, name))
	}

	// Rollouts: the running rollout's progress moves live.
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	wait("rollout 1 listed", `document.querySelector('tr[data-rollout="1"]') !== null`)
	// A mark that a reload would wipe out.
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.notReloaded = true`)); err != nil {
		t.Fatal(err)
	}
	const tasks = 8
	env.Begin(t, 2, stacktest.Tasks(tasks, 1, 2), &schema.Config{MaxTurns: 3})
	// The progress cell goes from "0 / 8" through some "k / 8" to "8 / 8":
	// seen part-way without the page reloading, it is live.
	progress := `(document.querySelector('tr[data-rollout="2"] td.progress') || {}).textContent || ""`
	var seen []string
	deadline := time.Now().Add(3 * time.Minute)
	for {
		p, err := chromedp.Run(ctx, chromedp.Evaluate[string](progress))
		if err != nil {
			t.Fatal(err)
		}
		if p != "" && (len(seen) == 0 || seen[len(seen)-1] != p) {
			seen = append(seen, p)
		}
		var ended, total int
		if _, err := fmt.Sscanf(p, "%d / %d", &ended, &total); err == nil && total == tasks && ended > 0 && ended < tasks {
			break
		}
		if time.Now().After(deadline) || p == fmt.Sprintf("%d / %d", tasks, tasks) {
			t.Fatalf("never saw rollout 2 part-way done; its progress went %q", seen)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(seen) < 2 {
		t.Errorf("progress seen only as %q: want it to change live", seen)
	}
	wait("no reload", `window.notReloaded === true && window.planactUpdates > 1`)
	shoot("rollouts.png")
	checkConsole("Rollouts")

	// Rollout: every episode listed, and the rollout followed to its end.
	if err := chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/rollouts/2", srv.URL))); err != nil {
		t.Fatal(err)
	}
	wait("episodes listed", fmt.Sprintf(`document.querySelectorAll('#episodes tbody tr').length === %d`, tasks))
	shoot("rollout.png")
	wait("rollout 2 followed to its end", fmt.Sprintf(`document.querySelector('.facts').textContent.includes('%d / %d')`, tasks, tasks))
	checkConsole("Rollout")

	// Episode: the one with the widest plan; every node drawn, every act on
	// the timeline.
	env.Wait(t, 2)
	e, nodes, acts := widest(t, env.URL, 2, tasks)
	if err := chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/rollouts/2/episodes/%d", srv.URL, e))); err != nil {
		t.Fatal(err)
	}
	wait("every node drawn", fmt.Sprintf(`window.planactGraphs && Object.values(window.planactGraphs).reduce((n, cy) => n + cy.nodes().length, 0) === %d`, nodes))
	wait("every act on the timeline", fmt.Sprintf(`window.planactTimeline !== null && window.planactTimeline.data.labels.length === %d`, acts))
	drawn, err := chromedp.Run(ctx, chromedp.Evaluate[int](`[...document.querySelectorAll('.graph')].reduce((n, g) => n + Number(g.dataset.nodes || 0), 0)`))
	if err != nil || drawn != nodes {
		t.Errorf("graphs' data-nodes add up to %d (%v), want %d", drawn, err, nodes)
	}
	critical, err := chromedp.Run(ctx, chromedp.Evaluate[int](`Object.values(window.planactGraphs).reduce((n, cy) => n + cy.nodes('[?critical]').length, 0)`))
	if err != nil || critical == 0 {
		t.Errorf("no node marked on the critical path (%v)", err)
	}
	shoot("episode.png")
	checkConsole("Episode")
}

// widest finds the episode of rollout n whose turns have the most plan
// nodes, and returns it with its node and act counts.
func widest(t *testing.T, url string, n int64, episodes int) (e, nodes, acts int) {
	t.Helper()
	r := openView(t, url)
	for i := 0; i < episodes; i++ {
		ep, err := r.Episode(n, i)
		if err != nil {
			t.Fatal(err)
		}
		count := 0
		for _, turn := range ep.TurnList {
			count += len(turn.Graph.Nodes)
		}
		if count > nodes {
			e, nodes, acts = i, count, len(ep.Timeline)
		}
	}
	if nodes == 0 {
		t.Fatalf("no episode of rollout %d has a plan", n)
	}
	return e, nodes, acts
}
