package plan

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkParse parses the golden corpus, one sub-benchmark per detected
// format, and reports throughput over the corpus bytes.
func BenchmarkParse(b *testing.B) {
	files, err := filepath.Glob(filepath.Join("testdata", "golden", "*.txt"))
	if err != nil {
		b.Fatal(err)
	}
	byFormat := map[Format][]string{}
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			b.Fatal(err)
		}
		f := Detect(string(data))
		byFormat[f] = append(byFormat[f], string(data))
	}
	for _, f := range Formats() {
		docs := byFormat[f]
		if len(docs) == 0 {
			continue
		}
		total := 0
		for _, d := range docs {
			total += len(d)
		}
		name := string(f)
		if f == FormatAuto {
			name = "undetected"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(total))
			for b.Loop() {
				for _, d := range docs {
					_, _ = Parse(d, Options{})
				}
			}
		})
	}
}
