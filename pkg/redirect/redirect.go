// Package redirect keeps a POST where it was sent: planact posts an act's
// input to HTTP tools and a prompt and label to reward servers, and a
// redirect must neither send them to another host nor turn the POST into a
// GET without its body (301, 302, 303), whose answer is no answer to them.
package redirect

import (
	"errors"
	"net/http"
)

// SameHostPOST is hc, following only the redirects that keep the request a
// POST (307, 308) to the same scheme and host; any other redirect is
// answered by its 3xx response, for the caller to refuse (naming its
// Location).
func SameHostPOST(hc *http.Client) *http.Client {
	c := *hc
	next := hc.CheckRedirect
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		first := via[0].URL
		if req.Method != http.MethodPost || req.URL.Scheme != first.Scheme || req.URL.Host != first.Host {
			return http.ErrUseLastResponse
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return &c
}
