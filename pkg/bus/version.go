package bus

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/pkg/fail"
)

// MinServerVersion is the oldest nats-server planact runs on: the
// rollouts' time-outs are scheduled messages (2.12), and the buckets'
// keys expire with limit markers that tell watchers so (2.11). An older
// server refuses some of these settings and silently drops others.
const MinServerVersion = "2.12.0"

// ErrServerTooOld is in the error of a connection to a nats-server older
// than MinServerVersion. It is permanent: trying again changes nothing.
var ErrServerTooOld = errors.New("nats-server too old for planact")

// CheckServerVersion returns a permanent error, naming the server's
// version and the one planact needs, when nc is connected to a
// nats-server older than MinServerVersion (or one that gives no version it
// can read).
func CheckServerVersion(nc *nats.Conn) error {
	have := nc.ConnectedServerVersion()
	ok, err := versionAtLeast(have, MinServerVersion)
	switch {
	case err != nil:
		return fail.E(fail.Permanent, fmt.Errorf("%w: %s gives its version as %q (%v), planact needs %s or later",
			ErrServerTooOld, nc.ConnectedUrlRedacted(), have, err, MinServerVersion))
	case !ok:
		return fail.E(fail.Permanent, fmt.Errorf("%w: %s runs %s, planact needs %s or later",
			ErrServerTooOld, nc.ConnectedUrlRedacted(), have, MinServerVersion))
	}
	return nil
}

// versionAtLeast reports whether version have ("2.9.10", "v2.12.0-RC.1")
// is want or later, by major, minor and patch; a pre-release counts as its
// release.
func versionAtLeast(have, want string) (bool, error) {
	h, err := parseVersion(have)
	if err != nil {
		return false, err
	}
	w, err := parseVersion(want)
	if err != nil {
		return false, err
	}
	for i := range h {
		if h[i] != w[i] {
			return h[i] > w[i], nil
		}
	}
	return true, nil
}

func parseVersion(v string) ([3]int, error) {
	var out [3]int
	s := strings.TrimPrefix(strings.TrimSpace(v), "v")
	if i := strings.IndexAny(s, "-+"); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return out, fmt.Errorf("version %q: want major.minor.patch", v)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, fmt.Errorf("version %q: %q is not a number", v, p)
		}
		out[i] = n
	}
	return out, nil
}
