package bus

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/internal/natsbin"
	"github.com/planact/planact/pkg/fail"
)

func TestVersionAtLeast(t *testing.T) {
	for _, c := range []struct {
		have string
		ok   bool
		err  string
	}{
		{"2.12.0", true, ""},
		{"2.15.2", true, ""},
		{"v2.12.1", true, ""},
		{"3.0.0", true, ""},
		{"2.12.0-RC.3", true, ""},
		{"2.11.9", false, ""},
		{"2.9.10", false, ""},
		{"2.100.0", true, ""}, // numbers, not strings
		{"1.99.99", false, ""},
		{"", false, "want major.minor.patch"},
		{"2.12", false, "want major.minor.patch"},
		{"2.x.0", false, `"x" is not a number`},
		{"0.0.0-unknown", false, ""},
	} {
		ok, err := versionAtLeast(c.have, MinServerVersion)
		if ok != c.ok || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("versionAtLeast(%q, %q) = %v, %v; want %v, error with %q", c.have, MinServerVersion, ok, err, c.ok, c.err)
		}
	}
}

// What a server cannot do is not tried again: provisioning on Debian's
// nats-server (2.9: no limit markers) used to retry "limit marker TTLs not
// supported by server" for a minute, as if the server were only starting.
// (Open checks the version first; this provisions past that check.)
func TestProvisionDoesNotRetryWhatTheServerCannotDo(t *testing.T) {
	old := natsbin.Old(t)
	nc, err := nats.Connect(old.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	b := &Bus{NC: nc, JS: js, Log: zerolog.New(&logged)}
	err = b.provision(context.Background(), Provisioning{}.WithDefaults())
	if !errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) || fail.KindOf(err) != fail.Permanent || !strings.Contains(err.Error(), "needs nats-server 2.12.0") {
		t.Errorf("provisioning on nats-server %s: %v (%v), want a permanent error naming the version needed", old.Version, err, fail.KindOf(err))
	}
	if strings.Contains(logged.String(), "retrying") {
		t.Errorf("provisioning retried what the server cannot do:\n%s", logged.String())
	}
}
