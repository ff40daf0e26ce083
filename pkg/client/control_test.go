package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestPauseAndResumeTakeTheirRefusal: a pause or a resume planact refuses
// although the client let it go (a rule of a newer planact) is answered on
// control.<role>.refused; Pause used to pass that over and wait out the
// pause's time-out, and Resume returned as if it had been taken. Each now
// fails with ErrRefused and planact's reason, passing over the refusals of
// other messages and the answers to other pauses and resumes; one planact
// takes returns its answer (Resume: once planact said so).
func TestPauseAndResumeTakeTheirRefusal(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planact") // stands in for the session-store
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	// The stand-in refuses the actor's pauses and resumes, and takes the
	// planner's. An answer may be read before its publish is acknowledged,
	// and the test may end meanwhile: its publishes have a context of
	// their own, and their errors are told when the test looks.
	errs := make(chan error, 64)
	defer func() {
		select {
		case err := <-errs:
			t.Errorf("the stand-in could not answer: %v", err)
		default:
		}
	}()
	answer := func(m *nats.Msg) {
		id := m.Header.Get(jetstream.MsgIDHeader)
		role, verb, _ := subject.ParseControl(m.Subject)
		no := role == schema.RoleActor
		now := time.Now().UnixMilli()
		// Others' answers first, on both subjects: none is this message's.
		others := []schema.Message{
			&schema.Refused{Role: role, Verb: verb, ID: id + "-other", Reason: "not yours", AtMs: now},
			&schema.Refused{Role: role, Verb: map[string]string{"pause": "resume", "resume": "pause"}[verb], ID: id, Reason: "another verb", AtMs: now},
			&schema.Paused{Role: role, Epoch: 1, PauseID: "pause." + role + ".1", Mode: schema.PauseWait, AtMs: now},
			&schema.Resumed{Role: role, ResumeID: "resume." + role + ".1", AtMs: now},
		}
		var mine schema.Message
		switch {
		case no:
			mine = &schema.Refused{Role: role, Verb: verb, ID: id, Reason: verb + " of actor: mode \"soon\": want wait or abort (a newer rule)", AtMs: now}
		case verb == "pause":
			mine = &schema.Paused{Role: role, Epoch: 2, PauseID: id, Mode: schema.PauseWait, Drained: []string{"gw"}, AtMs: now}
		default:
			mine = &schema.Resumed{Role: role, ResumeID: id, WeightVersion: "v2", AtMs: now}
		}
		for _, a := range append(others, mine) {
			if err := b.Publish(context.Background(), a); err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		}
	}
	for _, verb := range []string{"pause", "resume"} {
		sub, err := b.NC.Subscribe(subject.Control("*", verb), answer)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	if err := b.NC.Flush(); err != nil {
		t.Fatal(err)
	}

	_, err = c.Pause(ctx, schema.RoleActor, client.PauseOptions{Timeout: time.Minute})
	if !errors.Is(err, client.ErrRefused) || !strings.Contains(err.Error(), `mode "soon"`) || !strings.Contains(err.Error(), "pause actor") {
		t.Errorf("a refused pause: %v; want ErrRefused with planact's reason", err)
	}
	err = c.Resume(ctx, schema.RoleActor, "actor-v2")
	if !errors.Is(err, client.ErrRefused) || !strings.Contains(err.Error(), "a newer rule") || !strings.Contains(err.Error(), "resume actor") {
		t.Errorf("a refused resume: %v; want ErrRefused with planact's reason", err)
	}

	p, err := c.Pause(ctx, schema.RolePlanner, client.PauseOptions{Timeout: time.Minute})
	if err != nil || p == nil || p.Epoch != 2 || len(p.Drained) != 1 {
		t.Errorf("a pause planact took: %+v, %v; want its answer (epoch 2)", p, err)
	}
	if err := c.Resume(ctx, schema.RolePlanner, "v2"); err != nil {
		t.Errorf("a resume planact took: %v", err)
	}
}

// TestResumeBoundsItsWait: a resume nobody answers (no session-store runs)
// ends with ErrTimeout, however long the caller's context.
func TestResumeBoundsItsWait(t *testing.T) {
	_, url := bustest.Server(t)
	bustest.Bus(t, url, "provision") // the streams exist, planact does not run
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	defer client.SetResumeAnswerWait(100 * time.Millisecond)()
	if err := c.Resume(t.Context(), schema.RoleActor, "actor-v2"); !errors.Is(err, client.ErrTimeout) {
		t.Errorf("a resume nobody answers: %v; want ErrTimeout", err)
	}
}

// TestResumeRefusesALongVersionBeforeSending: a weight_version planact
// would refuse (too long to repeat in its answers) is an error at once,
// as a pause's time-out under a second is, and nothing is sent.
func TestResumeRefusesALongVersionBeforeSending(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "provision")
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Resume(t.Context(), schema.RoleActor, strings.Repeat("v", schema.MaxWeightVersion+1))
	if err == nil || errors.Is(err, client.ErrTimeout) || !strings.Contains(err.Error(), "weight_version") {
		t.Errorf("a resume with a weight_version of %d bytes: %v; want an error naming it", schema.MaxWeightVersion+1, err)
	}
	if m, err := b.LastMsg(t.Context(), bus.StreamTrainer(schema.RoleActor), subject.Control(schema.RoleActor, "resume")); err != nil || m != nil {
		t.Errorf("the resume was sent (%v)", err)
	}
}

// TestCancelNotRecordedIsNotNothingToCancel: a cancel planact gave up
// without recording it (its sessions bucket failing) is answered
// "rejected", as one with nothing to abort is; Cancel took both for
// ErrNothingToCancel, which says the rollout had already ended, though
// this one may still run. Now only the second is.
func TestCancelNotRecordedIsNotNothingToCancel(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planact") // stands in for the session-store
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	why := map[int64]string{
		130: "could not be recorded (5 tries): nats: timeout; cancel again",
		131: "rollout 131 had already ended (ok at 2026-01-01T00:00:00Z); nothing to abort",
	}
	errs := make(chan error, 4)
	sub, err := b.NC.Subscribe("rollout.*.cancel.actor", func(m *nats.Msg) {
		var cl schema.Cancel
		if err := schema.Unmarshal(m.Data, &cl); err != nil {
			errs <- err
			return
		}
		detail := fmt.Sprintf("cancel %s by the actor trainer: %s", m.Header.Get(jetstream.MsgIDHeader), why[cl.Rollout])
		if err := b.Publish(context.Background(), &schema.Status{Rollout: cl.Rollout, Event: "rejected", Episode: -1, Detail: detail}); err != nil {
			errs <- err
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := b.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	err = c.Cancel(ctx, 130, schema.RoleActor, "enough")
	if err == nil || errors.Is(err, client.ErrNothingToCancel) || !strings.Contains(err.Error(), "could not be recorded") {
		t.Errorf("a cancel not recorded: %v; want an error saying so, not ErrNothingToCancel", err)
	}
	err = c.Cancel(ctx, 131, schema.RoleActor, "enough")
	if !errors.Is(err, client.ErrNothingToCancel) || !strings.Contains(err.Error(), "had already ended") {
		t.Errorf("a cancel of a rollout that ended: %v; want ErrNothingToCancel", err)
	}
	select {
	case err := <-errs:
		t.Errorf("the stand-in could not answer: %v", err)
	default:
	}
}

// TestCancelHearsItsAnswerAmongEpisodeEvents: the answer to a cancel comes
// on the rollout's status subject, after whatever episode events came
// while the cancel was being stored (thousands, in a large rollout). Cancel
// kept 64 events while its publish waited and dropped the rest, its answer
// with them, and said after a minute that planact never answered.
func TestCancelHearsItsAnswerAmongEpisodeEvents(t *testing.T) {
	_, url := bustest.Server(t) // the stand-in acknowledges the cancel itself
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const n = 132
	nc := bustest.Conn(t, url)
	errs := make(chan error, 4)
	say := func(st *schema.Status) {
		m, err := bus.NewMsg(context.Background(), st)
		if err == nil {
			err = nc.PublishMsg(m)
		}
		if err != nil {
			errs <- err
		}
	}
	sub, err := nc.Subscribe(fmt.Sprintf("rollout.%d.cancel.actor", n), func(m *nats.Msg) {
		// Before the stream acknowledges the cancel: 500 episodes end,
		// then the session-store answers.
		for e := range 500 {
			say(&schema.Status{Rollout: n, Event: "episode-completed", Episode: e})
		}
		say(&schema.Status{Rollout: n, Event: "cancelled", Episode: -1,
			Detail: fmt.Sprintf("cancel %s by the actor trainer: rollout %d aborted", m.Header.Get(jetstream.MsgIDHeader), n)})
		if err := m.Respond([]byte(`{"stream": "TRAINER_ACTOR", "seq": 1}`)); err != nil {
			errs <- err
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := c.Cancel(ctx, n, schema.RoleActor, "enough"); err != nil {
		t.Errorf("cancel: %v; want it answered (cancelled)", err)
	}
	select {
	case err := <-errs:
		t.Errorf("the stand-in could not answer: %v", err)
	default:
	}
}
