package telemetry

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// nesting is a span processor that checks, as each span ends, that its
// children (ended before it) lie within it, exactly.
type nesting struct {
	mu       sync.Mutex
	children map[trace.SpanID][][2]time.Time
	spans    int
	bad      []string
}

func (n *nesting) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (n *nesting) Shutdown(context.Context) error                  { return nil }
func (n *nesting) ForceFlush(context.Context) error                { return nil }

func (n *nesting) OnEnd(s sdktrace.ReadOnlySpan) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.spans++
	id := s.SpanContext().SpanID()
	for _, c := range n.children[id] {
		if c[0].Before(s.StartTime()) || c[1].After(s.EndTime()) {
			if len(n.bad) < 5 {
				n.bad = append(n.bad, "child ["+c[0].Format("15:04:05.000000")+", "+c[1].Format("15:04:05.000000")+"] outside its parent ["+
					s.StartTime().Format("15:04:05.000000")+", "+s.EndTime().Format("15:04:05.000000")+"]")
			}
		}
	}
	delete(n.children, id)
	if p := s.Parent(); p.IsValid() {
		n.children[p.SpanID()] = append(n.children[p.SpanID()], [2]time.Time{s.StartTime(), s.EndTime()})
	}
}

// TestLiveSpansNestUnderLoad: a span started inside another ends inside it
// in the exported times too, however the threads that start them are
// preempted. time.Now reads the wall clock and then the monotonic clock;
// the SDK exports a span's start as that wall reading and its end as the
// start plus monotonic time, so a thread preempted between the two reads
// (a trace test under load once saw a parent's start 4.4 ms early) shifted
// a whole span against its children. StartSpan stamps spans from the
// monotonic clock alone.
func TestLiveSpansNestUnderLoad(t *testing.T) {
	check := &nesting{children: map[trace.SpanID][][2]time.Time{}}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(check))
	st := &tracerState{tracer: tp.Tracer(scope)}
	current.Store(st)
	defer current.CompareAndSwap(st, nil)
	// More threads than cores, so that the OS preempts them anywhere.
	threads := 4 * runtime.NumCPU()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(threads))
	var wg sync.WaitGroup
	for range threads {
		wg.Go(func() {
			for range 10000 {
				ctx, parent := StartSpan(context.Background(), "parent")
				_, child := StartSpan(ctx, "child")
				child.End()
				parent.End()
			}
		})
	}
	wg.Wait()
	if check.spans != 2*10000*threads {
		t.Fatalf("%d spans ended, want %d", check.spans, 2*10000*threads)
	}
	for _, b := range check.bad {
		t.Error(b)
	}
}

// TestSpanClockIsOneTimeline: between any two stamps of spanNow, the wall
// time advances exactly as the monotonic time does, however the calling
// threads are preempted; time.Now's own readings do not (see spanNow).
func TestSpanClockIsOneTimeline(t *testing.T) {
	threads := 4 * runtime.NumCPU()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(threads))
	first := spanNow()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var worst, nowWorst time.Duration
	for range threads {
		wg.Go(func() {
			var w, nw time.Duration
			for range 200000 {
				s := spanNow()
				w = max(w, (s.Round(0).Sub(first.Round(0)) - s.Sub(first)).Abs())
				n := time.Now()
				nw = max(nw, (n.Round(0).Sub(first.Round(0)) - n.Sub(first)).Abs())
			}
			mu.Lock()
			worst, nowWorst = max(worst, w), max(nowWorst, nw)
			mu.Unlock()
		})
	}
	wg.Wait()
	if worst != 0 {
		t.Errorf("span stamps: wall and monotonic time apart by up to %v, want 0", worst)
	}
	t.Logf("time.Now beside them: wall and monotonic time apart by up to %v", nowWorst)
}
