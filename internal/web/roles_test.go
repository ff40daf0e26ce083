package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/view"
)

// TestEachRolesResultShown: the web view showed a finished rollout's
// planner result only, a green "ok" where the actor's result was failed.
// Each role's result has its own status: the JSON lists each (results),
// and in a browser the Rollouts and Rollout pages name each role's status
// with its badge when they differ ("planner ok, actor failed", with
// "actor: why"), as `planact watch` does, and one badge when they agree.
func TestEachRolesResultShown(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "test")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const why = "samples could not be delivered: no store"
	figures := schema.Stats{Episodes: 1, Ended: 1, Accuracy: 1, MeanReward: 1, EpisodeStatus: map[string]int{schema.EpisodeCompleted: 1}}
	var msgs []schema.Message
	for n, actor := range map[int64]*schema.Result{
		1: {Rollout: 1, Role: schema.RoleActor, Status: schema.ResultFailed, Reason: why, Stats: schema.Stats{Episodes: 1}},
		2: {Rollout: 2, Role: schema.RoleActor, Status: schema.ResultOK, Stats: figures},
	} {
		msgs = append(msgs, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner"}, Tasks: []schema.Task{{Prompt: "?", Label: "!"}}},
			&schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor"}},
			&schema.Start{Rollout: n, Episodes: 1},
			&schema.PlanRequest{Rollout: n, Episode: 0, Turn: 1},
			&schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"!"}},
			&schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK, Stats: figures},
			actor)
	}
	if err := b.PublishAll(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	srv := serve(t, url)

	code, body := get(t, srv.URL+"/api/rollouts/1")
	var ro view.Rollout
	if err := json.Unmarshal([]byte(body), &ro); code != 200 || err != nil {
		t.Fatalf("/api/rollouts/1: %d %v %s", code, err, body)
	}
	want := []view.RoleResult{{Role: schema.RolePlanner, Status: schema.ResultOK}, {Role: schema.RoleActor, Status: schema.ResultFailed, Reason: why}}
	if ro.Status != schema.ResultOK || fmt.Sprint(ro.Results) != fmt.Sprint(want) {
		t.Errorf("/api/rollouts/1: status %q, results %+v; want the planner's status, and %+v", ro.Status, ro.Results, want)
	}

	chrome := browser(t)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-dev-shm-usage", true))...)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	wait := func(what, expr string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			ok, err := chromedp.Run(bctx, chromedp.Evaluate[bool](expr))
			if err == nil && ok {
				return
			}
			if time.Now().After(deadline) {
				text, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById('main').textContent`))
				t.Fatalf("%s: still not true after 2 minutes: %s (%v); the page says %q", what, expr, err, text)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	status := func(n int) string {
		return fmt.Sprintf(`(document.querySelector('tr[data-rollout="%d"] td.status') || {textContent: ""})`, n)
	}
	wait("the Rollouts page names each role's result", fmt.Sprintf(
		`%s.textContent === 'planner ok, actor failedactor: %s' && %s.querySelectorAll('.badge.ok').length === 1 && %s.querySelectorAll('.badge.failed').length === 1`,
		status(1), why, status(1), status(1)))
	wait("and the results that agree once", fmt.Sprintf(`%s.textContent === 'ok' && %s.querySelectorAll('.badge').length === 1`, status(2), status(2)))
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/rollouts/1")); err != nil {
		t.Fatal(err)
	}
	wait("the Rollout page names each role's result", fmt.Sprintf(
		`(document.getElementById('status-of-rollout') || {}).textContent === 'planner ok, actor failed' && (document.getElementById('reason-of-rollout') || {}).textContent === 'actor: %s'`, why))
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(screenshots(t), "roles.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", path)
}
