// Package fail classifies errors by what should happen next: retry later
// (transient), give up on this input (permanent), or reject the input as
// malformed (invalid). The bus maps the kind to nak-with-delay or term.
package fail

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Kind says whether an operation may succeed if it is tried again.
type Kind int

const (
	// Unknown errors are treated as transient: retrying is the safe default.
	Unknown Kind = iota
	// Transient errors may go away on their own (time-outs, 5xx, a busy engine).
	Transient
	// Permanent errors will happen again with the same input (unknown tool, 4xx).
	Permanent
	// Invalid input cannot be decoded or violates its schema.
	Invalid
)

func (k Kind) String() string {
	switch k {
	case Transient:
		return "transient"
	case Permanent:
		return "permanent"
	case Invalid:
		return "invalid"
	default:
		return "unknown"
	}
}

// Error is an error with a kind.
type Error struct {
	Kind Kind
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// E wraps err with a kind. A nil err stays nil.
func E(kind Kind, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Kind: kind, Err: err}
}

// Transientf, Permanentf and Invalidf build a kinded error from a format.
func Transientf(format string, a ...any) error { return E(Transient, fmt.Errorf(format, a...)) }

// Permanentf builds a permanent error from a format.
func Permanentf(format string, a ...any) error { return E(Permanent, fmt.Errorf(format, a...)) }

// Invalidf builds an invalid-input error from a format.
func Invalidf(format string, a ...any) error { return E(Invalid, fmt.Errorf(format, a...)) }

// KindOf returns the kind of the outermost kinded error in err's chain.
// Context deadlines count as transient; cancellation as unknown.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return Transient
	}
	return Unknown
}

// IsRetryable reports whether trying again may help.
func IsRetryable(err error) bool {
	k := KindOf(err)
	return k == Transient || k == Unknown
}

// laterError is a transient error that says when to try again.
type laterError struct {
	after time.Duration
	err   error
}

func (e *laterError) Error() string { return e.err.Error() }
func (e *laterError) Unwrap() error { return &Error{Kind: Transient, Err: e.err} }

// After wraps err as transient, to be tried again after d (not before).
func After(d time.Duration, err error) error {
	if err == nil {
		return nil
	}
	return &laterError{after: d, err: err}
}

// RetryAfter returns when an error made by After asks to be tried again.
func RetryAfter(err error) (time.Duration, bool) {
	var e *laterError
	if errors.As(err, &e) {
		return e.after, true
	}
	return 0, false
}
