package chaos

import (
	"fmt"
	"regexp"
	"strings"
)

// NodeSpec places one nats-server on loopback.
type NodeSpec struct {
	Name        string // server_name, as in the compose file ("nats-1")
	ClientPort  int
	ClusterPort int // 0 on a single node
	HTTPPort    int // monitoring: /healthz, /jsz
	StoreDir    string
}

// NodeConfig derives a node's configuration from a compose/nats/nats-N.conf
// file: the client, route and monitoring listeners move to loopback ports,
// the JetStream store to storeDir, and the routes to routes (one per node;
// none for a single node, whose cluster block is dropped). Without auth the
// include of the users and permissions is dropped; with it the include
// stays, and accounts.conf must be copied beside the written file (nats
// includes are relative to the including file). Every rewrite must find its
// line, so a compose file that changes shape fails loudly here.
func NodeConfig(src string, n NodeSpec, routes []int, auth bool) (string, error) {
	var out []string
	inCluster, inRoutes := false, false
	found := map[string]int{}
	for _, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		top := line == strings.TrimLeft(line, " \t")
		switch {
		case top && clusterOpen.MatchString(trimmed):
			inCluster = true
			found["cluster"]++
			if len(routes) == 0 {
				continue
			}
		case inCluster && top && trimmed == "}":
			inCluster = false
			if len(routes) == 0 {
				continue
			}
		case inCluster && len(routes) == 0:
			continue
		case inCluster && inRoutes:
			if strings.HasPrefix(trimmed, "]") {
				inRoutes = false
				for _, p := range routes {
					out = append(out, fmt.Sprintf("    nats-route://127.0.0.1:%d", p))
				}
				break
			}
			if routeLine.MatchString(trimmed) {
				found["route"]++
			}
			continue
		case inCluster && strings.HasPrefix(trimmed, "routes:"):
			inRoutes = true
			found["routes"]++
		case inCluster && strings.HasPrefix(trimmed, "listen:"):
			line = fmt.Sprintf("  listen: 127.0.0.1:%d", n.ClusterPort)
			found["cluster listen"]++
		case top && strings.HasPrefix(trimmed, "listen:"):
			line = fmt.Sprintf("listen: 127.0.0.1:%d", n.ClientPort)
			found["listen"]++
		case top && strings.HasPrefix(trimmed, "http:"):
			line = fmt.Sprintf("http: 127.0.0.1:%d", n.HTTPPort)
			found["http"]++
		case strings.HasPrefix(trimmed, "store_dir:"):
			line = fmt.Sprintf("  store_dir: %q", n.StoreDir)
			found["store_dir"]++
		case strings.HasPrefix(trimmed, "server_name:"):
			line = "server_name: " + n.Name
			found["server_name"]++
		case top && strings.HasPrefix(trimmed, "include") && strings.Contains(trimmed, "accounts.conf"):
			found["include"]++
			if !auth {
				line = "# " + trimmed + " (left out by planact-chaos: no auth)"
			}
		}
		out = append(out, line)
	}
	want := []string{"listen", "http", "store_dir", "server_name", "cluster", "include"}
	if len(routes) > 0 {
		want = append(want, "cluster listen", "routes", "route")
	}
	for _, k := range want {
		if found[k] == 0 {
			return "", fmt.Errorf("nats config: no %s line to rewrite", k)
		}
	}
	for _, k := range []string{"listen", "http", "store_dir", "server_name", "cluster"} {
		if found[k] > 1 {
			return "", fmt.Errorf("nats config: %d %s lines, want one", found[k], k)
		}
	}
	return strings.Join(out, "\n"), nil
}

var (
	clusterOpen = regexp.MustCompile(`^cluster\s*\{$`)
	routeLine   = regexp.MustCompile(`^nats-route://`)
)
