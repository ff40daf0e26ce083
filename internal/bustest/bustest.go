// Package bustest gives tests a real embedded JetStream server, a
// provisioned bus on it, and a certificate authority for TLS tests.
package bustest

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/telemetry"
)

// Server starts an embedded nats-server for the test and returns its URL.
func Server(t testing.TB) (*embedded.Server, string) {
	t.Helper()
	s, err := embedded.Start(embedded.Options{Dir: t.TempDir(), Port: -1, Name: "planact-test"})
	if err != nil {
		t.Fatalf("embedded server: %v", err)
	}
	t.Cleanup(s.Stop)
	return s, s.ClientURL()
}

// TestLogger returns a logger for one test. Unless PLANACT_TEST_LOG is set it
// keeps the test's log at level (debug, info, …) in memory and, only if the test fails, writes it
// to a file in the system's temporary directory and names the file in the
// failure, so that a flake seen once in a full run can be read
// afterwards without running every test at debug level on the console.
func TestLogger(t testing.TB, level string) zerolog.Logger {
	if os.Getenv("PLANACT_TEST_LOG") != "" {
		return Logger()
	}
	buf := &lockedBuffer{}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		f, err := os.CreateTemp("", "planact-"+strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())+"-*.log")
		if err != nil {
			t.Logf("debug log not written: %v", err)
			return
		}
		defer f.Close()
		buf.mu.Lock()
		_, err = f.Write(buf.b)
		buf.mu.Unlock()
		t.Logf("log of the failed test: %s (%v)", f.Name(), err)
	})
	return telemetry.NewLogger(buf, telemetry.LogOptions{Level: level})
}

// DumpGoroutines writes the stacks of every goroutine of the test process
// to a file in the system's temporary directory and names it in the test's
// log: call it where a test finds work stuck, before it stops the services
// that hold the stuck goroutines.
func DumpGoroutines(t testing.TB) {
	f, err := os.CreateTemp("", "planact-"+strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())+"-*.goroutines")
	if err != nil {
		t.Logf("goroutines not written: %v", err)
		return
	}
	defer f.Close()
	err = pprof.Lookup("goroutine").WriteTo(f, 2)
	t.Logf("goroutines at the failure: %s (%v)", f.Name(), err)
}

// lockedBuffer is an io.Writer shared by every goroutine of a test.
type lockedBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.b = append(l.b, p...)
	l.mu.Unlock()
	return len(p), nil
}

// Logger returns a logger for tests: silent unless PLANACT_TEST_LOG is set.
func Logger() zerolog.Logger {
	if lvl := os.Getenv("PLANACT_TEST_LOG"); lvl != "" {
		return telemetry.NewLogger(os.Stderr, telemetry.LogOptions{Level: lvl, Pretty: true})
	}
	return zerolog.New(io.Discard)
}

// Bus provisions planact on url (as `planact provision` does) and connects
// a new bus to it, closed at the end of the test.
func Bus(t testing.TB, url, name string) *bus.Bus {
	t.Helper()
	Provision(t, url)
	b, err := bus.Connect(context.Background(), bus.ConnOptions{URL: url}, name, Logger(), bus.Provisioning{})
	if err != nil {
		t.Fatalf("bus: %v", err)
	}
	t.Cleanup(func() { b.NC.Close() })
	return b
}

// Provision creates planact's streams, buckets and object stores on url
// with the default provisioning.
func Provision(t testing.TB, url string) {
	t.Helper()
	nc := Conn(t, url)
	if err := bus.Provision(context.Background(), nc, Logger(), bus.Provisioning{}); err != nil {
		t.Fatalf("provision: %v", err)
	}
}

// Conn is a plain NATS connection, as a trainer would have: with the inbox
// prefix of the user url names, if any (compose/nats/accounts.conf lets a
// user read its own inboxes only). Like a trainer's, it dials again while
// the server cannot be reached (Connect).
func Conn(t testing.TB, url string) *nats.Conn {
	t.Helper()
	opts := []nats.Option{nats.Name(fmt.Sprintf("test-%s", t.Name()))}
	if p := (bus.ConnOptions{URL: url}).Inbox(); p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	}
	nc, err := Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Connect is nats.Connect dialling again, for up to a minute, while the
// server cannot be reached (bus.DialRetry): on two busy cores a loopback
// dial can miss nats.go's 2 s connect deadline (a flake hunt saw it once).
func Connect(url string, opts ...nats.Option) (*nats.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return bus.DialRetry(ctx, func() (*nats.Conn, error) { return nats.Connect(url, opts...) }, nil)
}

// Proxy forwards TCP connections to a NATS server. Freeze stops every byte
// both ways without closing anything, as a process stopped with SIGSTOP
// would: the server sees a connection that is there and says nothing.
type Proxy struct {
	URL string // nats://127.0.0.1:<port>

	mu     sync.Mutex
	frozen chan struct{} // closed while thawed; nil until the first freeze
	cut    bool          // connections are closed and refused
	conns  []net.Conn
}

// StartProxy forwards to the server at url until the end of the test.
func StartProxy(t testing.TB, url string) *Proxy {
	t.Helper()
	target := strings.TrimPrefix(url, "nats://")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{URL: "nats://" + ln.Addr().String()}
	t.Cleanup(func() {
		ln.Close()
		p.Thaw()
		p.Cut()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			refused := p.cut
			p.mu.Unlock()
			if refused {
				c.Close()
				continue
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go p.copy(s, c)
			go p.copy(c, s)
		}
	}()
	return p
}

// Cut closes every connection and refuses new ones until Restore: what
// was on its way is lost, as in a network partition or a NATS restart.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Restore accepts connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

func (p *Proxy) copy(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.wait()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// wait returns when the proxy is not frozen.
func (p *Proxy) wait() {
	p.mu.Lock()
	ch := p.frozen
	p.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// Freeze stops forwarding.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen == nil {
		p.frozen = make(chan struct{})
	}
}

// Thaw forwards again what was held and what comes.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
}
