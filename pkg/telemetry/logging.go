// Package telemetry sets up what people use to watch planact: structured
// zerolog logs with rollout/episode/turn/node/role fields, and Prometheus
// metrics.
package telemetry

import (
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// LogOptions configure the logger.
type LogOptions struct {
	Level  string // debug, info, warn, error; default info
	Pretty bool   // human-readable console output instead of JSON
}

// timeFormat sets zerolog's process-wide time format once: loggers made at
// once (tests, replicas in one process) would race on it.
var timeFormat sync.Once

// NewLogger returns a zerolog logger writing to w.
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

// LogOptionsFromEnv reads PLANACT_LOG_LEVEL and PLANACT_LOG_FORMAT (json|pretty).
func LogOptionsFromEnv(getenv func(string) string) LogOptions {
	if getenv == nil {
		getenv = os.Getenv
	}
	return LogOptions{Level: getenv("PLANACT_LOG_LEVEL"), Pretty: getenv("PLANACT_LOG_FORMAT") == "pretty"}
}
