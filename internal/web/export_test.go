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

// NewWithReadTimeout is New with its bound on reading from the streams
// for one request or event set, so that tests of a silent server run fast.
func NewWithReadTimeout(r *view.Reader, readTimeout time.Duration) *Server {
	s := New(r)
	s.readTimeout = readTimeout
	return s
}
