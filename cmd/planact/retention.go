package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
)

// retention holds the flags that say how long planact keeps things and
// when it steps in, shared by up and serve; every process of a deployment
// must be given the same.
type retention struct {
	fs                      *flag.FlagSet
	history, results, stall *time.Duration
}

func retentionFlags(fs *flag.FlagSet) retention {
	d := bus.DefaultProvisioning()
	return retention{
		fs:      fs,
		history: fs.Duration("history", d.History, "how long rollouts are kept: stream history and each rollout's session (its record)"),
		results: fs.Duration("result-retention", d.ResultRetention, "how long a finished rollout's large results stay in the object stores"),
		stall:   fs.Duration("stall-timeout", 5*time.Minute, "how long an episode may go without progress before the watchdog drives it on"),
	}
}

// apply checks the values and sets them on o; a value that cannot work is
// an error naming its flag.
func (r retention) apply(o *stack.Options) error {
	if err := checkRetention(*r.history, *r.results); err != nil {
		return err
	}
	if *r.stall < time.Second {
		return fmt.Errorf("--stall-timeout %v: want at least 1s", *r.stall)
	}
	// A history not given is the default's, which provisioning (up) never
	// takes to lower a longer one it finds.
	if given(r.fs, "history") {
		o.Provisioning.History = *r.history
	}
	o.Provisioning.ResultRetention = *r.results
	o.Stall = *r.stall
	p := o.Provisioning
	if p.History == 0 {
		p.History = *r.history
	}
	if p.Replicas == 0 {
		p.Replicas = 1 // up: its embedded server is one node
	}
	if p.DupeWindow == 0 {
		p.DupeWindow = min(bus.DefaultProvisioning().DupeWindow, p.History)
	}
	if p.Storage == 0 {
		p.Storage = bus.DefaultStorage
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("--history/--result-retention: %w", err)
	}
	return nil
}

// checkRetention checks --history and --result-retention, naming the one
// that is wrong: 0 is not "the default".
func checkRetention(history, results time.Duration) error {
	if history < time.Second {
		return fmt.Errorf("--history %s: want at least 1s", shortDuration(history))
	}
	if results <= 0 || results > history {
		return fmt.Errorf("--result-retention %s: want more than 0 and at most --history (%s)", shortDuration(results), shortDuration(history))
	}
	return nil
}

// given says whether the flag name was set on the command line.
func given(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
