package sessionstore

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
)

// TestAFilterServersWordsAreKeptShort: what a filter server writes
// becomes the group's reason, recorded in the session (one value for
// every group of the rollout, under the server's max_payload) and given
// to every task of the group in both results. An error page or a judge's
// reasoning of 60 KiB was recorded whole for each group (a few hundred
// groups and no write of the session fit any more: the rollout could not
// end). The page is quoted in part, as a reward server's is, and a reason
// cut, saying how long it was; each still says what happened.
func TestAFilterServersWordsAreKeptShort(t *testing.T) {
	long := strings.Repeat("the judge thinks at length. ", 60<<10/28)
	for _, c := range []struct {
		name   string
		status int
		body   string
		state  string // the group's
		says   []string
	}{
		{"an error page", http.StatusInternalServerError, "<html>" + long + "</html>", schema.GroupDelivered,
			[]string{"kept: the group filter could not be asked: HTTP 500", "<html>the judge thinks"}},
		{"a reply that is not the filter's", http.StatusOK, `{"verdict": "` + long + `"}`, schema.GroupDelivered,
			[]string{"kept: the group filter could not be asked: want {\"keep\": bool", "the judge thinks"}},
		{"a long reason to drop it", http.StatusOK, `{"keep": false, "reason": "` + long + `"}`, schema.GroupFiltered,
			[]string{"filter: the judge thinks", fmt.Sprintf("(%d bytes)", len(long))}},
		{"a long reason to keep it", http.StatusOK, `{"keep": true, "reason": "` + long + `"}`, schema.GroupDelivered,
			[]string{"the judge thinks", fmt.Sprintf("(%d bytes)", len(long))}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(c.status)
				w.Write([]byte(c.body))
			}))
			defer srv.Close()
			cfg := schema.DefaultConfig()
			cfg.GroupFilter = srv.URL
			sess := &schema.Session{Rollout: 9, Config: cfg, Episodes: 2, State: schema.SessionRunning}
			task := schema.Task{GroupIndex: 0, Prompt: "q", Label: "a"}
			eps := map[int]*episode{
				0: ended(task, 0, schema.EpisodeCompleted, 1, true, "x"),
				1: ended(task, 1, schema.EpisodeCompleted, 0, true, "y"),
			}
			gs := (&Service{}).filter(context.Background(), sess, 0, []int{0, 1}, eps)
			if gs.State != c.state {
				t.Errorf("group %s; want %s", gs.State, c.state)
			}
			if len(gs.Reason) > 1<<10 {
				t.Errorf("the group's reason is %d bytes; want at most 1 KiB", len(gs.Reason))
			}
			for _, s := range c.says {
				if !strings.Contains(gs.Reason, s) {
					t.Errorf("reason %.300q…: want it to say %q", gs.Reason, s)
				}
			}
		})
	}
}
