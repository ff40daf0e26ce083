package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// procWakes counts how often a process was woken: its threads' context
// switches (each time one left the CPU: to sleep until a message, a timer
// or a lock, or taken off by the kernel) and its read and write system
// calls (on sockets, one a message or a batch of them). Counts since the
// process started; a thread that exited takes its switches with it (Go's
// threads seldom exit).
type procWakes struct {
	Switches int64 // voluntary + nonvoluntary, summed over /proc/PID/task/*/status
	Reads    int64 // /proc/PID/io syscr
	Writes   int64 // /proc/PID/io syscw
}

func readWakes(pid int) (procWakes, error) {
	var w procWakes
	f, err := os.Open(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return w, err
	}
	w.Reads, w.Writes, err = parseIO(f)
	f.Close()
	if err != nil {
		return w, fmt.Errorf("/proc/%d/io: %w", pid, err)
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil {
		return w, err
	}
	for _, path := range tasks {
		f, err := os.Open(path)
		if err != nil {
			continue // the thread exited since the listing
		}
		n, err := parseSwitches(f)
		f.Close()
		if err != nil {
			return w, fmt.Errorf("%s: %w", path, err)
		}
		w.Switches += n
	}
	return w, nil
}

// parseIO reads syscr and syscw from a /proc/PID/io.
func parseIO(r io.Reader) (reads, writes int64, err error) {
	found := 0
	err = eachField(r, func(key, value string) error {
		var to *int64
		switch key {
		case "syscr":
			to = &reads
		case "syscw":
			to = &writes
		default:
			return nil
		}
		found++
		var err error
		*to, err = strconv.ParseInt(value, 10, 64)
		return err
	})
	if err == nil && found < 2 {
		err = fmt.Errorf("no syscr and syscw")
	}
	return reads, writes, err
}

// parseSwitches reads a /proc/PID/task/TID/status's voluntary and
// nonvoluntary context switches, summed.
func parseSwitches(r io.Reader) (int64, error) {
	var sum int64
	found := 0
	err := eachField(r, func(key, value string) error {
		if key != "voluntary_ctxt_switches" && key != "nonvoluntary_ctxt_switches" {
			return nil
		}
		found++
		n, err := strconv.ParseInt(value, 10, 64)
		sum += n
		return err
	})
	if err == nil && found < 2 {
		err = fmt.Errorf("no voluntary_ctxt_switches and nonvoluntary_ctxt_switches")
	}
	return sum, err
}

// eachField calls f with each "key: value" line of a /proc file.
func eachField(r io.Reader, f func(key, value string) error) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		if err := f(key, strings.TrimSpace(value)); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
	}
	return sc.Err()
}
