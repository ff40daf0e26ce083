package bus

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

// TestAValueThatCannotBeReadIsAnError: a KV value that is there but cannot
// be decoded is an error naming the bucket, the key, the revision and what
// is wrong, from a plain read, a read from the leader and a
// compare-and-set alike; never a key absent or holding nothing. A msgpack
// nil or an empty array used to read as the zero value, found (the
// compare-and-set wrote over it as over a new key).
func TestAValueThatCannotBeReadIsAnError(t *testing.T) {
	b, _ := provisionedBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const key = "role.actor"
	for _, c := range []struct {
		what string
		body []byte
		says string
	}{
		{"nil", []byte{0xc0}, "the body is nil: want a map of fields"},
		{"an empty array", []byte{0x90}, "the body is an array: want a map of fields"},
		{"no msgpack", []byte("garbage"), "not a msgpack body"},
		{"a string", []byte{0xa1, 'x'}, `the body is the string "x"`},
		{"empty", nil, "the body is empty"},
	} {
		ack, err := b.JS.Publish(ctx, "$KV.sessions."+key, c.body)
		if err != nil {
			t.Fatal(err)
		}
		check := func(how string, found bool, err error) {
			t.Helper()
			want := fmt.Sprintf("kv sessions/%s revision %d: ", key, ack.Sequence)
			if err == nil || found || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), c.says) || fail.IsRetryable(err) {
				t.Errorf("%s of a value that is %s: found %v, %v; want a permanent error naming %q and %q", how, c.what, found, err, want, c.says)
			}
		}
		_, _, found, err := Get[schema.RoleState](ctx, b.Sessions, key)
		check("a read", found, err)
		b.Sessions.replicated = true // read from the leader, as on a cluster
		_, _, found, err = GetFresh[schema.RoleState](ctx, b.Sessions, key)
		b.Sessions.replicated = false
		check("a read from the leader", found, err)
		called := false
		_, wrote, err := Mutate(ctx, b.Sessions, key, func(v *schema.RoleState, exists bool) (bool, error) {
			called = true
			v.Role, v.Epoch = "actor", 1
			return true, nil
		})
		check("a compare-and-set", wrote, err)
		if called {
			t.Errorf("a compare-and-set of a value that is %s applied its change", c.what)
		}
	}
}

// TestAStoredMessageThatCannotBeReadIsAnError: a message read by subject
// that cannot be decoded is an error naming its subject and sequence, and
// so is a gateway's presence notice: the gateways of the role are not
// listed as if it were not there.
func TestAStoredMessageThatCannotBeReadIsAnError(t *testing.T) {
	b, _ := provisionedBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := "presence.actor.gw-1"
	ack, err := b.JS.Publish(ctx, subj, []byte("garbage"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.LastMsg(ctx, StreamPresence, subj)
	if err != nil || m == nil {
		t.Fatalf("the message: %v, %v", m, err)
	}
	var p schema.Presence
	want := fmt.Sprintf("%s sequence %d: ", subj, ack.Sequence)
	if err := m.Decode(&p); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "not a msgpack body") {
		t.Errorf("decoding it: %v; want an error naming %q and the failure", err, want)
	}
	ids, err := b.PresentGateways(ctx, "actor")
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("gateways present: %v, %v; want an error naming %q", ids, err, want)
	}
}
