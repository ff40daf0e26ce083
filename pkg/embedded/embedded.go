// Package embedded runs a nats-server with JetStream inside the process, on
// a loopback listener so that the nats CLI can attach to it.
package embedded

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configure an embedded server.
type Options struct {
	// Dir holds JetStream's file store; empty means a fresh temporary directory.
	Dir string
	// Host and Port of the client listener; Port 0 means 4222, -1 a random free port.
	Host string
	Port int
	// MonitorPort serves nats-server's monitoring endpoints (/varz,
	// /connz, /jsz) over HTTP on Host; 0 serves none, -1 a random free port.
	MonitorPort int
	// Name of the server, shown by `nats server ls`.
	Name string
	// Trace logs every protocol message (very verbose).
	Trace bool
	// Sync says when JetStream writes to disk; the zero value is the
	// server's default (in the background every two minutes).
	Sync Sync
	// TLSCert and TLSKey (PEM files), when set, make the client listener
	// speak only TLS, presenting this certificate.
	TLSCert, TLSKey string
	// TLSClientCA (a PEM file), with TLSCert, makes the server require
	// client certificates signed by these authorities (mutual TLS).
	TLSClientCA string
}

// Sync says when JetStream flushes what it stores to disk (fsync). A
// write is acknowledged once it is in the server's memory (and, on a
// cluster, a quorum's); what has not been flushed yet survives a process
// crash, since the operating system holds it, but not a machine crash or
// a power cut.
type Sync struct {
	// Always flushes every write before it is acknowledged.
	Always bool
	// Interval, unless Always, is how often the file store is flushed in
	// the background; zero is the server's default, two minutes.
	Interval time.Duration
}

// ParseSync reads "always" or a positive duration such as "1s" or "2m".
func ParseSync(v string) (Sync, error) {
	if strings.EqualFold(strings.TrimSpace(v), "always") {
		return Sync{Always: true}, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d <= 0 {
		return Sync{}, fmt.Errorf("sync %q: want always or a positive duration such as 1s or 2m", v)
	}
	return Sync{Interval: d}, nil
}

// String is "always", the interval, or "2m0s (default)".
func (s Sync) String() string {
	switch {
	case s.Always:
		return "always"
	case s.Interval > 0:
		return s.Interval.String()
	}
	return "2m0s (default)"
}

// Set parses v, so that a Sync is a flag.Value.
func (s *Sync) Set(v string) error {
	p, err := ParseSync(v)
	if err != nil {
		return errors.New("want always or a positive duration such as 1s or 2m")
	}
	*s = p
	return nil
}

// Server is a running embedded nats-server.
type Server struct {
	*server.Server
	tempDir string
	lock    *os.File // held on the data directory while the server runs
}

// Start starts a nats-server with JetStream and waits until it accepts clients.
func Start(o Options) (*Server, error) {
	s := &Server{}
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "planact-js-*")
		if err != nil {
			return nil, fmt.Errorf("embedded: temp dir: %w", err)
		}
		o.Dir, s.tempDir = d, d
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.Port == 0 {
		o.Port = 4222
	}
	if o.Name == "" {
		o.Name = "planact"
	}
	// Two servers on one store would corrupt it: the second is refused.
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded: data directory: %w", err)
	}
	lock, err := lockDir(o.Dir)
	if err != nil {
		s.cleanup()
		return nil, fmt.Errorf("embedded: %w", err)
	}
	s.lock = lock
	// A port in use is said at once, not as a server that is never ready.
	if o.Port > 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort(o.Host, strconv.Itoa(o.Port)))
		if err != nil {
			s.cleanup()
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, fmt.Errorf("embedded: %s:%d: address already in use (another planact up or nats-server?); --port -1 takes a free port", o.Host, o.Port)
			}
			return nil, fmt.Errorf("embedded: %w", err)
		}
		ln.Close()
	}
	opts := &server.Options{
		ServerName: o.Name,
		Host:       o.Host,
		Port:       o.Port,
		JetStream:  true,
		StoreDir:   o.Dir,
		NoSigs:     true,
		NoLog:      !o.Trace,
		Trace:      o.Trace,
		// Room for results with many samples before they go to the object store.
		MaxPayload:   8 << 20,
		SyncAlways:   o.Sync.Always,
		SyncInterval: o.Sync.Interval,
		HTTPHost:     o.Host,
		HTTPPort:     o.MonitorPort,
	}
	if o.TLSCert != "" || o.TLSKey != "" || o.TLSClientCA != "" {
		if o.TLSCert == "" || o.TLSKey == "" {
			s.cleanup()
			return nil, errors.New("embedded: TLS needs both a certificate and its key")
		}
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: o.TLSCert, KeyFile: o.TLSKey, CaFile: o.TLSClientCA, Verify: o.TLSClientCA != "",
		})
		if err != nil {
			s.cleanup()
			return nil, fmt.Errorf("embedded: TLS: %w", err)
		}
		opts.TLSConfig, opts.TLS, opts.TLSVerify = tc, true, o.TLSClientCA != ""
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		s.cleanup()
		return nil, fmt.Errorf("embedded: %w", err)
	}
	if o.Trace {
		ns.ConfigureLogger()
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		s.cleanup()
		return nil, fmt.Errorf("embedded: nats-server on %s:%d not ready after 10s", o.Host, o.Port)
	}
	s.Server = ns
	return s, nil
}

// MonitorURL is where the monitoring endpoints are served ("" when
// MonitorPort was 0).
func (s *Server) MonitorURL() string {
	a := s.MonitorAddr()
	if a == nil {
		return ""
	}
	return "http://" + a.String()
}

// Stop shuts the server down and removes a temporary store.
func (s *Server) Stop() {
	if s == nil || s.Server == nil {
		return
	}
	s.Shutdown()
	s.WaitForShutdown()
	s.cleanup()
}

func (s *Server) cleanup() {
	if s.lock != nil {
		s.lock.Close() // releases the lock
		s.lock = nil
	}
	if s.tempDir != "" {
		os.RemoveAll(s.tempDir)
	}
}

// Storage is the JetStream file storage the server offers (its
// max_file_store, by default three quarters of the free disk).
func (s *Server) Storage() int64 {
	if c := s.JetStreamConfig(); c != nil {
		return c.MaxStore
	}
	return 0
}
