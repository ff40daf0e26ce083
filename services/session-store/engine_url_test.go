package sessionstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestAnEngineURLNoGatewayCanReachIsRefused: an arrival whose engine url is
// not an http or https URL with a host (the scheme left out, the commonest
// slip) was taken: the rollout started, and every generation failed on it,
// an engine "down", minutes later and far from the field at fault. Now the
// arrival is refused at once, naming engine.url and its value, and nothing
// of it is recorded; a URL a gateway can reach is taken as before.
func TestAnEngineURLNoGatewayCanReachIsRefused(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tasks := []schema.Task{{Prompt: "p", Label: "l"}}
	for i, c := range []struct{ url, want string }{
		{"planner-router:30000", `engine.url "planner-router:30000": want an http or https URL: "http://planner-router:30000", say`},
		{"127.0.0.1:30000", `engine.url "127.0.0.1:30000": want an http or https URL`},
		{"ftp://planner-router:30000", `engine.url "ftp://planner-router:30000": scheme "ftp": want http or https`},
		{"http://", `engine.url "http://": the URL names no host`},
	} {
		n := int64(1400 + i)
		a := delivered(t, b, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: c.url}, Tasks: tasks})
		if err := s.handle(ctx, a); err != nil {
			t.Fatalf("engine url %q: %v; want the arrival answered", c.url, err)
		}
		m, err := b.LastMsg(ctx, bus.StreamRollout, subject.Rejected(n, schema.RolePlanner))
		if err != nil {
			t.Fatal(err)
		}
		var r schema.Result
		if m != nil {
			if err := schema.Unmarshal(m.Data, &r); err != nil {
				t.Fatal(err)
			}
		}
		if m == nil || r.ArrivalID != a.ID() || !strings.Contains(r.Reason, c.want) {
			t.Errorf("engine url %q: rejection %+v; want one of arrival %s saying %q", c.url, r, a.ID(), c.want)
		}
		if _, _, found, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n)); err != nil || found {
			t.Errorf("engine url %q: a session was recorded (%v)", c.url, err)
		}
	}

	// A URL a gateway can reach is taken.
	for i, u := range []string{"http://planner-router:30000", "https://planner.example/v1"} {
		n := int64(1410 + i)
		if err := s.handle(ctx, delivered(t, b, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: u}, Tasks: tasks})); err != nil {
			t.Fatalf("an arrival with engine url %q: %v", u, err)
		}
		sess, _, found, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
		if err != nil || !found || sess.Roles[schema.RolePlanner].Engine.URL != u {
			t.Errorf("engine url %q: session %+v (%v); want the arrival recorded", u, sess, err)
		}
	}
}
