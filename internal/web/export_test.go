package web

import (
	"time"

	"github.com/planact/planact/pkg/view"
)

// NewWithTimeouts is New with its write deadline and keep-alive interval
// set, so that tests of clients that stop reading run fast.
func NewWithTimeouts(r *view.Reader, writeTimeout, keepAlive time.Duration) *Server {
	return newServer(r, writeTimeout, keepAlive)
}
