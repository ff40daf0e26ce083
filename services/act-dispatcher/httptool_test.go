package actdispatcher

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

// An HTTP tool's answer is the act's output whole, or the act fails saying
// why: an answer longer than MaxToolAnswer, or a status that is no answer
// (a redirect the client did not follow). Before, the first was cut at
// 1 MiB and the second's body taken, each as if the tool had answered it.
func TestAnHTTPToolsAnswerIsWholeOrAnError(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   string // the output, when err is ""
		err    string
	}{
		{"at the limit", http.StatusOK, strings.Repeat("a", MaxToolAnswer), strings.Repeat("a", MaxToolAnswer), ""},
		{"past the limit", http.StatusOK, strings.Repeat("a", MaxToolAnswer+1), "", "longer than 1048576 bytes"},
		{"not modified", http.StatusNotModified, "", "", "HTTP 304 Not Modified"},
		{"multiple choices", http.StatusMultipleChoices, "pick one", "", "HTTP 300 Multiple Choices"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			s := &Service{Deps: Deps{HTTP: srv.Client()}}
			out, err := s.callHTTP(context.Background(), schema.Tool{Name: "retrieve", Kind: schema.ToolHTTP, URL: srv.URL}, "x")
			if tc.err == "" {
				if err != nil || out != tc.want {
					t.Fatalf("output of %d bytes, %v; want %d bytes", len(out), err, len(tc.want))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || fail.IsRetryable(err) {
				t.Fatalf("output of %d bytes, error %v; want an error that is not tried again, saying %q", len(out), err, tc.err)
			}
		})
	}
}
