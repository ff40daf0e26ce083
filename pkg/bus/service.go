package bus

import (
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"
)

// Service makes a process visible to `nats micro ls|info|stats` (the NATS
// service protocol: $SRV.PING, $SRV.INFO, $SRV.STATS) with endpoints whose
// statistics are those of the real work: every consumer of the process
// (messages handled, errors, time in the handler) and every request
// endpoint (time until the reply). The micro package counts only the time
// its callback takes to return, which for work handed to a goroutine (every
// generation of the actor-gateway) is a microsecond.
type Service struct {
	identity    micro.ServiceIdentity
	description string
	started     time.Time

	mu        sync.Mutex
	endpoints []*Endpoint
	subs      []*nats.Subscription
	pinged    []func(id string) // told the instance a ping names (HdrPeer)
}

// onPing calls f with the instance that each ping of this service names as
// its sender (Peers), before the ping is answered.
func (s *Service) onPing(f func(id string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pinged = append(s.pinged, f)
}

// Endpoint is one kind of work a service does, with its statistics.
type Endpoint struct {
	info micro.EndpointInfo

	mu    sync.Mutex
	stats micro.EndpointStats
}

// ServiceConfig names a service.
type ServiceConfig struct {
	Name, Version, Description string
	Metadata                   map[string]string
}

// AddService answers the service protocol for this bus's connection. The
// bus's consumers and the endpoints added later report their statistics.
func (b *Bus) AddService(cfg ServiceConfig) (*Service, error) {
	s := &Service{
		identity:    micro.ServiceIdentity{Name: cfg.Name, ID: nuid.Next(), Version: cfg.Version, Metadata: cfg.Metadata},
		description: cfg.Description,
		started:     time.Now().UTC(),
	}
	if s.identity.Metadata == nil {
		s.identity.Metadata = map[string]string{}
	}
	reply := func(verb micro.Verb) nats.MsgHandler {
		return func(m *nats.Msg) {
			var v any
			switch verb {
			case micro.PingVerb:
				if id := m.Header.Get(HdrPeer); id != "" && m.Subject == "$SRV.PING."+cfg.Name {
					s.mu.Lock()
					fs := s.pinged
					s.mu.Unlock()
					for _, f := range fs {
						f(id)
					}
				}
				v = micro.Ping{ServiceIdentity: s.identity, Type: micro.PingResponseType}
			case micro.InfoVerb:
				v = s.Info()
			case micro.StatsVerb:
				v = s.Stats()
			}
			data, _ := json.Marshal(v)
			_ = m.Respond(data)
		}
	}
	for _, verb := range []micro.Verb{micro.PingVerb, micro.InfoVerb, micro.StatsVerb} {
		for _, subj := range []string{
			fmt.Sprintf("$SRV.%s", verb), fmt.Sprintf("$SRV.%s.%s", verb, cfg.Name), fmt.Sprintf("$SRV.%s.%s.%s", verb, cfg.Name, s.identity.ID),
		} {
			sub, err := b.NC.Subscribe(subj, reply(verb))
			if err != nil {
				s.Stop()
				return nil, fmt.Errorf("service %s: %w", cfg.Name, err)
			}
			s.subs = append(s.subs, sub)
		}
	}
	b.service = s
	return s, nil
}

// ID is the service instance's id (what `nats micro ls` shows).
func (s *Service) ID() string {
	if s == nil {
		return ""
	}
	return s.identity.ID
}

// Replica names the replica as people read it (its "replica" metadata,
// "<host>:<pid>/<n>" when the stack started it), else its id.
func (s *Service) Replica() string {
	if s == nil {
		return ""
	}
	if r := s.identity.Metadata["replica"]; r != "" {
		return r
	}
	return s.identity.ID
}

// Stop stops answering.
func (s *Service) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.subs = nil
}

// Endpoint adds an endpoint (or returns the one of that name).
func (s *Service) Endpoint(name, subject, queueGroup string, metadata map[string]string) *Endpoint {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.endpoints {
		if e.info.Name == name {
			return e
		}
	}
	if metadata == nil {
		metadata = map[string]string{}
	}
	e := &Endpoint{info: micro.EndpointInfo{Name: name, Subject: subject, QueueGroup: queueGroup, Metadata: metadata}}
	e.stats = micro.EndpointStats{Name: name, Subject: subject, QueueGroup: queueGroup}
	s.endpoints = append(s.endpoints, e)
	sort.Slice(s.endpoints, func(i, j int) bool { return s.endpoints[i].info.Name < s.endpoints[j].info.Name })
	return e
}

// Record counts one piece of work that took d and ended in err.
func (e *Endpoint) Record(d time.Duration, err error) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stats.NumRequests++
	e.stats.ProcessingTime += d
	e.stats.AverageProcessingTime = e.stats.ProcessingTime / time.Duration(e.stats.NumRequests)
	if err != nil {
		e.stats.NumErrors++
		e.stats.LastError = err.Error()
	}
}

// Info is the service's answer to $SRV.INFO.
func (s *Service) Info() micro.Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := micro.Info{ServiceIdentity: s.identity, Type: micro.InfoResponseType, Description: s.description, Endpoints: []micro.EndpointInfo{}}
	for _, e := range s.endpoints {
		info.Endpoints = append(info.Endpoints, e.info)
	}
	return info
}

// Stats is the service's answer to $SRV.STATS.
func (s *Service) Stats() micro.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := micro.Stats{ServiceIdentity: s.identity, Type: micro.StatsResponseType, Started: s.started, Endpoints: []*micro.EndpointStats{}}
	for _, e := range s.endpoints {
		e.mu.Lock()
		cp := e.stats
		e.mu.Unlock()
		st.Endpoints = append(st.Endpoints, &cp)
	}
	return st
}

// Service is the service this bus answers for, or nil.
func (b *Bus) Service() *Service { return b.service }
