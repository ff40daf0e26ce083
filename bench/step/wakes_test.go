package main

import (
	"os"
	"runtime"
	"strings"
	"testing"
)

func TestParseIOAndSwitches(t *testing.T) {
	r, w, err := parseIO(strings.NewReader("rchar: 9\nwchar: 8\nsyscr: 120\nsyscw: 45\nread_bytes: 0\n"))
	if err != nil || r != 120 || w != 45 {
		t.Errorf("parseIO: %d reads, %d writes, %v; want 120, 45", r, w, err)
	}
	if _, _, err := parseIO(strings.NewReader("rchar: 9\nsyscr: 1\n")); err == nil {
		t.Error("parseIO without syscw: no error")
	}
	if _, _, err := parseIO(strings.NewReader("syscr: x\nsyscw: 1\n")); err == nil || !strings.Contains(err.Error(), "syscr") {
		t.Errorf("parseIO with syscr x: %v, want an error naming syscr", err)
	}
	n, err := parseSwitches(strings.NewReader("Name:\tplanact\nvoluntary_ctxt_switches:\t300\nnonvoluntary_ctxt_switches:\t7\n"))
	if err != nil || n != 307 {
		t.Errorf("parseSwitches: %d, %v; want 307", n, err)
	}
	if _, err := parseSwitches(strings.NewReader("Name:\tplanact\n")); err == nil {
		t.Error("parseSwitches without the counts: no error")
	}
}

// TestReadWakesCountsThisProcess: this process's own counters grow with
// what it does.
func TestReadWakesCountsThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/io"); err != nil {
		// A kernel without task I/O accounting: bench/step reports no
		// wake-ups there, and says nothing wrong.
		t.Skipf("no /proc/self/io here: %v", err)
	}
	before, err := readWakes(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := os.ReadFile("/proc/self/stat"); err != nil {
			t.Fatal(err)
		}
	}
	after, err := readWakes(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after.Reads < before.Reads+10 || after.Switches < 1 {
		t.Errorf("before %+v, after ten file reads %+v: want at least 10 more reads and some switches", before, after)
	}
}

// TestReadProcReadsThisProcess: this process's CPU time and resident
// memory, its peak at least what it holds now.
func TestReadProcReadsThisProcess(t *testing.T) {
	hold := make([]byte, 8<<20)
	for i := range hold {
		hold[i] = byte(i) // touched: resident
	}
	s, err := readProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.RSS < 8<<20 || s.PeakRS < s.RSS || s.CPU <= 0 {
		t.Errorf("%+v holding 8 MB: want RSS ≥ 8 MB, a peak at least that, some CPU", s)
	}
	runtime.KeepAlive(hold)
}
