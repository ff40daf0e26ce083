// Package embedded runs a nats-server with JetStream inside the process, on
// a loopback listener so that the nats CLI can attach to it.
package embedded

import (
	"fmt"
	"os"
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
	// Name of the server, shown by `nats server ls`.
	Name string
	// Trace logs every protocol message (very verbose).
	Trace bool
}

// Server is a running embedded nats-server.
type Server struct {
	*server.Server
	tempDir string
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
		MaxPayload: 8 << 20,
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
	if s.tempDir != "" {
		os.RemoveAll(s.tempDir)
	}
}
