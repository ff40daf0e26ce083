package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/stacktest"
	"github.com/planact/planact/internal/web"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/view"
)

// openView opens a view of the rollouts at url for the test, its history read.
func openView(t *testing.T, url string) *view.Reader {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := view.Open(ctx, bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if err := r.Synced(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

// serve runs the web view of the rollouts at url for the test.
func serve(t *testing.T, url string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(web.New(openView(t, url)))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

func TestEndpoints(t *testing.T) {
	env := stacktest.Start(t, sim.Config{Seed: 1}, sim.Config{Seed: 2})
	env.Begin(t, 4, stacktest.Tasks(2, 1, 1), nil)
	env.Wait(t, 4)
	srv := serve(t, env.URL)

	code, body := get(t, srv.URL+"/api/rollouts")
	var list []view.RolloutSummary
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil || len(list) != 1 || list[0].Rollout != 4 || list[0].Ended != 2 {
		t.Fatalf("/api/rollouts: %d %v %s", code, err, body)
	}
	code, body = get(t, srv.URL+"/api/rollouts/4?status=completed")
	var ro view.Rollout
	if err := json.Unmarshal([]byte(body), &ro); code != 200 || err != nil || ro.Filter.Status != "completed" {
		t.Fatalf("/api/rollouts/4: %d %v %s", code, err, body)
	}
	code, body = get(t, srv.URL+"/api/rollouts/4/episodes/1")
	var ep view.Episode
	if err := json.Unmarshal([]byte(body), &ep); code != 200 || err != nil || ep.Episode != 1 || len(ep.TurnList) == 0 {
		t.Fatalf("/api/rollouts/4/episodes/1: %d %v %s", code, err, body)
	}
	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/api/rollouts/x", 400, `rollout \"x\"`},
		{"/api/rollouts/5", 404, "rollout 5: not found"},
		{"/api/rollouts/4/episodes/9", 404, "episode 9: not found"},
		{"/api/rollouts/4/episodes/-1", 400, `episode \"-1\"`},
		{"/api/rollouts/4?lowest=0", 400, `lowest \"0\"`},
		{"/api/rollouts/4/events?status=nope", 400, `status \"nope\"`},
		{"/rollouts/5", 404, "rollout 5: not found"},
		{"/rollouts/4/episodes/x", 400, "episode &#34;x&#34;"},
		{"/", 200, `data-page="rollouts"`},
		{"/rollouts/4", 200, `data-page="rollout"`},
		{"/rollouts/4/episodes/0", 200, "cytoscape.min.js"},
		{"/static/js/episode.js", 200, "cytoscape("},
		{"/static/vendor/chart.js/chart.umd.min.js", 200, "Chart"},
	} {
		code, body := get(t, srv.URL+c.path)
		if code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %.300s, want %d and %q", c.path, code, body, c.code, c.want)
		}
	}

	// The events stream starts with what the JSON endpoint answers.
	res, err := http.Get(srv.URL + "/api/rollouts/4/events")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("events content type %q", ct)
	}
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") || !json.Valid([]byte(strings.TrimPrefix(line, "data: "))) || !strings.Contains(line, `"rollout":4`) {
		t.Errorf("first event %q %v", line, err)
	}
}

func TestListen(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	if _, err := web.Listen(addr); err == nil || !strings.Contains(err.Error(), addr+" is already in use") {
		t.Errorf("address in use: %v", err)
	}
	if _, err := web.Listen("8080"); err == nil || !strings.Contains(err.Error(), `address "8080": want host:port`) {
		t.Errorf("no port: %v", err)
	}
}

// TestReadAgainEndsWithTheRequest: a page or endpoint of a rollout the view
// dropped from memory reads it again from the streams; when the request
// ends (its client went away, the events stream was closed), so does that
// read, rather than going on for 30 s against a server that does not
// answer.
func TestReadAgainEndsWithTheRequest(t *testing.T) {
	env := stacktest.Start(t, sim.Config{Seed: 1}, sim.Config{Seed: 2})
	for n := int64(1); n <= 2; n++ {
		env.Begin(t, n, stacktest.Tasks(2, 1, n), nil)
		env.Wait(t, n)
	}
	proxy := bustest.StartProxy(t, env.URL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := view.OpenWith(ctx, bustest.Conn(t, proxy.URL), view.Options{KeepFull: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if err := r.Synced(ctx); err != nil {
		t.Fatal(err)
	}
	// Rollout 1 is compacted once a read of it needs the streams: one
	// with a context that has ended fails.
	ended, end := context.WithCancel(context.Background())
	end()
	for {
		if _, err := r.RolloutContext(ended, 1, view.Filter{}); err != nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("rollout 1 was never compacted")
		case <-time.After(20 * time.Millisecond):
		}
	}
	proxy.Freeze()
	defer proxy.Thaw()
	h := web.New(r)
	for _, path := range []string{"/api/rollouts/1", "/api/rollouts/1/episodes/0", "/rollouts/1", "/rollouts/1/episodes/0"} {
		reqCtx, leave := context.WithCancel(context.Background())
		rec := httptest.NewRecorder()
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil).WithContext(reqCtx))
		}()
		leave() // the client goes away
		<-done
		if body := rec.Body.String(); !strings.Contains(body, context.Canceled.Error()) {
			t.Errorf("%s, its client gone while the server is silent: %d %.300s; want the read ended with the request (%v)", path, rec.Code, body, context.Canceled)
		}
	}
}
