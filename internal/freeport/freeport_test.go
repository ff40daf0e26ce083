package freeport

import (
	"net"
	"strconv"
	"testing"
)

// Ports are distinct, below the ephemeral range, free when picked, and
// never handed out twice.
func TestPorts(t *testing.T) {
	start := ephemeralStart()
	seen := map[int]bool{}
	for range 20 {
		ps, err := Ports(5)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) != 5 {
			t.Fatalf("%d ports, want 5", len(ps))
		}
		for _, p := range ps {
			if p < low || p >= start {
				t.Errorf("port %d outside %d-%d", p, low, start-1)
			}
			if seen[p] {
				t.Errorf("port %d handed out twice", p)
			}
			seen[p] = true
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				t.Errorf("port %d is not free: %v", p, err)
				continue
			}
			l.Close()
		}
	}
}

// A port that is taken is never picked.
func TestPortsSkipTaken(t *testing.T) {
	const lo, hi = 20000, 20039
	mu.Lock()
	for p := lo; p <= hi; p++ {
		delete(handed, p)
	}
	mu.Unlock()
	taken := map[int]bool{}
	for p := lo; p <= hi; p += 2 {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		defer l.Close()
		taken[p] = true
	}
	if len(taken) < 10 {
		t.Skipf("only %d ports of %d-%d could be held here", len(taken), lo, hi)
	}
	ps, err := pickIn(10, lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if taken[p] {
			t.Errorf("port %d is held here, and was picked", p)
		}
	}
}
