package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/planact/planact/pkg/schema"
)

// runDecode turns one msgpack message body into indented JSON, so that
// `nats sub 'plan.>' --translate 'planact decode'` prints readable traffic.
func runDecode(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("decode", flag.ContinueOnError)
	fs.SetOutput(stderr)
	compact := fs.Bool("compact", false, "one line of JSON instead of indented")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: planact decode [--compact] [file]   (reads stdin without a file)")
		fs.PrintDefaults()
	}
	// A flag after the file (decode body.bin --compact) counts too.
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("decode: unexpected arguments %q: decode reads one file", pos[1:])
	}
	in := stdin
	if len(pos) == 1 {
		f, err := os.Open(pos[0])
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	data, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	v, err := schema.ToJSONable(data)
	if err != nil {
		// Not msgpack: pass it through untouched, as --translate expects.
		_, werr := stdout.Write(data)
		if werr != nil {
			return werr
		}
		return fmt.Errorf("decode: %w", err)
	}
	enc := json.NewEncoder(stdout)
	if !*compact {
		enc.SetIndent("", "  ")
	}
	return enc.Encode(v)
}
