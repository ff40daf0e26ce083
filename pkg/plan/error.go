package plan

import "fmt"

// ErrorKind says what is wrong with a planner's output.
type ErrorKind string

// The kinds of parse and validation errors.
const (
	ErrSyntax            ErrorKind = "syntax"             // the text is not a well-formed plan
	ErrEmpty             ErrorKind = "empty"              // no plan and no answer
	ErrDuplicateID       ErrorKind = "duplicate_id"       // two nodes share an id
	ErrUnknownDependency ErrorKind = "unknown_dependency" // a dependency names no node
	ErrCycle             ErrorKind = "cycle"              // the dependencies form a cycle
	ErrUnknownTool       ErrorKind = "unknown_tool"       // a node uses a tool that is not configured
	ErrTooManyNodes      ErrorKind = "too_many_nodes"     // more nodes than Options.MaxNodes
	ErrTooDeep           ErrorKind = "too_deep"           // a dependency chain longer than Options.MaxDepth
	ErrArgumentTooLarge  ErrorKind = "argument_too_large" // an argument larger than Options.MaxArgBytes
	ErrBadPlaceholder    ErrorKind = "bad_placeholder"    // a placeholder names no node, or a node that is not a dependency
	ErrTruncated         ErrorKind = "truncated"          // the output was cut off before a usable plan
	ErrUnknownFormat     ErrorKind = "unknown_format"     // no known plan format in the text
)

// Error is a parse or validation error. Its message is written for the
// planner: it can be put back into the planner's context verbatim.
type Error struct {
	Kind    ErrorKind `msgpack:"kind" json:"kind"`
	Message string    `msgpack:"message" json:"message"`
	Node    string    `msgpack:"node,omitempty" json:"node,omitempty"`   // the node at fault, if any
	Cycle   []string  `msgpack:"cycle,omitempty" json:"cycle,omitempty"` // closed: first id == last id
	Line    int       `msgpack:"line,omitempty" json:"line,omitempty"`   // 1-based line in the output, if known
}

func (e *Error) Error() string { return e.Message }

func errorf(kind ErrorKind, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}
