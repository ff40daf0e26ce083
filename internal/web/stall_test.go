package web_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/web"
	"github.com/planact/planact/pkg/view"
)

// emptyView is a view of a provisioned bus with no rollouts.
func emptyView(t *testing.T) *view.Reader {
	t.Helper()
	_, url := bustest.Server(t)
	bustest.Provision(t, url)
	return openView(t, url)
}

// watched serves h and reports each connection the server closes.
func watched(t *testing.T, h http.Handler) (*httptest.Server, <-chan net.Conn) {
	t.Helper()
	closed := make(chan net.Conn, 16)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			// A small send buffer on the server's side: fewer writes
			// before one waits for the client.
			_ = c.(*net.TCPConn).SetWriteBuffer(4096)
		case http.StateClosed:
			closed <- c
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, closed
}

// stalled connects to srv with a tiny receive buffer, sends a GET of path
// and reads nothing more than the answer's first want bytes.
func stalled(t *testing.T, srv *httptest.Server, path string, want int) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: planact\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if want > 0 {
		if _, err := io.ReadFull(c, make([]byte, want)); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// waitClosed waits, until the test's deadline, for the server to close a
// connection.
func waitClosed(t *testing.T, closed <-chan net.Conn, what string) {
	t.Helper()
	ctx := context.Background()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-5*time.Second))
		defer cancel()
	}
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatalf("%s: the server still holds the connection of a client that stopped reading", what)
	}
}

// TestStalledStreamEnds: a client that opens an events stream and stops
// reading holds its handler only until one write has waited the write
// deadline; then the stream ends, its subscription released, and its
// connection is closed.
func TestStalledStreamEnds(t *testing.T) {
	s := web.NewWithTimeouts(emptyView(t), 50*time.Millisecond, time.Millisecond)
	srv, closed := watched(t, s)
	c := stalled(t, srv, "/api/rollouts/events", 0)
	// The stream is open once its first event came.
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			break
		}
	}
	// From here nothing reads: the keep-alive comments fill the buffers.
	waitClosed(t, closed, "events stream")
	if n := s.Streams(); n != 0 {
		t.Errorf("%d events streams open after their client stopped reading, want 0", n)
	}
}

// TestStalledAnswerEnds: a client that asks for a file (or JSON, or a
// page) and reads nothing of it holds its handler only for the write
// deadline.
func TestStalledAnswerEnds(t *testing.T) {
	s := web.NewWithTimeouts(emptyView(t), 50*time.Millisecond, time.Hour)
	srv, closed := watched(t, s)
	const path = "/static/vendor/chart.js/chart.umd.min.js"
	stalled(t, srv, path, 0)
	waitClosed(t, closed, path)
}

// TestStreamEndsWithItsClient: an events stream whose client goes away
// ends with the request, though nothing is written to it.
func TestStreamEndsWithItsClient(t *testing.T) {
	s := web.NewWithTimeouts(emptyView(t), time.Hour, time.Hour)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	res, err := http.Get(srv.URL + "/api/rollouts/events")
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(res.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event %q %v", line, err)
	}
	if n := s.Streams(); n != 1 {
		t.Fatalf("%d events streams open, want 1", n)
	}
	res.Body.Close()
	for s.Streams() != 0 {
		time.Sleep(time.Millisecond) // the test's deadline bounds this
	}
}

// TestKeepAlive: a silent events stream sends comments.
func TestKeepAlive(t *testing.T) {
	s := web.NewWithTimeouts(emptyView(t), time.Hour, time.Millisecond)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	res, err := http.Get(srv.URL + "/api/rollouts/events")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	r := bufio.NewReader(res.Body)
	var got bytes.Buffer
	for !strings.Contains(got.String(), "\n: keep-alive\n\n: keep-alive\n") {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("%v after %q", err, got.String())
		}
		got.WriteString(line)
	}
	if !strings.HasPrefix(got.String(), "data: []\n\n") {
		t.Errorf("stream %q: want the first event, then comments", got.String())
	}
}

// TestRequestBodyRefused: a request with a body (that never comes) is
// refused at once, saying so, and its connection closed; it opens no
// events stream.
func TestRequestBodyRefused(t *testing.T) {
	s := web.NewWithTimeouts(emptyView(t), 50*time.Millisecond, time.Hour)
	srv, closed := watched(t, s)
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if d, ok := t.Deadline(); ok {
		_ = c.SetReadDeadline(d.Add(-5 * time.Second))
	}
	if _, err := io.WriteString(c, "GET /api/rollouts/events HTTP/1.1\r\nHost: planact\r\nContent-Length: 10\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a request whose body never comes: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	if want := "GET /api/rollouts/events: the web view takes no request body"; res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), want) {
		t.Errorf("%d %q, want 400 and %q", res.StatusCode, body, want)
	}
	waitClosed(t, closed, "request with a body")
	if n := s.Streams(); n != 0 {
		t.Errorf("%d events streams open, want 0", n)
	}
}
