package main

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// A tally counts the step's NATS messages by kind (-tally): a subscriber
// to every subject of the account sees what each client publishes and
// what the server sends (deliveries, publish acks, replies), and names
// each by what it is for. It costs the server one more delivery per
// message, so a run with it measures messages, not CPU.
type tally struct {
	mu  sync.Mutex
	n   map[string]int64
	b   map[string]int64 // bytes by kind: body and headers
	sub *nats.Subscription
	nc  *nats.Conn
}

func startTally(url string) (*tally, error) {
	nc, err := nats.Connect(url, nats.Name("bench-step-tally"))
	if err != nil {
		return nil, err
	}
	t := &tally{n: map[string]int64{}, b: map[string]int64{}, nc: nc}
	t.sub, err = nc.Subscribe(">", func(m *nats.Msg) {
		k := kindOf(m)
		size := int64(len(m.Data))
		for h, vs := range m.Header {
			for _, v := range vs {
				size += int64(len(h) + len(v) + 4)
			}
		}
		t.mu.Lock()
		t.n[k]++
		t.b[k] += size
		t.mu.Unlock()
	})
	if err == nil {
		err = t.sub.SetPendingLimits(-1, -1)
	}
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	return t, nil
}

// end stops the tally and returns its counts and bytes, with the messages
// the subscriber could not keep up with (dropped: the counts are then short).
func (t *tally) end() (n, b map[string]int64, err error) {
	_ = t.nc.Flush()
	dropped, _ := t.sub.Dropped()
	_ = t.sub.Unsubscribe()
	t.nc.Close()
	t.mu.Lock()
	defer t.mu.Unlock()
	if dropped > 0 {
		return t.n, t.b, fmt.Errorf("the tally dropped %d messages: its counts are short", dropped)
	}
	return t.n, t.b, nil
}

// kindOf names what a message is for: a publish to a stream, a delivery
// of a consumer, its ack, a pull, a direct get, or a reply of the server
// (a publish ack, a direct get's message, a pull's status, an API reply).
func kindOf(m *nats.Msg) string {
	s := m.Subject
	switch {
	case strings.HasPrefix(s, "$JS.ACK."):
		return "ack " + ackConsumer(s)
	case m.Reply != "" && strings.HasPrefix(m.Reply, "$JS.ACK."):
		return "delivery " + ackConsumer(m.Reply)
	case strings.HasPrefix(s, "$JS.API.CONSUMER.MSG.NEXT."):
		tok := strings.Split(s, ".")
		return "pull " + strings.Join(tok[5:], "/")
	case strings.HasPrefix(s, "$JS.API.DIRECT.GET."):
		return "direct get " + strings.Split(s, ".")[4]
	case strings.HasPrefix(s, "$JS.FC."):
		return "flow control"
	case strings.HasPrefix(s, "$JS.API."):
		tok := strings.Split(s, ".")
		return "api " + strings.Join(tok[2:min(len(tok), 4)], ".")
	case strings.HasPrefix(s, "_INBOX"):
		return "reply: " + replyKind(m)
	}
	tok := strings.SplitN(s, ".", 3)
	switch tok[0] {
	case "rollout", "plan", "act", "$KV", "$O", "control", "presence":
		if m.Reply == "" {
			return "core publish to " + bus.StreamOf(s) + " (no ack asked)"
		}
		return "publish " + bus.StreamOf(s)
	}
	return "core " + strings.Join(tok[:min(len(tok), 2)], ".")
}

// ackConsumer reads "stream/consumer" from an ack subject, either form:
// $JS.ACK.<stream>.<consumer>.… or $JS.ACK.<domain>.<hash>.<stream>.<consumer>.….
func ackConsumer(s string) string {
	tok := strings.Split(s, ".")
	if len(tok) >= 12 {
		return tok[4] + "/" + consumerName(tok[5])
	}
	if len(tok) >= 4 {
		return tok[2] + "/" + consumerName(tok[3])
	}
	return s
}

// consumerName folds the random names of ordered and ephemeral consumers
// (KV watchers, readers) into one.
func consumerName(c string) string {
	if len(c) >= 20 && !strings.ContainsAny(c, "-_") {
		return "(ephemeral)"
	}
	return c
}

func replyKind(m *nats.Msg) string {
	if st := m.Header.Get("Status"); st != "" {
		if st == "100" {
			return "idle heartbeat"
		}
		return "status " + st
	}
	if m.Header.Get(schema.HdrActorProgress) != "" {
		return "actor-gateway acknowledgement or progress"
	}
	if m.Header.Get(schema.HdrActorGateway) != "" {
		return "actor-gateway answer"
	}
	if m.Header.Get("Nats-Stream") != "" {
		return "direct get of " + m.Header.Get("Nats-Stream")
	}
	switch {
	case bytes.HasPrefix(m.Data, []byte(`{"stream":`)):
		return "publish ack"
	case bytes.HasPrefix(m.Data, []byte(`{"type":"io.nats`)):
		return "api reply"
	}
	return "other"
}

// TallyRow is one kind of message: how many, and their bytes (bodies and
// headers), per act.
type TallyRow struct {
	Kind     string  `json:"kind"`
	Count    int64   `json:"count"`
	PerAct   float64 `json:"per_act"`
	KBPerAct float64 `json:"kb_per_act"`
}

// tallyRows orders the counts, most first.
func tallyRows(n, b map[string]int64, acts float64) []TallyRow {
	var rows []TallyRow
	for k, c := range n {
		rows = append(rows, TallyRow{Kind: k, Count: c, PerAct: float64(c) / acts, KBPerAct: float64(b[k]) / 1024 / acts})
	}
	sort.Slice(rows, func(i, j int) bool {
		return rows[i].Count > rows[j].Count || (rows[i].Count == rows[j].Count && rows[i].Kind < rows[j].Kind)
	})
	return rows
}
