package engine

import (
	"fmt"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/fail"
)

// TestMoreTokensThanAskedAreRefused: a reply of more output ids than the
// request's max_new_tokens passed unnoticed, whatever the protocol: the
// sample held more than the context a gateway fitted max_new_tokens to.
// It is refused for good now, naming both counts; a reply of at most the
// count asked, or to a request that set none, is taken.
func TestMoreTokensThanAskedAreRefused(t *testing.T) {
	for _, tc := range []struct {
		maxNew int
		refuse bool
	}{
		{maxNew: 1, refuse: true},
		{maxNew: 2},
		{maxNew: 0},
	} {
		for _, proto := range Protocols {
			for _, stream := range []bool{false, true} {
				t.Run(fmt.Sprintf("max_new_tokens=%d/%s/stream=%v", tc.maxNew, proto, stream), func(t *testing.T) {
					url := replyServer(t, []string{finishReply(proto, FinishLength, stream)}, stream)
					c, _ := NewClient(proto, url, Options{Model: "m", Backoff: Backoff{Attempts: 1}})
					r := Request{InputIDs: []int{1, 2}, Text: "q", Sampling: Sampling{MaxNewTokens: tc.maxNew}}
					g, err := generate(c, r, stream)
					if !tc.refuse {
						if err != nil || len(g.OutputIDs) != 2 {
							t.Fatalf("%+v, %v; want the generation of 2 tokens", g, err)
						}
						return
					}
					want := fmt.Sprintf("generated 2 tokens, more than the %d of max_new_tokens", tc.maxNew)
					if err == nil || fail.KindOf(err) != fail.Permanent || !strings.Contains(err.Error(), want) {
						t.Fatalf("%+v, %v (kind %v); want a permanent error saying %q", g, err, fail.KindOf(err), want)
					}
				})
			}
		}
	}
}
