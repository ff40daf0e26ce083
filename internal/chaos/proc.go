package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is one process of the topology: a nats-server, a service or the
// simulated engines. It runs in its own process group, so a kill reaches
// everything it started, and it dies with the harness (Pdeathsig) even when
// the harness itself is killed. Its output is appended to Log across
// restarts.
type Proc struct {
	Name string // unique in the topology: "nats-2", "act-dispatcher-1", "sim"
	Kind string // "nats", a service name, or "sim"
	Path string
	Args []string
	Env  []string // added to the harness's environment
	Log  string

	// OnExit, when set, is called (in its own goroutine) when the process
	// exits without the harness having asked for it.
	OnExit func(p *Proc, e Exit)

	mu        sync.Mutex
	cmd       *exec.Cmd
	done      chan struct{} // closed when the current process has exited
	expected  bool          // the harness asked for the current process to end
	retired   bool          // killed for good: Start refuses
	stopped   bool          // SIGSTOPped
	starts    int
	logOffset int64
	exits     []Exit
}

// Exit is a process ending that the harness did not ask for.
type Exit struct {
	Proc    string    `json:"proc"`
	At      time.Time `json:"at"`
	Err     string    `json:"err"`
	LogTail string    `json:"log_tail,omitempty"`
}

// Start starts the process; it is an error if it runs already.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s: already running", p.Name)
	}
	if p.retired {
		return fmt.Errorf("%s: retired", p.Name)
	}
	f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	p.starts++
	p.logOffset = st.Size()
	fmt.Fprintf(f, "--- planact-chaos: start %d of %s at %s ---\n", p.starts, p.Name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.expected, p.stopped = cmd, done, false, false
	go func() {
		werr := cmd.Wait()
		f.Close()
		p.mu.Lock()
		expected := p.expected
		p.cmd = nil
		var e Exit
		if !expected {
			e = Exit{Proc: p.Name, At: time.Now(), Err: fmt.Sprint(werr), LogTail: tail(p.Log, p.logOffset, 2000)}
			p.exits = append(p.exits, e)
		}
		onExit := p.OnExit
		p.mu.Unlock()
		close(done)
		if !expected && onExit != nil {
			go onExit(p, e)
		}
	}()
	return nil
}

// Kill sends SIGKILL to the process group and waits until the process is
// gone. Killing a process that does not run is a no-op.
func (p *Proc) Kill() {
	p.mu.Lock()
	if p.cmd == nil {
		p.mu.Unlock()
		return
	}
	p.expected = true
	pid, done := p.cmd.Process.Pid, p.done
	p.mu.Unlock()
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-done
}

// Retire kills the process for good: a later Start (a supervisor's, a
// fault's repair) is refused, so nothing outlives the topology.
func (p *Proc) Retire() {
	p.mu.Lock()
	p.retired = true
	p.mu.Unlock()
	p.Kill()
}

// Stop freezes the process group (SIGSTOP): it holds its connections and
// its messages but does nothing, as a process stuck in a long GC pause or a
// swapped-out machine would.
func (p *Proc) Stop() error { return p.signal(syscall.SIGSTOP, true) }

// Cont resumes a stopped process group (SIGCONT).
func (p *Proc) Cont() error { return p.signal(syscall.SIGCONT, false) }

func (p *Proc) signal(sig syscall.Signal, stopped bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s: not running", p.Name)
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("%s: %v: %w", p.Name, sig, err)
	}
	p.stopped = stopped
	return nil
}

// PID returns the process id, 0 when it does not run.
func (p *Proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the process runs (stopped or not).
func (p *Proc) Running() bool { return p.PID() != 0 }

// Exits returns the process's unexpected exits so far.
func (p *Proc) Exits() []Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Exit(nil), p.exits...)
}

// WaitLog waits until the current process has written want to its log,
// polling until ctx ends. It fails at once if the process exits.
func (p *Proc) WaitLog(ctx context.Context, want string) error {
	for {
		p.mu.Lock()
		running, offset, done := p.cmd != nil, p.logOffset, p.done
		p.mu.Unlock()
		if !running {
			return fmt.Errorf("%s exited before logging %q:\n%s", p.Name, want, tail(p.Log, offset, 1500))
		}
		if data, err := readFrom(p.Log, offset); err == nil && bytes.Contains(data, []byte(want)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not log %q: %w\n%s", p.Name, want, ctx.Err(), tail(p.Log, offset, 1500))
		case <-done:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// RSS returns the resident set size of the process in bytes
// (/proc/PID/status VmRSS), 0 when it does not run.
func (p *Proc) RSS() int64 {
	pid := p.PID()
	if pid == 0 {
		return 0
	}
	return rssOf(pid)
}

func rssOf(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest) // "123456 kB"
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					return kb << 10
				}
			}
		}
	}
	return 0
}

func readFrom(path string, offset int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, 0); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	_, err = buf.ReadFrom(f)
	return buf.Bytes(), err
}

// tail returns at most n bytes of the end of what path holds after offset.
func tail(path string, offset int64, n int) string {
	data, err := readFrom(path, offset)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err.Error()
	}
	if len(data) > n {
		data = data[len(data)-n:]
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	return string(data)
}
