package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/planact/planact/internal/freeport"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/embedded"
)

// servers is what the run measures on: one embedded server, or three
// clustered ones on loopback.
type servers struct {
	nodes []*server.Server
	// serviceURL is where planact's services (and the baselines' consumer
	// and responder) connect; clientURL where the trainers (and the
	// baselines' publisher and requester) do: different nodes on a cluster.
	serviceURL, clientURL string
	replicas              int
	stop                  func()
}

func (s *servers) describe(inProcess bool) string {
	if len(s.nodes) == 1 && inProcess {
		return "one embedded nats-server (JetStream, file storage, R1), in this process; the services connected to it in process (no socket), the trainers over TCP"
	}
	if len(s.nodes) == 1 {
		return "one embedded nats-server (JetStream, file storage, R1), in this process"
	}
	return fmt.Sprintf("a %d-node JetStream cluster on loopback, in this process (file storage, R%d streams and buckets); services on one node, the client on another", len(s.nodes), s.replicas)
}

// varz sums in_msgs and out_msgs over the nodes: on a cluster a message
// that crosses a route counts on both sides, and JetStream's replication
// traffic counts too.
func (s *servers) varz() (in, out int64, err error) {
	for _, n := range s.nodes {
		v, err := n.Varz(nil)
		if err != nil {
			return 0, 0, err
		}
		in += v.InMsgs
		out += v.OutMsgs
	}
	return in, out, nil
}

func startServers(cluster bool) (*servers, error) {
	if !cluster {
		dir, err := os.MkdirTemp("", "planact-overhead-*")
		if err != nil {
			return nil, err
		}
		srv, err := embedded.Start(embedded.Options{Dir: dir, Port: -1, Name: "overhead"})
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		return &servers{nodes: []*server.Server{srv.Server}, serviceURL: srv.ClientURL(), clientURL: srv.ClientURL(), replicas: 1,
			stop: func() { srv.Stop(); os.RemoveAll(dir) }}, nil
	}
	return startCluster(3)
}

// startCluster starts n clustered servers with JetStream, as
// e2e/cluster_test.go does from compose/nats (without its users).
func startCluster(n int) (*servers, error) {
	ports, err := freeport.Ports(n)
	if err != nil {
		return nil, err
	}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	s := &servers{replicas: 3}
	var dirs []string
	s.stop = func() {
		for _, ns := range s.nodes {
			ns.Shutdown()
			ns.WaitForShutdown()
		}
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}
	for i := range n {
		dir, err := os.MkdirTemp("", "planact-overhead-node-*")
		if err != nil {
			s.stop()
			return nil, err
		}
		dirs = append(dirs, dir)
		opts := &server.Options{
			ServerName: fmt.Sprintf("overhead-%d", i+1),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   dir,
			NoSigs:     true,
			NoLog:      true,
			MaxPayload: 8 << 20, // as pkg/embedded and compose/nats
			Cluster:    server.ClusterOpts{Name: "overhead", Host: "127.0.0.1", Port: ports[i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		}
		ns, err := server.NewServer(opts)
		if err != nil {
			s.stop()
			return nil, fmt.Errorf("node %d: %w", i+1, err)
		}
		go ns.Start()
		s.nodes = append(s.nodes, ns)
	}
	for i, ns := range s.nodes {
		if !ns.ReadyForConnections(30 * time.Second) {
			s.stop()
			return nil, fmt.Errorf("node %d not ready for connections", i+1)
		}
	}
	// JetStream needs a meta leader that sees every peer online before an
	// R3 stream can be placed ("no suitable peers for placement" otherwise).
	deadline := time.Now().Add(time.Minute)
	for !s.metaReady() {
		if time.Now().After(deadline) {
			s.stop()
			return nil, errors.New("the cluster's JetStream meta leader did not see every peer in a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.serviceURL, s.clientURL = s.nodes[0].ClientURL(), s.nodes[1].ClientURL()
	if err := s.probe(deadline); err != nil {
		s.stop()
		return nil, fmt.Errorf("cluster not ready: %w", err)
	}
	return s, nil
}

// metaReady: every node is current, and the meta leader sees the others
// current and online.
func (s *servers) metaReady() bool {
	var leader *server.Server
	for _, ns := range s.nodes {
		if !ns.JetStreamIsCurrent() {
			return false
		}
		if ns.JetStreamIsLeader() {
			leader = ns
		}
	}
	if leader == nil {
		return false
	}
	jsz, err := leader.Jsz(&server.JSzOptions{})
	if err != nil || jsz.Meta == nil || len(jsz.Meta.Replicas) != len(s.nodes)-1 {
		return false
	}
	for _, p := range jsz.Meta.Replicas {
		if !p.Current || p.Offline {
			return false
		}
	}
	return true
}

// probe creates a replicated stream, stores a message and reads it back
// through a consumer from another node, until that works or the deadline.
func (s *servers) probe(deadline time.Time) error {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var err error
	for ctx.Err() == nil {
		if err = s.probeOnce(ctx); err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return err
}

func (s *servers) probeOnce(ctx context.Context) error {
	nc, js, err := dial(s.serviceURL, "overhead-probe")
	if err != nil {
		return err
	}
	defer nc.Close()
	pnc, pjs, err := dial(s.clientURL, "overhead-probe-publisher")
	if err != nil {
		return err
	}
	defer pnc.Close()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_PROBE", Subjects: []string{"bench.probe"}, Storage: jetstream.FileStorage, Replicas: s.replicas})
	if err != nil {
		return err
	}
	defer js.DeleteStream(context.WithoutCancel(ctx), "BENCH_PROBE")
	if _, err := pjs.Publish(ctx, "bench.probe", []byte("probe")); err != nil {
		return err
	}
	c, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "probe", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return err
	}
	m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		return err
	}
	return m.Ack()
}
