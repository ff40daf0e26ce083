package actdispatcher

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/planact/planact/pkg/schema"
	gotool "github.com/planact/planact/pkg/tool"
)

// The Go tool "stuck" waits, whatever its context says, until the channel
// its input names is closed.
var (
	stuckRelease sync.Map // input → chan struct{}
	stuckCalls   atomic.Int64
	registerOnce sync.Once
)

func registerStuck() {
	registerOnce.Do(func() {
		gotool.Register("stuck", func(_ context.Context, input string) (string, error) {
			c, _ := stuckRelease.Load(input)
			<-c.(chan struct{})
			return "late", nil
		})
	})
}

// A Go tool that ignores its context must not hold its act, its turn and
// a slot for ever: the act times out as act_timeout_s says, and the call
// left running is counted until it ends. Before, execute waited for the
// call (3 s after a 0.2 s time-out it had not returned).
func TestAGoToolThatIgnoresItsDeadlineTimesOut(t *testing.T) {
	t.Parallel()
	registerStuck()
	input := fmt.Sprint("call ", stuckCalls.Add(1))
	release := make(chan struct{})
	stuckRelease.Store(input, release)
	s, _ := testService(t)
	info := testInfo()
	info.Session.Config.ActTimeoutS, info.Session.Config.ActRetries = 0.2, 0
	info.Session.Config.Tools = []schema.Tool{{Name: "stuck", Kind: schema.ToolGo}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := &act{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-a", Node: search("a", input)}
	a.Node.Tool = "stuck"
	result := make(chan *schema.ActDone, 1)
	go func() {
		d, err := s.execute(ctx, info, a)
		if err != nil {
			t.Errorf("execute: %v", err)
		}
		result <- d
	}()
	select {
	case d := <-result:
		if d == nil || d.Status != schema.ActFailed || d.ErrorKind != schema.ActErrTimeout {
			t.Errorf("the act: %+v, want failed as timed out", d)
		}
	case <-time.After(30 * time.Second):
		// The call is released only after execute returns: an execute that
		// waits for it never does, however long the machine takes.
		close(release)
		t.Fatal("execute had not returned 30 s after the act's 0.2 s time-out")
	}
	if n := s.overdueTools.Load(); n != 1 {
		t.Errorf("%d Go tool calls counted as running past their deadline, want 1", n)
	}
	close(release)
	for deadline := time.Now().Add(10 * time.Second); s.overdueTools.Load() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the call ended; %d still counted as running past their deadline", s.overdueTools.Load())
		}
	}
}
