package bus_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/freeport"
	"github.com/planact/planact/internal/natsbin"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/fail"
)

// startServer runs a nats-server (no JetStream) with opts on a free
// loopback port and returns its client URL.
func startServer(t *testing.T, opts *server.Options) string {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s.ClientURL()
}

// dial connects with o and proves the connection works with a round trip
// to the server.
func dial(o bus.ConnOptions) error {
	nc, err := o.Dial("test")
	if err != nil {
		return err
	}
	defer nc.Close()
	return nc.Flush()
}

// TestMutualTLS: an embedded server that requires client certificates
// signed by its CA lets in a client with the CA and a certificate, and
// refuses one without a certificate, one that does not trust the
// server's CA, and one that does not speak TLS.
func TestMutualTLS(t *testing.T) {
	ca := bustest.NewPKI(t, "planact")
	srvCert, srvKey := ca.Server("nats")
	cliCert, cliKey := ca.Client("session-store")
	other := bustest.NewPKI(t, "other")
	otherCert, otherKey := other.Client("intruder")

	s, err := embedded.Start(embedded.Options{Dir: t.TempDir(), Port: -1, TLSCert: srvCert, TLSKey: srvKey, TLSClientCA: ca.CA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	url := s.ClientURL()
	if !strings.HasPrefix(url, "tls://") {
		t.Fatalf("client URL %s: want tls://", url)
	}
	plain := "nats://" + strings.TrimPrefix(url, "tls://")

	mtls := bus.ConnOptions{URL: url, CA: ca.CA, Cert: cliCert, Key: cliKey}
	nc, err := mtls.Dial("provision")
	if err != nil {
		t.Fatalf("CA and client certificate: %v", err)
	}
	if err := bus.Provision(context.Background(), nc, bustest.Logger(), bus.Provisioning{}); err != nil {
		t.Fatalf("provision over mutual TLS: %v", err)
	}
	nc.Close()
	b, err := bus.Connect(context.Background(), mtls, "mtls", bustest.Logger(), bus.Provisioning{})
	if err != nil {
		t.Fatalf("CA and client certificate: %v", err)
	}
	if _, err := b.JS.Stream(context.Background(), bus.StreamRollout); err != nil {
		t.Errorf("provisioned over mutual TLS, yet: %v", err)
	}
	b.NC.Close()

	for _, tc := range []struct {
		name string
		o    bus.ConnOptions
		want string // in the error
	}{
		// The server refuses during the handshake: the client reads its
		// alert ("tls: certificate required") or, if it writes first, a
		// closed connection.
		{"no client certificate", bus.ConnOptions{URL: url, CA: ca.CA}, "tls"},
		// Go offers only a certificate the server's CAs signed: none.
		{"a client certificate from another CA", bus.ConnOptions{URL: url, CA: ca.CA, Cert: otherCert, Key: otherKey}, "tls"},
		{"the server's CA not trusted", bus.ConnOptions{URL: url, CA: other.CA, Cert: cliCert, Key: cliKey}, "x509: certificate signed by unknown authority"},
		{"the system's CAs", bus.ConnOptions{URL: url, Cert: cliCert, Key: cliKey}, "x509: certificate signed by unknown authority"},
		// A nats:// URL is upgraded to TLS when the server asks; it still needs a certificate.
		{"nats:// URL, no client certificate", bus.ConnOptions{URL: plain, CA: ca.CA}, "tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := dial(tc.o)
			if err == nil {
				t.Fatal("connected; want refused")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// TestNKey: a server that knows a user by its nkey lets in the holder of
// the seed file and no one else.
func TestNKey(t *testing.T) {
	dir := t.TempDir()
	seedFile := func(name string) (path, pub string) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		pub, _ = kp.PublicKey()
		path = filepath.Join(dir, name+".nk")
		if err := os.WriteFile(path, append(seed, '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
		return path, pub
	}
	known, pub := seedFile("act-dispatcher")
	stranger, _ := seedFile("stranger")
	url := startServer(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})

	if err := dial(bus.ConnOptions{URL: url, NKey: known}); err != nil {
		t.Errorf("known nkey: %v", err)
	}
	for name, o := range map[string]bus.ConnOptions{
		"another nkey": {URL: url, NKey: stranger},
		"no nkey":      {URL: url},
	} {
		if err := dial(o); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			t.Errorf("%s: %v, want an authorization violation", name, err)
		}
	}
}

// TestCreds: a server in operator mode (memory resolver) lets in a user
// whose .creds file holds a JWT its account signed, and refuses a user of
// an account the operator did not sign.
func TestCreds(t *testing.T) {
	op, _ := nkeys.CreateOperator()
	opPub, _ := op.PublicKey()
	opJWT, err := jwt.NewOperatorClaims(opPub).Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	opClaims, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		t.Fatal(err)
	}
	account := func(signer nkeys.KeyPair) (nkeys.KeyPair, string) {
		acc, _ := nkeys.CreateAccount()
		pub, _ := acc.PublicKey()
		tok, err := jwt.NewAccountClaims(pub).Encode(signer)
		if err != nil {
			t.Fatal(err)
		}
		return acc, tok
	}
	acc, accJWT := account(op)
	rogueOp, _ := nkeys.CreateOperator()
	rogue, _ := account(rogueOp)
	accPub, _ := acc.PublicKey()

	resolver := &server.MemAccResolver{}
	if err := resolver.Store(accPub, accJWT); err != nil {
		t.Fatal(err)
	}
	url := startServer(t, &server.Options{TrustedOperators: []*jwt.OperatorClaims{opClaims}, AccountResolver: resolver})

	dir := t.TempDir()
	creds := func(name string, acc nkeys.KeyPair) string {
		u, _ := nkeys.CreateUser()
		pub, _ := u.PublicKey()
		tok, err := jwt.NewUserClaims(pub).Encode(acc)
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := u.Seed()
		data, err := jwt.FormatUserConfig(tok, seed)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name+".creds")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}

	if err := dial(bus.ConnOptions{URL: url, Creds: creds("trainer", acc)}); err != nil {
		t.Errorf("creds of a signed account: %v", err)
	}
	if err := dial(bus.ConnOptions{URL: url, Creds: creds("rogue", rogue)}); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Errorf("creds of an unknown account: %v, want an authorization violation", err)
	}
}

// TestUserPasswordAndTokenFromEnv: user, password and token come from
// the environment and let a client in; wrong ones do not.
func TestUserPasswordAndTokenFromEnv(t *testing.T) {
	users := startServer(t, &server.Options{Users: []*server.User{{Username: "trainer", Password: "s3cret"}}})
	token := startServer(t, &server.Options{Authorization: "t0ken"})
	for _, tc := range []struct {
		name string
		env  map[string]string
		ok   bool
	}{
		{"user and password", map[string]string{"NATS_URL": users, "NATS_USER": "trainer", "NATS_PASSWORD": "s3cret"}, true},
		{"wrong password", map[string]string{"NATS_URL": users, "NATS_USER": "trainer", "NATS_PASSWORD": "guess"}, false},
		{"no user", map[string]string{"NATS_URL": users}, false},
		{"token", map[string]string{"NATS_URL": token, "NATS_TOKEN": "t0ken"}, true},
		{"wrong token", map[string]string{"NATS_URL": token, "NATS_TOKEN": "guess"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := bus.ConnOptions{}.Resolve(func(k string) string { return tc.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			err = dial(o)
			switch {
			case tc.ok && err != nil:
				t.Errorf("refused: %v", err)
			case !tc.ok && err == nil:
				t.Errorf("let in")
			case !tc.ok && strings.Contains(err.Error(), "s3cret"):
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}

// TestResolve: flags win over their environment variables, secrets come
// only from the environment, and every mistake is reported, naming the
// flag or variable, before any connection.
func TestResolve(t *testing.T) {
	dir := t.TempDir()
	ca := bustest.NewPKI(t, "planact")
	cert, key := ca.Client("client")
	_, otherKey := ca.Client("other")
	notPEM := filepath.Join(dir, "not.pem")
	os.WriteFile(notPEM, []byte("hello"), 0o600)
	seed := filepath.Join(dir, "user.nk")
	kp, _ := nkeys.CreateUser()
	s, _ := kp.Seed()
	os.WriteFile(seed, s, 0o600)
	accSeed := filepath.Join(dir, "account.nk")
	akp, _ := nkeys.CreateAccount()
	s, _ = akp.Seed()
	os.WriteFile(accSeed, s, 0o600)
	missing := filepath.Join(dir, "missing")

	for _, tc := range []struct {
		name  string
		args  []string
		env   map[string]string
		check func(bus.ConnOptions) bool
		err   string // "" = no error; else in the error
	}{
		{name: "nothing", check: func(o bus.ConnOptions) bool { return o.URL == "" && o.Servers() == "nats://127.0.0.1:4222" }},
		{name: "flag wins over env", args: []string{"--nats", "nats://a:4222,nats://b:4222"}, env: map[string]string{"NATS_URL": "nats://c:4222"},
			check: func(o bus.ConnOptions) bool { return o.Servers() == "nats://a:4222,nats://b:4222" }},
		{name: "env fills", env: map[string]string{"NATS_URL": "nats://c:4222", "NATS_CA": ca.CA, "NATS_CERT": cert, "NATS_KEY": key, "NATS_NKEY": seed},
			check: func(o bus.ConnOptions) bool {
				return o.URL == "nats://c:4222" && o.CA == ca.CA && o.Cert == cert && o.Key == key && o.NKey == seed
			}},
		{name: "tls flags", args: []string{"--tls-ca", ca.CA, "--tls-cert", cert, "--tls-key", key, "--tls-first"},
			check: func(o bus.ConnOptions) bool { return o.CA == ca.CA && o.Cert == cert && o.Key == key && o.TLSFirst }},
		{name: "user and password", env: map[string]string{"NATS_USER": "u", "NATS_PASSWORD": "p"}, check: func(o bus.ConnOptions) bool { return o.User == "u" && o.Password == "p" }},
		{name: "password is not a flag", args: []string{"--password", "p"}, err: "flag provided but not defined: -password"},
		{name: "user is not a flag", args: []string{"--user", "u"}, err: "flag provided but not defined: -user"},
		{name: "token is not a flag", args: []string{"--token", "t"}, err: "flag provided but not defined: -token"},
		{name: "missing creds", args: []string{"--creds", missing}, err: "nats: --creds " + missing + ": open " + missing + ": no such file or directory"},
		{name: "creds without a JWT", env: map[string]string{"NATS_CREDS": seed}, err: "nats: $NATS_CREDS " + seed + ": no user JWT in it"},
		{name: "missing nkey", env: map[string]string{"NATS_NKEY": missing}, err: "nats: $NATS_NKEY " + missing + ": open"},
		{name: "nkey not a user seed", args: []string{"--nkey", accSeed}, err: "nats: --nkey " + accSeed + ": no user nkey seed (SU…) in it"},
		{name: "unreadable CA", args: []string{"--tls-ca", missing}, err: "nats: --tls-ca " + missing + ": open " + missing},
		{name: "CA without a certificate", env: map[string]string{"NATS_CA": notPEM}, err: "nats: $NATS_CA " + notPEM + ": no PEM certificate in it"},
		{name: "cert without key", args: []string{"--tls-cert", cert}, err: "nats: --tls-cert without --tls-key"},
		{name: "key without cert", env: map[string]string{"NATS_KEY": key}, err: "nats: $NATS_KEY without --tls-cert"},
		{name: "cert and the wrong key", args: []string{"--tls-cert", cert}, env: map[string]string{"NATS_KEY": otherKey},
			err: "nats: --tls-cert " + cert + ", $NATS_KEY " + otherKey + ": tls: private key does not match public key"},
		{name: "cert not PEM", args: []string{"--tls-cert", notPEM, "--tls-key", key}, err: "nats: --tls-cert " + notPEM + ", --tls-key " + key + ": tls: failed to find any PEM data in certificate input"},
		{name: "password without user", env: map[string]string{"NATS_PASSWORD": "p"}, err: "nats: $NATS_PASSWORD without $NATS_USER"},
		{name: "user without password", env: map[string]string{"NATS_USER": "u"}, err: "nats: $NATS_USER without $NATS_PASSWORD"},
		{name: "two ways to authenticate", args: []string{"--nkey", seed}, env: map[string]string{"NATS_USER": "u", "NATS_PASSWORD": "p"},
			err: "nats: --nkey and $NATS_USER: give one way to authenticate, not several"},
		{name: "token and nkey", env: map[string]string{"NATS_TOKEN": "t", "NATS_NKEY": seed}, err: "nats: $NATS_NKEY and $NATS_TOKEN: give one way"},
		{name: "inbox of the user", env: map[string]string{"NATS_USER": "trainer-planner", "NATS_PASSWORD": "p"},
			check: func(o bus.ConnOptions) bool { return o.Inbox() == "_INBOX_trainer-planner" }},
		{name: "inbox of the URL's user", args: []string{"--nats", "nats://viewer:pw@a:4222,nats://viewer:pw@b:4222"},
			check: func(o bus.ConnOptions) bool { return o.Inbox() == "_INBOX_viewer" }},
		{name: "no user, nats.go's inbox", check: func(o bus.ConnOptions) bool { return o.Inbox() == "" }},
		{name: "inbox flag wins", args: []string{"--inbox-prefix", "_INBOX_mine"}, env: map[string]string{"NATS_INBOX_PREFIX": "_INBOX_env", "NATS_USER": "u", "NATS_PASSWORD": "p"},
			check: func(o bus.ConnOptions) bool { return o.Inbox() == "_INBOX_mine" }},
		{name: "inbox from the environment", env: map[string]string{"NATS_INBOX_PREFIX": "_INBOX_env.deep"},
			check: func(o bus.ConnOptions) bool { return o.Inbox() == "_INBOX_env.deep" }},
		{name: "inbox with a wildcard", args: []string{"--inbox-prefix", "_INBOX.>"}, err: `nats: --inbox-prefix "_INBOX.>": want subject tokens`},
		{name: "inbox ending in a dot", env: map[string]string{"NATS_INBOX_PREFIX": "_INBOX_x."}, err: `nats: $NATS_INBOX_PREFIX "_INBOX_x.": want subject tokens`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var o bus.ConnOptions
			o.AddFlags(fs, "")
			err := fs.Parse(tc.args)
			if err == nil {
				o, err = o.Resolve(func(k string) string { return tc.env[k] })
			}
			if err == nil {
				_, err = o.NATSOptions()
			}
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.err != "" && err == nil:
				t.Fatalf("no error, want %q", tc.err)
			case tc.err != "" && !strings.HasPrefix(err.Error(), tc.err):
				t.Fatalf("error %q, want it to start %q", err, tc.err)
			case tc.check != nil && !tc.check(o):
				t.Errorf("resolved %+v", o)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                          "nats://127.0.0.1:4222",
		"nats://trainer:s3cret@a:4222,nats://b:4222":     "nats://trainer:xxxxx@a:4222,nats://b:4222",
		"tls://t0ken@a:4222":                             "tls://xxxxx@a:4222",
		"127.0.0.1:4222":                                 "127.0.0.1:4222",
		"nats://u:p@a:4222, nats://session-store:pw@b:1": "nats://u:xxxxx@a:4222,nats://session-store:xxxxx@b:1",
	} {
		if got := bus.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestOldServerRefused: every way planact connects refuses a nats-server
// older than it needs at once, with one line naming both versions; the
// error is permanent. Against Debian's nats-server (2.9) a service retried
// provisioning for a minute ("limit marker TTLs not supported by server")
// and a trainer waited for its whole time-out.
func TestOldServerRefused(t *testing.T) {
	old := natsbin.Old(t)
	want := "nats-server too old for planact: " + old.URL + " runs " + old.Version + ", planact needs 2.12.0 or later"
	check := func(what string, err error) {
		t.Helper()
		if err == nil || err.Error() != want || !errors.Is(err, bus.ErrServerTooOld) || fail.KindOf(err) != fail.Permanent || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want the permanent error %q", what, err, want)
		}
	}
	_, err := bus.Connect(context.Background(), bus.ConnOptions{URL: old.URL}, "test", bustest.Logger(), bus.Provisioning{})
	check("Connect", err)
	_, err = bus.ConnectReader(context.Background(), bus.ConnOptions{URL: old.URL}, "test", bustest.Logger())
	check("ConnectReader", err)
	_, err = bus.ConnOptions{URL: old.URL}.Dial("test")
	check("Dial", err)
	nc, err := nats.Connect(old.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, err = bus.Open(context.Background(), nc, bustest.Logger(), bus.Provisioning{})
	check("Open", err)
	// The server's streams were left alone.
	js, _ := jetstream.New(nc)
	if _, err := js.Stream(context.Background(), bus.StreamRollout); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream %s on the old server: %v, want none provisioned", bus.StreamRollout, err)
	}
}

// TestDialWaitsForAServerStillStarting: a service started before its NATS
// server (or while it restarts) waits for it and then connects; before,
// its first dial's "connection refused" stopped the service. What cannot
// be helped by waiting (credentials refused) still ends the dial at once,
// and a dial given up says why.
func TestDialWaitsForAServerStillStarting(t *testing.T) {
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	o := bus.ConnOptions{URL: fmt.Sprintf("nats://127.0.0.1:%d", port)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	failed := make(chan error, 100)
	type dialed struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan dialed, 1)
	go func() {
		nc, err := o.DialContext(ctx, "test", func(err error) {
			select {
			case failed <- err:
			default:
			}
		})
		done <- dialed{nc, err}
	}()
	first := <-failed // nothing listens yet
	if !bus.Unreachable(first) {
		t.Errorf("first attempt: %v, want an unreachable server", first)
	}
	s, err := embedded.Start(embedded.Options{Dir: t.TempDir(), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	d := <-done
	if d.err != nil {
		t.Fatalf("dial once the server is up: %v", d.err)
	}
	d.nc.Close()

	// Refused credentials are not retried.
	locked, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, Authorization: "s3cret", NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go locked.Start()
	defer locked.Shutdown()
	if !locked.ReadyForConnections(10 * time.Second) {
		t.Fatal("locked server not ready")
	}
	retried := false
	_, err = bus.ConnOptions{URL: locked.ClientURL()}.DialContext(ctx, "test", func(error) { retried = true })
	if !errors.Is(err, nats.ErrAuthorization) || retried {
		t.Errorf("dial with no token: %v (retried: %v), want the authorization error at once", err, retried)
	}

	// Given up: the error names the last failure and why it stopped.
	s.Stop()
	gone, stop := context.WithCancel(context.Background())
	stop()
	_, err = o.DialContext(gone, "test", nil)
	if err == nil || !bus.Unreachable(err) || !errors.Is(err, context.Canceled) {
		t.Errorf("dial given up: %v, want the unreachable server and the cancellation", err)
	}
}

// TestDialInProcess: with InProcess set, Dial reaches that server without
// its listener: a URL where nothing listens still connects, and the
// server counts the connection as one of its own (no socket, so no port).
func TestDialInProcess(t *testing.T) {
	srv, _ := bustest.Server(t)
	nc, err := bus.ConnOptions{URL: "nats://127.0.0.1:1", InProcess: srv.Server}.Dial("test-in-process")
	if err != nil {
		t.Fatalf("dial in process: %v", err)
	}
	defer nc.Close()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	cz, err := srv.Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range cz.Conns {
		if c.Name == "test-in-process" {
			found = true
			if c.Port != 0 {
				t.Errorf("the connection has port %d: it went over a socket", c.Port)
			}
		}
	}
	if !found {
		t.Errorf("the server does not list the connection: %+v", cz.Conns)
	}
	// Without it, the same URL is what it is: nothing listens there.
	if _, err := (bus.ConnOptions{URL: "nats://127.0.0.1:1"}).Dial("test"); err == nil {
		t.Error("dial nats://127.0.0.1:1 without InProcess: connected")
	}
}
