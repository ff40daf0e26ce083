package sessionstore

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
)

// TestDeliveredSamplesLongerThanTheirBytes: an array header that claims
// more samples than its bytes can hold (a corrupt group message or
// samples object: a few bytes) is refused, naming where it ends. It used
// to size the samples by the header: four billion of them, and the
// session-store died out of memory, for good, at every try to assemble.
func TestDeliveredSamplesLongerThanTheirBytes(t *testing.T) {
	for name, data := range map[string][]byte{
		"array32 of 2^32-1, one empty sample": {0xdd, 0xff, 0xff, 0xff, 0xff, 0x80},
		"array32 of 2^31, nothing after":      {0xdd, 0x80, 0x00, 0x00, 0x00},
		"array16 of 65535, one empty sample":  {0xdc, 0xff, 0xff, 0x80},
	} {
		held, err := splitSamples(data)
		if err == nil || !strings.Contains(err.Error(), "samples[") {
			t.Errorf("%s: %d samples, %v; want an error naming the sample that is not there", name, len(held), err)
		}
	}
}

// FuzzSplitSamples: whatever the bytes, splitting them returns samples or
// an error, never a crash; samples that split encode back to the bytes
// they came from.
func FuzzSplitSamples(f *testing.F) {
	for _, n := range []int{0, 1, 3} {
		data, err := schema.Marshal(randomSamples(rand.New(rand.NewPCG(uint64(n), 9)), n, 20))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		held, err := splitSamples(data)
		if err != nil || len(held) == 0 {
			return
		}
		size := 0
		for _, h := range held {
			size += len(h.raw)
		}
		if size > len(data) {
			t.Fatalf("%d samples of %d bytes split from %d bytes", len(held), size, len(data))
		}
	})
}
