package telemetry

import (
	"context"
	"math/rand/v2"
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
	last     time.Time // the end of the span that ended last
	bad      []string
}

func (n *nesting) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (n *nesting) Shutdown(context.Context) error                  { return nil }
func (n *nesting) ForceFlush(context.Context) error                { return nil }

func (n *nesting) OnEnd(s sdktrace.ReadOnlySpan) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.spans++
	n.last = s.EndTime()
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

// fakeClocks stands in for the machine's clocks: the test moves the
// monotonic time, steps the wall clock, and has some readings preempted
// between their two reads (their wall time then lags by up to maxLag).
type fakeClocks struct {
	mu     sync.Mutex
	wall0  time.Time
	mono   time.Duration
	step   time.Duration // what the wall clock was stepped by, in all
	rng    *rand.Rand
	maxLag time.Duration
	burst  int // readings left that all lag by maxLag (a thread preempted again and again)
}

func (f *fakeClocks) read() reading {
	f.mu.Lock()
	defer f.mu.Unlock()
	var lag time.Duration
	if f.burst > 0 {
		f.burst--
		lag = f.maxLag
	} else if f.maxLag > 0 && f.rng.IntN(3) == 0 {
		lag = time.Duration(f.rng.Int64N(int64(f.maxLag)))
	}
	return reading{f.wall0.Add(f.mono + f.step - lag), f.mono}
}

// truth is the wall time now, as no preempted reading shows it.
func (f *fakeClocks) truth() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.wall0.Add(f.mono + f.step)
}

func (f *fakeClocks) advance(d time.Duration)  { f.mu.Lock(); f.mono += d; f.mu.Unlock() }
func (f *fakeClocks) stepWall(d time.Duration) { f.mu.Lock(); f.step += d; f.mu.Unlock() }

// useFakeClocks makes spanNow read f, on a fresh anchor, until the test ends.
func useFakeClocks(t *testing.T, f *fakeClocks) {
	t.Helper()
	oldRead, oldClock := readClocks, clock
	readClocks = f.read
	clock = newSpanClock()
	t.Cleanup(func() { readClocks, clock = oldRead, oldClock })
}

// TestSpanClockIgnoresPreemptedReadings: a third of the readings lag (their
// thread was preempted between the wall and the monotonic read), by up to
// 10 ms, and every tenth check against the wall clock reads nothing but
// lagging readings; the span clock's stamps are the true time all the
// same, every one, through 100 s of checks.
func TestSpanClockIgnoresPreemptedReadings(t *testing.T) {
	f := &fakeClocks{wall0: time.Date(2026, 11, 28, 20, 0, 0, 0, time.UTC), rng: rand.New(rand.NewPCG(1, 2)), maxLag: 10 * time.Millisecond}
	useFakeClocks(t, f)
	wrong := 0
	for i := range 100000 {
		f.advance(time.Millisecond)
		if int64(f.mono) >= clock.nextCheck.Load() && i%500 < 50 {
			f.burst = 10
		}
		if got, want := spanNow(), f.truth(); !got.Equal(want) {
			if wrong++; wrong <= 3 {
				t.Errorf("stamp %v, want the true time %v", got.Format("15:04:05.000000"), want.Format("15:04:05.000000"))
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%d stamps of 100000 were not the true time", wrong)
	}
}

// TestSpanClockFollowsASteppedWallClock: when the wall clock is stepped
// (a CI machine's jumped 0.9 s ahead while a test ran, and every act span,
// stamped on the timeline anchored at start-up, began before its turn, whose
// times the server stored), the span clock follows it within two checks,
// ahead or back, preempted readings or not.
func TestSpanClockFollowsASteppedWallClock(t *testing.T) {
	f := &fakeClocks{wall0: time.Date(2026, 11, 28, 20, 0, 0, 0, time.UTC), rng: rand.New(rand.NewPCG(3, 4)), maxLag: 5 * time.Millisecond}
	useFakeClocks(t, f)
	for _, step := range []time.Duration{900 * time.Millisecond, -2 * time.Second, 3 * time.Millisecond, -3 * time.Millisecond} {
		f.advance(time.Second)
		_ = spanNow()
		f.stepWall(step)
		if got := spanNow(); got.Equal(f.truth()) {
			t.Fatalf("step %v: followed before a check was due", step)
		}
		for range 2 {
			f.advance(checkEvery)
			_ = spanNow()
		}
		f.advance(time.Millisecond)
		if got, want := spanNow(), f.truth(); !got.Equal(want) {
			t.Errorf("step %v: stamp %v two checks later, want the wall clock's %v", step, got.Format("15:04:05.000000"), want.Format("15:04:05.000000"))
		}
	}
}

// TestLiveSpansNestAcrossAStep: a span that began before the wall clock
// was stepped ahead ends after it on the new timeline, so the child begun
// after the step lies within it. The SDK would have ended the parent at
// its start plus the monotonic time since, on the old timeline, 0.9 s
// before its child ended.
func TestLiveSpansNestAcrossAStep(t *testing.T) {
	f := &fakeClocks{wall0: time.Date(2026, 11, 28, 20, 0, 0, 0, time.UTC)}
	useFakeClocks(t, f)
	check := &nesting{children: map[trace.SpanID][][2]time.Time{}}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(check))
	st := &tracerState{tracer: tp.Tracer(scope)}
	current.Store(st)
	defer current.CompareAndSwap(st, nil)

	ctx, parent := StartSpan(context.Background(), "parent")
	f.advance(time.Second)
	f.stepWall(900 * time.Millisecond)
	f.advance(checkEvery)
	_, child := StartSpan(ctx, "child")
	f.advance(time.Millisecond)
	child.End()
	f.advance(time.Millisecond)
	parent.End()
	if check.spans != 2 {
		t.Fatalf("%d spans ended, want 2", check.spans)
	}
	if end := check.last; !end.Equal(f.truth()) {
		t.Errorf("the parent ended at %v, want the span clock's %v", end.Format("15:04:05.000000"), f.truth().Format("15:04:05.000000"))
	}
	for _, b := range check.bad {
		t.Error(b)
	}
}
