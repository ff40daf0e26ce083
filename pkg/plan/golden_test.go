package plan

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// golden is what a golden NAME.json holds for NAME.txt.
type golden struct {
	Result       *Result    `json:"result,omitempty"`
	Levels       [][]string `json:"levels,omitempty"`
	CriticalPath []string   `json:"critical_path,omitempty"`
	Error        *Error     `json:"error,omitempty"`
}

func marshalGolden(g golden) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	err := enc.Encode(g)
	return b.Bytes(), err
}

// goldenInputs returns the texts of testdata/golden/*.txt.
func goldenInputs(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "golden", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(b))
	}
	return out
}

// TestGolden parses every testdata/golden/NAME.txt, with the Options in
// NAME.opts.json if there is one, and compares with NAME.json.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "golden", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 25 {
		t.Fatalf("only %d golden inputs", len(files))
	}
	for _, in := range files {
		name := strings.TrimSuffix(in, ".txt")
		t.Run(filepath.Base(name), func(t *testing.T) {
			text, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			var opts Options
			if b, err := os.ReadFile(name + ".opts.json"); err == nil {
				if err := json.Unmarshal(b, &opts); err != nil {
					t.Fatal(err)
				}
			}
			var g golden
			r, err := Parse(string(text), opts)
			if err != nil {
				if !errors.As(err, &g.Error) {
					t.Fatalf("error %T", err)
				}
			} else {
				g.Result = &r
				if r.Plan != nil {
					g.Levels = r.Plan.Levels()
					g.CriticalPath, _ = r.Plan.CriticalPath(nil)
				}
			}
			got, err := marshalGolden(g)
			if err != nil {
				t.Fatal(err)
			}
			if *update {
				if err := os.WriteFile(name+".json", got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(name + ".json")
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s.json differs; got:\n%s", name, got)
			}
		})
	}
}
