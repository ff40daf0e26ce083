package bus

import (
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// Inbox routes the replies of many requests over one subscription of a
// connection: each request gets a reply subject of its own under the
// inbox's prefix, and the replies that come there are handed to the
// function given for it. A subscription per request would cost the
// server a subscribe and an unsubscribe each, and a synchronous one
// nats.go's channel of 64k slots. The zero Inbox is ready; it subscribes
// on first use.
type Inbox struct {
	once   sync.Once
	prefix string
	err    error
	mu     sync.Mutex
	routes map[string]func(*nats.Msg)
}

// Open returns a new reply subject whose replies go to route (called on
// the subscription's goroutine: it must not block), and the function that
// ends it; a reply that comes after the end is dropped.
func (in *Inbox) Open(nc *nats.Conn, route func(*nats.Msg)) (subject string, end func(), err error) {
	in.once.Do(func() {
		in.prefix = nc.NewInbox()
		in.routes = map[string]func(*nats.Msg){}
		_, in.err = nc.Subscribe(in.prefix+".*", func(m *nats.Msg) {
			token := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
			in.mu.Lock()
			r := in.routes[token]
			in.mu.Unlock()
			if r != nil {
				r(m)
			}
		})
	})
	if in.err != nil {
		return "", nil, in.err
	}
	token := nuid.Next()
	in.mu.Lock()
	in.routes[token] = route
	in.mu.Unlock()
	return in.prefix + "." + token, func() {
		in.mu.Lock()
		delete(in.routes, token)
		in.mu.Unlock()
	}, nil
}
