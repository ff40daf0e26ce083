package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/planact/planact/internal/stacktest"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/view"
)

// TestTokenDriftShown: episodes quarantined for token drift (an actor
// engine that takes a BOS before the ids it is sent from an episode's third
// act on) are shown as such: the view counts them on the rollout, lists
// them with status quarantined and the reason (token_drift, the act, the
// counts), and filters them by that status; in a browser, the Rollouts
// page says how many were quarantined and the Rollout page shows the count,
// their badges and reasons.
func TestTokenDriftShown(t *testing.T) {
	env := stacktest.Start(t, sim.Config{Seed: 23}, sim.Config{Seed: 24, DriftFrom: 3})
	const n, tasks = 6, 12
	env.Begin(t, n, stacktest.Tasks(tasks/2, 2, n), nil)
	res := env.Wait(t, n)
	quarantined := res.Stats.EpisodeStatus[schema.EpisodeQuarantined]
	if quarantined == 0 || quarantined == tasks {
		t.Fatalf("%d of %d episodes quarantined: the rollout shows nothing (%s)", quarantined, tasks, res.Reason)
	}
	srv := serve(t, env.URL)
	code, body := get(t, fmt.Sprintf("%s/api/rollouts/%d?status=quarantined", srv.URL, n))
	var ro view.Rollout
	if err := json.Unmarshal([]byte(body), &ro); code != 200 || err != nil {
		t.Fatalf("/api/rollouts/%d: %d %v %s", n, code, err, body)
	}
	if ro.Quarantined != quarantined || len(ro.EpisodeList) != quarantined {
		t.Fatalf("view: %d quarantined, %d listed with status quarantined; the result says %d", ro.Quarantined, len(ro.EpisodeList), quarantined)
	}
	for _, e := range ro.EpisodeList {
		if e.Status != schema.EpisodeQuarantined || !strings.HasPrefix(e.Reason, "token_drift: act ") || !strings.Contains(e.Reason, "prompt tokens (prompt_tokens)") {
			t.Errorf("episode %d: %s (%s): want quarantined, saying where it drifted", e.Episode, e.Status, e.Reason)
		}
	}

	chrome := browser(t)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-dev-shm-usage", true))...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
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
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	wait("the Rollouts page counts the quarantined episodes", fmt.Sprintf(
		`(document.querySelector('tr[data-rollout="%d"] td.progress') || {textContent: ""}).textContent.includes('%d quarantined (token drift)')`, n, quarantined))
	if err := chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/rollouts/%d", srv.URL, n))); err != nil {
		t.Fatal(err)
	}
	wait("the Rollout page counts them", fmt.Sprintf(`(document.getElementById('quarantined') || {}).textContent === '%d'`, quarantined))
	wait("and lists each with its badge and reason", fmt.Sprintf(
		`[...document.querySelectorAll('#episodes tbody tr')].filter((tr) => tr.querySelector('.badge.quarantined') && tr.textContent.includes('token_drift: act ')).length === %d`, quarantined))
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(screenshots(t), "drift.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", path)
}
