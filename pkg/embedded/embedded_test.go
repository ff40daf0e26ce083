package embedded_test

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/embedded"
)

func TestParseSync(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want embedded.Sync
		err  bool
	}{
		{in: "always", want: embedded.Sync{Always: true}},
		{in: "ALWAYS", want: embedded.Sync{Always: true}},
		{in: "1s", want: embedded.Sync{Interval: time.Second}},
		{in: "2m", want: embedded.Sync{Interval: 2 * time.Minute}},
		{in: "250ms", want: embedded.Sync{Interval: 250 * time.Millisecond}},
		{in: "0s", err: true},
		{in: "-1s", err: true},
		{in: "sometimes", err: true},
		{in: "10", err: true},
		{in: "", err: true},
	} {
		got, err := embedded.ParseSync(tc.in)
		switch {
		case tc.err && err == nil:
			t.Errorf("ParseSync(%q) = %v, want an error", tc.in, got)
		case !tc.err && err != nil:
			t.Errorf("ParseSync(%q): %v", tc.in, err)
		case got != tc.want:
			t.Errorf("ParseSync(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

// TestSyncFlag: a Sync is a flag whose bad values are errors that name
// the flag and the value.
func TestSyncFlag(t *testing.T) {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var s embedded.Sync
	fs.Var(&s, "sync", "")
	err := fs.Parse([]string{"--sync", "often"})
	if err == nil || !strings.Contains(err.Error(), `invalid value "often" for flag -sync: want always or a positive duration`) {
		t.Errorf("--sync often: %v", err)
	}
	if err := fs.Parse([]string{"--sync", "always"}); err != nil || !s.Always || s.String() != "always" {
		t.Errorf("--sync always: %v, %+v", err, s)
	}
	if err := fs.Parse([]string{"--sync", "5s"}); err != nil || s != (embedded.Sync{Interval: 5 * time.Second}) || s.String() != "5s" {
		t.Errorf("--sync 5s: %v, %+v", err, s)
	}
}

// TestSyncReachesJetStream: the setting is the server's JetStream
// configuration, the one `nats server report jetstream` shows.
func TestSyncReachesJetStream(t *testing.T) {
	for _, tc := range []struct {
		sync     embedded.Sync
		interval time.Duration // the background flush, also under always
	}{
		{embedded.Sync{}, 2 * time.Minute},
		{embedded.Sync{Always: true}, 2 * time.Minute},
		{embedded.Sync{Interval: 3 * time.Second}, 3 * time.Second},
	} {
		sync := tc.sync
		s, err := embedded.Start(embedded.Options{Dir: t.TempDir(), Port: -1, Sync: sync})
		if err != nil {
			t.Fatal(err)
		}
		c := s.JetStreamConfig()
		s.Stop()
		if c == nil {
			t.Fatalf("%v: no JetStream", sync)
		}
		if c.SyncAlways != sync.Always || c.SyncInterval != tc.interval {
			t.Errorf("sync %v: JetStream has always=%v interval=%v", sync, c.SyncAlways, c.SyncInterval)
		}
	}
}

func TestTLSNeedsCertAndKey(t *testing.T) {
	for _, o := range []embedded.Options{
		{TLSCert: "cert.pem"},
		{TLSKey: "key.pem"},
		{TLSClientCA: "ca.pem"},
	} {
		o.Dir, o.Port = t.TempDir(), -1
		if s, err := embedded.Start(o); err == nil {
			s.Stop()
			t.Errorf("%+v: started, want an error", o)
		}
	}
}

// TestPortInUse: a port that is taken is said at once, by name, instead of
// a server that is "not ready" ten seconds later.
func TestPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	_, err = embedded.Start(embedded.Options{Dir: t.TempDir(), Port: port})
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("start on a taken port: %v", err)
	}
}

// TestOneServerPerDataDirectory: a second server on the same data
// directory is refused (both used to start and share one store); the
// directory is free again once the first stops.
func TestOneServerPerDataDirectory(t *testing.T) {
	dir := t.TempDir()
	first, err := embedded.Start(embedded.Options{Dir: dir, Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = embedded.Start(embedded.Options{Dir: dir, Port: -1})
	if err == nil || !strings.Contains(err.Error(), "in use by another planact") || !strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
		t.Fatalf("second server on %s: %v", dir, err)
	}
	first.Stop()
	again, err := embedded.Start(embedded.Options{Dir: dir, Port: -1})
	if err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
	again.Stop()
}
