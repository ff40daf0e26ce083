package actdispatcher

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

// TestAnHTTPToolIsNotRedirectedAway: an HTTP tool that redirected had its
// request followed anywhere: to another host, which was sent the act's
// input and whose answer became the act's output, and, on a 302, as a GET
// without the body, whose page became the output. Only a redirect that
// keeps the POST (307, 308) to the same scheme and host is followed; any
// other fails the act, not tried again, naming where it pointed.
func TestAnHTTPToolIsNotRedirectedAway(t *testing.T) {
	var away atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		away.Add(1)
		_, _ = w.Write([]byte("another host's passages"))
	}))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/away":
			http.Redirect(w, r, other.URL+"/search", http.StatusTemporaryRedirect)
		case r.URL.Path == "/get":
			http.Redirect(w, r, "/search", http.StatusFound)
		case r.URL.Path == "/moved":
			http.Redirect(w, r, "/search", http.StatusPermanentRedirect)
		case r.Method != http.MethodPost:
			_, _ = w.Write([]byte("a page for a GET"))
		default:
			var req struct{ Queries []string }
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Queries) != 1 {
				http.Error(w, "no query", http.StatusBadRequest)
				return
			}
			_, _ = w.Write([]byte("passages for " + req.Queries[0]))
		}
	}))
	defer srv.Close()
	s := &Service{Deps: Deps{HTTP: &http.Client{}}}
	for _, path := range []string{"/away", "/get"} {
		out, err := s.callHTTP(context.Background(), schema.Tool{Name: "retrieve", Kind: schema.ToolHTTP, URL: srv.URL + path}, "x")
		if err == nil || fail.IsRetryable(err) || !strings.Contains(err.Error(), "/search") {
			t.Errorf("%s: output %q, error %v; want an error not tried again, naming where the tool redirected", path, out, err)
		}
	}
	if n := away.Load(); n != 0 {
		t.Errorf("the other host was asked %d times", n)
	}
	if out, err := s.callHTTP(context.Background(), schema.Tool{Name: "retrieve", Kind: schema.ToolHTTP, URL: srv.URL + "/moved"}, "x"); err != nil || out != "passages for x" {
		t.Errorf("a 308 to the same host: %q, %v; want the tool's answer", out, err)
	}
}
