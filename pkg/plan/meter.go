package plan

import "context"

// A meter counts the parser's work, in bytes examined, and stops the parse
// when its context ends. Every scanning loop charges what it examines, so
// the count is a measure of time that tests can bound without a clock:
// the parser examines each byte of its input a bounded number of times.
type meter struct {
	ctx   context.Context // nil: one that never ends
	steps int
	check int // steps at which ctx is looked at next
	err   error
}

// checkEvery is how much work the parser does between two looks at its
// context: a few tens of microseconds.
const checkEvery = 32 << 10

func newMeter(ctx context.Context) *meter {
	m := &meter{check: checkEvery}
	if ctx.Done() != nil {
		m.ctx = ctx
	}
	return m
}

// stopped is what a parse panics with when its context ends; ParseContext
// recovers it (as go/parser bails out), so that no scanning loop needs an
// error path of its own.
type stopped struct{ err error }

// add charges n steps, and panics with stopped once the context has ended.
func (m *meter) add(n int) {
	if err := m.charge(n); err != nil {
		panic(stopped{err})
	}
}

// charge is add for code that must not panic (an io.Reader that
// encoding/json calls): it returns the context's error instead.
func (m *meter) charge(n int) error {
	m.steps += n
	if m.err == nil && m.steps >= m.check {
		m.check = m.steps + checkEvery
		if m.ctx != nil {
			m.err = m.ctx.Err()
		}
	}
	return m.err
}

// halt panics with stopped if charge saw the context end.
func (m *meter) halt() {
	if m.err != nil {
		panic(stopped{m.err})
	}
}

// run calls f with a fresh meter for ctx, and returns ctx's error if f was
// stopped (or ctx had already ended), and the steps f took.
func run(ctx context.Context, f func(m *meter)) (steps int, err error) {
	m := newMeter(ctx)
	if m.ctx != nil {
		if err := m.ctx.Err(); err != nil {
			return 0, err
		}
	}
	defer func() {
		if r := recover(); r != nil {
			s, ok := r.(stopped)
			if !ok {
				panic(r)
			}
			steps, err = m.steps, s.err
		}
	}()
	f(m)
	return m.steps, nil
}
