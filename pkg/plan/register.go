package plan

import (
	"fmt"
	"regexp"
	"slices"
	"sync"
)

// FormatFunc parses a plan written in a format of your own: the planner's
// whole output in, the nodes it holds out (each with an id, a tool, its
// arguments and the ids it depends on). planact validates them as it does
// every plan's (unique ids, known tools, existing dependencies, no cycle,
// placeholders, limits), a dependency named twice as one (an empty one is an
// error); an error is shown to the planner as a syntax error, so say what is
// wrong precisely. An output with no plan of this format returns an error:
// the answers (<answer>…</answer>) are found before.
type FormatFunc func(text string) ([]Node, error)

// CustomFormat is a plan format registered by a program of your own.
type CustomFormat struct {
	Parse FormatFunc
	// Instructions tell the planner how to write a plan in the format:
	// its prompt shows them when the rollout's plan_format names it.
	Instructions string
}

var (
	customMu   sync.RWMutex
	custom     = map[Format]CustomFormat{}
	formatName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)
)

// RegisterFormat adds a plan format, which a rollout's config names in
// plan_format (the planner is asked for it, and its outputs are parsed in
// it) or parse_format. It panics on a built-in name, a name that is not 1
// to 32 lower-case letters, digits, '_' or '-' from a letter, a format
// without Parse or Instructions, or a name registered twice: mistakes of a
// main, found when it starts.
func RegisterFormat(name Format, f CustomFormat) {
	switch {
	case slices.Contains(Formats(), name):
		panic(fmt.Sprintf("plan: RegisterFormat(%q): a built-in format", name))
	case !formatName.MatchString(string(name)):
		panic(fmt.Sprintf("plan: RegisterFormat(%q): want 1 to 32 lower-case letters, digits, '_' or '-', from a letter", name))
	case f.Parse == nil || f.Instructions == "":
		panic(fmt.Sprintf("plan: RegisterFormat(%q): a format needs Parse and Instructions", name))
	}
	customMu.Lock()
	defer customMu.Unlock()
	if _, dup := custom[name]; dup {
		panic(fmt.Sprintf("plan: RegisterFormat(%q) twice", name))
	}
	custom[name] = f
}

// Custom returns the registered format name.
func Custom(name Format) (CustomFormat, bool) {
	customMu.RLock()
	defer customMu.RUnlock()
	f, ok := custom[name]
	return f, ok
}

// CustomFormats lists the registered formats, sorted.
func CustomFormats() []Format {
	customMu.RLock()
	defer customMu.RUnlock()
	var out []Format
	for f := range custom {
		out = append(out, f)
	}
	slices.Sort(out)
	return out
}

// customParser is the formatParser of a registered format.
func customParser(f Format) (formatParser, bool) {
	cf, ok := Custom(f)
	if !ok {
		return nil, false
	}
	return func(d *doc, _ *Options) (parsed, *Error) {
		d.m.add(len(d.text)) // the format's parser reads the text once, as far as planact can count
		nodes, err := cf.Parse(d.text)
		if err != nil {
			return parsed{}, errorf(ErrSyntax, "%s plan: %s", f, err.Error())
		}
		p := parsed{format: f}
		for _, n := range nodes {
			// A dependency named twice is one dependency, as in the
			// built-in formats (the format's own slice is left as it is);
			// an empty one names no node, a mistake of the format's.
			if slices.Contains(n.Deps, "") {
				return parsed{}, errorf(ErrSyntax, "%s plan: node %s has an empty dependency", f, orUnnamed(n.ID))
			}
			n.Deps = dedupe(slices.Clone(n.Deps))
			p.nodes = append(p.nodes, rawNode{Node: n})
		}
		if len(p.nodes) == 0 {
			return parsed{}, errorf(ErrEmpty, "%s plan: no node", f)
		}
		return p, nil
	}, true
}
