package chaos_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/planact/planact/internal/chaos"
)

// TestNodeConfig derives configs from compose/nats and has nats-server
// itself read them.
func TestNodeConfig(t *testing.T) {
	root, err := chaos.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	// Every password accounts.conf refers to, as compose/.env would set it.
	conf, err := os.ReadFile(filepath.Join(root, "compose", "nats", "accounts.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range regexp.MustCompile(`\$(PLANACT_PW_[A-Z_]+)`).FindAllStringSubmatch(string(conf), -1) {
		t.Setenv(v[1], "pw")
	}
	routes := []int{16001, 16002, 16003}
	tests := []struct {
		name   string
		routes []int
		auth   bool
	}{
		{"cluster", routes, false},
		{"cluster with auth", routes, true},
		{"single", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			nodes := 3
			if tc.routes == nil {
				nodes = 1
			}
			if tc.auth {
				acc, err := os.ReadFile(filepath.Join(root, "compose", "nats", "accounts.conf"))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "accounts.conf"), acc, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for i := range nodes {
				name := fmt.Sprintf("nats-%d", i+1)
				src, err := os.ReadFile(filepath.Join(root, "compose", "nats", name+".conf"))
				if err != nil {
					t.Fatal(err)
				}
				spec := chaos.NodeSpec{Name: name, ClientPort: 14001 + i, HTTPPort: 18001 + i, StoreDir: filepath.Join(dir, name, "js")}
				if tc.routes != nil {
					spec.ClusterPort = tc.routes[i]
				}
				conf, err := chaos.NodeConfig(string(src), spec, tc.routes, tc.auth)
				if err != nil {
					t.Fatal(err)
				}
				path := filepath.Join(dir, name+".conf")
				if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
					t.Fatal(err)
				}
				opts, err := server.ProcessConfigFile(path)
				if err != nil {
					t.Fatalf("nats-server cannot read the derived config: %v\n%s", err, conf)
				}
				if opts.ServerName != name || opts.Host != "127.0.0.1" || opts.Port != spec.ClientPort ||
					opts.HTTPHost != "127.0.0.1" || opts.HTTPPort != spec.HTTPPort || !opts.JetStream || opts.StoreDir != spec.StoreDir {
					t.Errorf("%s: server %q at %s:%d, monitoring %s:%d, jetstream %v in %q", name, opts.ServerName, opts.Host, opts.Port, opts.HTTPHost, opts.HTTPPort, opts.JetStream, opts.StoreDir)
				}
				if tc.routes != nil {
					if opts.Cluster.Name != "planact" || opts.Cluster.Host != "127.0.0.1" || opts.Cluster.Port != spec.ClusterPort || len(opts.Routes) != 3 {
						t.Errorf("%s: cluster %q at %s:%d with %d routes", name, opts.Cluster.Name, opts.Cluster.Host, opts.Cluster.Port, len(opts.Routes))
					}
					for j, r := range opts.Routes {
						if r.Host != fmt.Sprintf("127.0.0.1:%d", tc.routes[j]) {
							t.Errorf("%s: route %d is %s", name, j, r.Host)
						}
					}
				} else if opts.Cluster.Port != 0 || len(opts.Routes) != 0 {
					t.Errorf("%s: a single node with cluster port %d and %d routes", name, opts.Cluster.Port, len(opts.Routes))
				}
				if hasUsers := len(opts.Accounts) > 0 && opts.SystemAccount == "SYS"; hasUsers != tc.auth {
					t.Errorf("%s: accounts %d, system account %q; want auth %v", name, len(opts.Accounts), opts.SystemAccount, tc.auth)
				}
				if opts.MaxPayload != 8<<20 {
					t.Errorf("%s: max_payload %d, want the compose file's 8MB", name, opts.MaxPayload)
				}
			}
		})
	}
}

func TestNodeConfigRefusesAnotherShape(t *testing.T) {
	_, err := chaos.NodeConfig("port: 4222\n", chaos.NodeSpec{Name: "nats-1"}, nil, false)
	if err == nil || !strings.Contains(err.Error(), "no") {
		t.Errorf("a config without the compose file's lines: err %v", err)
	}
}
