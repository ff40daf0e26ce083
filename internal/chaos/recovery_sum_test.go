package chaos_test

import (
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/chaos"
)

// A fault after which an episode in flight never moved again has no time
// by which every episode had moved: the slowest of those that did is not
// one, and must not stand for it in the median or the maximum.
func TestRecoveryOfEpisodesThatNeverMoved(t *testing.T) {
	fault := func(full time.Duration, unrecovered int) chaos.FaultRecord {
		return chaos.FaultRecord{Kind: "kill:act-dispatcher", Recovery: chaos.Recovery{InFlight: 3, Full: full, Unrecovered: unrecovered, Measured: true}}
	}
	// Two of three episodes never moved; the third did after 1s.
	st := chaos.SumRecovery([]chaos.FaultRecord{fault(time.Second, 2)})["kill:act-dispatcher"]
	if st.MaxFull != 0 || st.MedianFull != 0 || st.Unrecovered != 2 {
		t.Fatalf("all moved: median %s, max %s, %d never moved; want no time, 2 never moved", st.MedianFull, st.MaxFull, st.Unrecovered)
	}
	// Beside faults after which all moved, within 4s and 6s.
	st = chaos.SumRecovery([]chaos.FaultRecord{fault(4*time.Second, 0), fault(time.Second, 2), fault(6*time.Second, 0), fault(5*time.Second, 0)})["kill:act-dispatcher"]
	if st.MedianFull != 5*time.Second || st.MaxFull != 6*time.Second {
		t.Errorf("all moved: median %s, max %s; want 5s, 6s (the faults after which all moved)", st.MedianFull, st.MaxFull)
	}
	r := &chaos.Report{Topology: chaos.Single, Faults: []chaos.FaultRecord{fault(time.Second, 2)}}
	r.Recovery = chaos.SumRecovery(r.Faults)
	if md := chaos.Markdown([]*chaos.Report{r}); !strings.Contains(md, "| – / never | 2 |") {
		t.Errorf("the fault's row does not say that not every episode moved:\n%s", md)
	}
}
