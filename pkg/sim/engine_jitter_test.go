package sim

import (
	"fmt"
	"testing"
	"time"
)

func TestJitteredKeepsTheMeanAndSpreads(t *testing.T) {
	const n = 20000
	var sum time.Duration
	lo, hi := time.Hour, time.Duration(0)
	for i := 0; i < n; i++ {
		d := jittered(100*time.Millisecond, 1, hash64(1, fmt.Sprint(i)))
		sum += d
		lo, hi = min(lo, d), max(hi, d)
	}
	mean := sum / n
	if mean < 95*time.Millisecond || mean > 105*time.Millisecond {
		t.Errorf("mean %v, want about 100ms", mean)
	}
	if hi < 400*time.Millisecond || lo > 20*time.Millisecond {
		t.Errorf("range %v..%v: want a long tail and fast requests", lo, hi)
	}
	if got := jittered(100*time.Millisecond, 0, 42); got != 100*time.Millisecond {
		t.Errorf("no jitter: %v", got)
	}
}
