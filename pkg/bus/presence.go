package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// A gateway's presence is recorded, not found by asking: a pause must wait
// for every gateway that may run a generation of its role, and a gateway
// too loaded to answer a ping in time still runs one. Each gateway renews
// its notice (presence.<role>.<gateway>) every PresenceBeat while it runs;
// the PRESENCE stream keeps one notice per gateway and drops it when
// PresenceLease passes without a renewal (by its leader's clock), so a
// gateway that crashed drops out on its own, and one that stops says Gone.
const (
	PresenceBeat  = time.Second
	PresenceLease = 15 * time.Second
)

// Present records that gateway (its service instance id) runs role's
// generations, and renews the record every PresenceBeat until ctx ends. It
// returns once the first notice is stored (trying until ctx ends), so a
// gateway that serves only after Present returned is seen by every pause
// recorded after that. Call gone once nothing of the role runs on the
// gateway any more: it says so, so that a pause does not wait out its lease
// (once: calling it again does nothing).
func (b *Bus) Present(ctx context.Context, role, gateway string) (gone func(), err error) {
	notice := func(g bool) *schema.Presence {
		return &schema.Presence{Role: role, Gateway: gateway, Gone: g, AtMs: time.Now().UnixMilli()}
	}
	// A publish gives up after publishPatience; a gateway that starts while
	// PRESENCE has no leader (an election can outlast it) waits instead of
	// stopping: only ctx, or an error no retry mends, ends the wait.
	for wait := leaderPoll; ; wait = min(2*wait, PresenceBeat) {
		err := b.Publish(ctx, notice(false))
		if err == nil {
			break
		}
		if ctx.Err() != nil || !fail.IsRetryable(err) {
			return nil, fmt.Errorf("record %s gateway %s as present: %w", role, gateway, err)
		}
		b.Log.Warn().Err(err).Str("role", role).Str("gateway", gateway).Msg("presence not recorded yet; trying again")
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("record %s gateway %s as present: %w (%w)", role, gateway, err, ctx.Err())
		case <-time.After(wait):
		}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(PresenceBeat)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-stop:
				return
			case <-t.C:
			}
			// A renewal that fails is tried again at the next beat: the
			// lease outlasts a leader election (4–9 s).
			if err := b.Publish(ctx, notice(false)); err != nil && ctx.Err() == nil {
				b.Log.Warn().Err(err).Str("role", role).Str("gateway", gateway).Msg("presence not renewed; trying again")
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(stop)
			<-done
			gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), PublishTimeout)
			defer cancel()
			if err := b.Publish(gctx, notice(true)); err != nil {
				b.Log.Warn().Err(err).Str("role", role).Str("gateway", gateway).Msg("could not say this gateway stopped; pauses wait for it until its lease ends")
			}
		})
	}, nil
}

// PresentGateways lists the gateways of role that run now: those whose
// notice the PRESENCE stream holds and that did not say they stopped. Both
// reads are answered by the stream's leader, so a gateway whose notice was
// stored before the call is in the list.
func (b *Bus) PresentGateways(ctx context.Context, role string) ([]string, error) {
	body, _ := json.Marshal(map[string]any{"subjects_filter": subject.AllPresence(role)})
	rctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	reply, err := requestLeader(rctx, b.NC, "$JS.API.STREAM.INFO."+StreamPresence, body)
	if err != nil {
		return nil, fail.Transientf("list %s gateways: %w (%w)", role, err, ErrNotAnswered)
	}
	var info struct {
		Error *struct {
			Description string `json:"description"`
			ErrCode     int    `json:"err_code"`
		} `json:"error"`
		State struct {
			Subjects map[string]uint64 `json:"subjects"`
		} `json:"state"`
	}
	if err := json.Unmarshal(reply.Data, &info); err != nil {
		return nil, fail.Transientf("list %s gateways: bad reply: %w", role, err)
	}
	if info.Error != nil {
		return nil, fail.Transientf("list %s gateways: %s (%d)", role, info.Error.Description, info.Error.ErrCode)
	}
	var ids []string
	for subj := range info.State.Subjects {
		m, err := b.LastMsg(ctx, StreamPresence, subj)
		if err != nil {
			return nil, err
		}
		var p schema.Presence
		if m == nil { // its lease ended since the listing
			continue
		}
		if err := m.Decode(&p); err != nil {
			// Not permanent: a notice ages out with its lease.
			return nil, fail.Transientf("list %s gateways: presence %w", role, err)
		}
		if !p.Gone {
			ids = append(ids, p.Gateway)
		}
	}
	slices.Sort(ids)
	return ids, nil
}
