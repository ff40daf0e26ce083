// Package freeport picks loopback ports for servers that bind them later:
// a nats-server process of a harness, a node restarted on its port, a web
// view started after its address was chosen.
//
// A port the kernel hands out for "127.0.0.1:0" comes from its ephemeral
// range, which is also where every outgoing connection gets its local port:
// between the pick and the bind, a client anywhere on the machine may take
// it (issue 15's flake hunt saw a chaos run's nats-server fail with "address
// already in use" that way). Ports picked here lie below the ephemeral range,
// where the kernel gives out none, and each is checked free when picked and
// never handed out twice by one process.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// low is the first port considered: below it lie the well-known and
// registered services' ports that a developer machine may run.
const low = 10000

var (
	mu     sync.Mutex
	handed = map[int]bool{}
)

// Ports returns n distinct loopback ports that were free when picked, below
// the kernel's ephemeral range.
func Ports(n int) ([]int, error) {
	hi := ephemeralStart() - 1
	if hi-low < 1000 {
		return nil, fmt.Errorf("freeport: the ephemeral range starts at %d, leaving no room above %d", hi+1, low)
	}
	return pickIn(n, low, hi)
}

// pickIn picks n ports in [lo, hi] as Ports does.
func pickIn(n, lo, hi int) ([]int, error) {
	mu.Lock()
	defer mu.Unlock()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100*n+1000 {
			return nil, fmt.Errorf("freeport: no free port in %d-%d after %d tries", lo, hi, tries)
		}
		p := lo + rand.IntN(hi-lo+1)
		if handed[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue // taken
		}
		l.Close()
		handed[p] = true
		ports = append(ports, p)
	}
	return ports, nil
}

// Port returns one port as Ports does.
func Port() (int, error) {
	ps, err := Ports(1)
	if err != nil {
		return 0, err
	}
	return ps[0], nil
}

// Addr returns "127.0.0.1:<port>" for a port as Ports picks them.
func Addr() (string, error) {
	p, err := Port()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

// ephemeralStart is the first port of the kernel's ephemeral range: Linux
// says it in /proc; elsewhere, IANA's 49152 (macOS, Windows).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if p, err := strconv.Atoi(f[0]); err == nil {
				return p
			}
		}
	}
	return 49152
}
