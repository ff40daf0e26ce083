package bus

import "testing"

// TestOnAClusterNoReadIsTakenAsTheOneServers: the services decide on
// reads (drop work, skip it) that only the server holding every
// acknowledged write may answer. Whether a stream is held by one server
// was read from its replicas alone when the bus opened: on a cluster,
// whose streams planact provision may raise to three replicas in place
// while the services run, a follower's answer was then taken as the
// truth. On a server in a cluster, no stream is taken as held by one.
func TestOnAClusterNoReadIsTakenAsTheOneServers(t *testing.T) {
	for _, tc := range []struct {
		replicas  int
		clustered bool
		one       bool
	}{{1, false, true}, {0, false, true}, {1, true, false}, {3, true, false}, {3, false, false}} {
		if got := oneServer(tc.replicas, tc.clustered); got != tc.one {
			t.Errorf("%d replicas, clustered %v: held by one server %v, want %v", tc.replicas, tc.clustered, got, tc.one)
		}
	}
}
