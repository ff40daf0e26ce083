// Package telemetry sets up what people use to watch planact: structured
// zerolog logs with rollout/episode/turn/node/role fields, and Prometheus
// metrics.
package telemetry

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// LogOptions configure the logger.
type LogOptions struct {
	Level  string // one of LogLevels (any case); "" is info
	Pretty bool   // human-readable console output instead of JSON
}

// LogLevels are the levels a logger takes.
var LogLevels = []string{"debug", "info", "warn", "error"}

// LogFormats are the values of PLANACT_LOG_FORMAT; "" is json.
var LogFormats = []string{"json", "pretty"}

// CheckLogLevel says what is wrong with a log level, naming where it came
// from (a flag, a variable): a level planact does not know is refused, not
// taken for info.
func CheckLogLevel(from, level string) error {
	if level != "" && !slices.Contains(LogLevels, strings.ToLower(level)) {
		return fmt.Errorf("%s %q: want %s", from, level, strings.Join(LogLevels, ", "))
	}
	return nil
}

// timeFormat sets zerolog's process-wide time format once: loggers made at
// once (tests, replicas in one process) would race on it.
var timeFormat sync.Once

// NewLogger returns a zerolog logger writing to w. A level CheckLogLevel
// refuses is taken for info: check it first where a person chose it.
func NewLogger(w io.Writer, o LogOptions) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(strings.ToLower(o.Level))
	if err != nil || o.Level == "" {
		lvl = zerolog.InfoLevel
	}
	if o.Pretty {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	timeFormat.Do(func() { zerolog.TimeFieldFormat = time.RFC3339Nano }) // zerolog's, process-wide
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger()
}

// LogOptionsFromEnv reads PLANACT_LOG_LEVEL (one of LogLevels) and
// PLANACT_LOG_FORMAT (json or pretty); a value it does not know is an error
// that names the variable.
func LogOptionsFromEnv(getenv func(string) string) (LogOptions, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	o := LogOptions{Level: getenv("PLANACT_LOG_LEVEL")}
	if err := CheckLogLevel("$PLANACT_LOG_LEVEL", o.Level); err != nil {
		return o, err
	}
	switch f := getenv("PLANACT_LOG_FORMAT"); strings.ToLower(f) {
	case "", "json":
	case "pretty":
		o.Pretty = true
	default:
		return o, fmt.Errorf("$PLANACT_LOG_FORMAT %q: want %s", f, strings.Join(LogFormats, " or "))
	}
	return o, nil
}
