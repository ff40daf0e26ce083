package stack

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestReplicaNames: replicas in different processes used to log and report
// themselves all as replica 0; the process and host are in the name now.
func TestReplicaNames(t *testing.T) {
	a, b := replicaName(0), replicaName(1)
	if a == b || !strings.Contains(a, fmt.Sprintf(":%d/", os.Getpid())) || !strings.HasSuffix(b, "/1") {
		t.Errorf("replica names %q and %q", a, b)
	}
}
