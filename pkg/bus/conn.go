package bus

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/planact/planact/pkg/subject"
)

// The environment variables a connection reads: the names the nats CLI
// reads, so that one environment serves both.
const (
	EnvURL      = "NATS_URL"
	EnvCreds    = "NATS_CREDS"
	EnvNKey     = "NATS_NKEY"
	EnvUser     = "NATS_USER"
	EnvPassword = "NATS_PASSWORD"
	EnvToken    = "NATS_TOKEN"
	EnvCA       = "NATS_CA"
	EnvCert     = "NATS_CERT"
	EnvKey      = "NATS_KEY"
	// EnvInboxPrefix is planact's own: the nats CLI takes only the flag
	// --inbox-prefix (or a context's inbox_prefix).
	EnvInboxPrefix = "NATS_INBOX_PREFIX"
)

// InboxPrefix is the inbox prefix of user: where the replies to its
// requests, the answers of the JetStream API and its consumers' deliveries
// come. compose/nats/accounts.conf lets each user subscribe under its own
// prefix only, so that nobody reads what is delivered to another.
func InboxPrefix(user string) string { return "_INBOX_" + subject.Token(user) }

// ConnOptions say how to reach NATS: which servers, who to be there and
// which certificates to trust. Every command and service connects with one.
type ConnOptions struct {
	// URL is one server URL or several, comma-separated (a cluster's
	// seeds); empty means nats://127.0.0.1:4222.
	URL string
	// Creds is a credentials file (a user JWT and its nkey seed) for
	// servers in operator mode.
	Creds string
	// NKey is a file holding a user's nkey seed (SU…).
	NKey string
	// User and Password, or Token, authenticate with a secret the server
	// knows. They come from the environment, never a flag, so that they do
	// not show in `ps` or a shell's history.
	User, Password string
	Token          string
	// CA is a PEM file of the authorities that sign the servers'
	// certificates; empty trusts the system's.
	CA string
	// Cert and Key are the client's certificate and private key (PEM
	// files), for servers that verify their clients (mutual TLS).
	Cert, Key string
	// TLSFirst does the TLS handshake before the server's greeting, for
	// servers configured with handshake_first.
	TLSFirst bool
	// InboxPrefix is where replies and deliveries to this connection come
	// (nats.go's default is _INBOX, which every user would have to be
	// allowed to read); empty derives it from the user (InboxPrefix), or
	// keeps _INBOX when the connection names no user.
	InboxPrefix string
	// InProcess, when set, connects to this server inside the same
	// process (an embedded nats-server) without a socket: messages pass
	// between goroutines, with no system call or thread woken per message.
	// URL is then only what logs and errors show.
	InProcess nats.InProcessConnProvider

	// from names where each field's value came from ("--tls-ca",
	// "$NATS_CA"), for error messages.
	from map[string]string
}

// connFields are the fields with a flag or a variable, in the order
// errors name them: field, flag, environment variable.
var connFields = []struct{ field, flag, env string }{
	{"URL", "--nats", EnvURL},
	{"Creds", "--creds", EnvCreds},
	{"NKey", "--nkey", EnvNKey},
	{"User", "", EnvUser},
	{"Password", "", EnvPassword},
	{"Token", "", EnvToken},
	{"CA", "--tls-ca", EnvCA},
	{"Cert", "--tls-cert", EnvCert},
	{"Key", "--tls-key", EnvKey},
	{"InboxPrefix", "--inbox-prefix", EnvInboxPrefix},
}

// AddFlags registers --nats, --creds, --nkey, --tls-ca, --tls-cert,
// --tls-key and --tls-first on fs, filling o when fs is parsed. natsUsage
// describes --nats; empty gives the usual description.
func (o *ConnOptions) AddFlags(fs *flag.FlagSet, natsUsage string) {
	if natsUsage == "" {
		natsUsage = "NATS server URL, several comma-separated for a cluster (default $NATS_URL, else " + nats.DefaultURL + ")"
	}
	fs.StringVar(&o.URL, "nats", o.URL, natsUsage)
	fs.StringVar(&o.Creds, "creds", o.Creds, "NATS credentials file: user JWT and nkey seed (default $NATS_CREDS)")
	fs.StringVar(&o.NKey, "nkey", o.NKey, "file with the user's nkey seed (default $NATS_NKEY)")
	fs.StringVar(&o.CA, "tls-ca", o.CA, "PEM file of the CAs that sign the NATS servers' certificates (default $NATS_CA, else the system's)")
	fs.StringVar(&o.Cert, "tls-cert", o.Cert, "client certificate (PEM) for servers that verify clients; needs --tls-key (default $NATS_CERT)")
	fs.StringVar(&o.Key, "tls-key", o.Key, "private key (PEM) of --tls-cert (default $NATS_KEY)")
	fs.BoolVar(&o.TLSFirst, "tls-first", o.TLSFirst, "do the TLS handshake before the server's greeting (servers with handshake_first)")
	fs.StringVar(&o.InboxPrefix, "inbox-prefix", o.InboxPrefix, "subject prefix of this connection's inboxes: replies and deliveries (default $NATS_INBOX_PREFIX, else _INBOX_<user>, else _INBOX)")
}

// Resolve fills what the flags left empty from the environment (a flag
// wins over its variable; user, password and token come only from the
// environment) and checks the result as Check does. It tries no
// connection.
func (o ConnOptions) Resolve(getenv func(string) string) (ConnOptions, error) {
	o.from = map[string]string{}
	for _, f := range connFields {
		p := o.field(f.field)
		switch {
		case *p != "":
			o.from[f.field] = f.flag
		case getenv(f.env) != "":
			*p = getenv(f.env)
			o.from[f.field] = "$" + f.env
		}
	}
	return o, o.Check()
}

func (o *ConnOptions) field(name string) *string {
	switch name {
	case "URL":
		return &o.URL
	case "Creds":
		return &o.Creds
	case "NKey":
		return &o.NKey
	case "User":
		return &o.User
	case "Password":
		return &o.Password
	case "Token":
		return &o.Token
	case "CA":
		return &o.CA
	case "Cert":
		return &o.Cert
	case "Key":
		return &o.Key
	case "InboxPrefix":
		return &o.InboxPrefix
	}
	panic("bus: no connection field " + name)
}

// source names where a field's value came from: the flag or variable
// Resolve took it from, else the flag (or variable) that would set it.
func (o ConnOptions) source(field string) string {
	if s := o.from[field]; s != "" {
		return s
	}
	for _, f := range connFields {
		if f.field == field {
			if f.flag != "" {
				return f.flag
			}
			return "$" + f.env
		}
	}
	return field
}

// Check reports, before any connection is tried, what would make one
// fail for sure: a file that is missing or holds no key or certificate,
// a certificate without its key, a password without its user, or more
// than one way to authenticate. Each error names the flag or variable.
func (o ConnOptions) Check() error {
	var ways []string
	for _, f := range []string{"Creds", "NKey", "User", "Token"} {
		if *o.field(f) != "" {
			ways = append(ways, o.source(f))
		}
	}
	if len(ways) > 1 {
		return fmt.Errorf("nats: %s: give one way to authenticate, not several", strings.Join(ways, " and "))
	}
	switch {
	case o.User != "" && o.Password == "":
		return fmt.Errorf("nats: %s without %s", o.source("User"), o.source("Password"))
	case o.Password != "" && o.User == "":
		return fmt.Errorf("nats: %s without %s", o.source("Password"), o.source("User"))
	case o.Cert != "" && o.Key == "":
		return fmt.Errorf("nats: %s without %s", o.source("Cert"), o.source("Key"))
	case o.Key != "" && o.Cert == "":
		return fmt.Errorf("nats: %s without %s", o.source("Key"), o.source("Cert"))
	}
	if o.Creds != "" {
		if err := checkCreds(o.Creds); err != nil {
			return fmt.Errorf("nats: %s %s: %w", o.source("Creds"), o.Creds, err)
		}
	}
	if o.NKey != "" {
		if err := checkSeed(o.NKey); err != nil {
			return fmt.Errorf("nats: %s %s: %w", o.source("NKey"), o.NKey, err)
		}
	}
	if o.CA != "" {
		if _, err := loadCA(o.CA); err != nil {
			return fmt.Errorf("nats: %s %s: %w", o.source("CA"), o.CA, err)
		}
	}
	if o.Cert != "" {
		if _, err := tls.LoadX509KeyPair(o.Cert, o.Key); err != nil {
			return fmt.Errorf("nats: %s %s, %s %s: %w", o.source("Cert"), o.Cert, o.source("Key"), o.Key, err)
		}
	}
	if p := o.InboxPrefix; p != "" {
		if err := checkInboxPrefix(p); err != nil {
			return fmt.Errorf("nats: %s %q: %w", o.source("InboxPrefix"), p, err)
		}
	}
	return nil
}

// checkInboxPrefix refuses what nats.go would: wildcards, spaces, empty
// tokens.
func checkInboxPrefix(p string) error {
	for _, tok := range strings.Split(p, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return errors.New("want subject tokens without wildcards or spaces, such as _INBOX_trainer-planner")
		}
	}
	return nil
}

// Inbox is the inbox prefix the connection uses: InboxPrefix, else the
// one of the user it authenticates as (from $NATS_USER, a URL's
// user:password@, or the name in a credentials file), else "" (nats.go's
// _INBOX).
func (o ConnOptions) Inbox() string {
	if o.InboxPrefix != "" {
		return o.InboxPrefix
	}
	if u := o.user(); u != "" {
		return InboxPrefix(u)
	}
	return ""
}

// user names the user the connection authenticates as, or "".
func (o ConnOptions) user() string {
	if o.User != "" {
		return o.User
	}
	for _, raw := range strings.Split(o.URL, ",") {
		if u, err := url.Parse(strings.TrimSpace(raw)); err == nil && u.User != nil {
			if _, ok := u.User.Password(); ok {
				return u.User.Username()
			}
		}
	}
	if o.Creds != "" {
		if data, err := os.ReadFile(o.Creds); err == nil {
			defer wipe(data)
			if tok, err := jwt.ParseDecoratedJWT(data); err == nil {
				if uc, err := jwt.DecodeUserClaims(tok); err == nil {
					return uc.Name
				}
			}
		}
	}
	return ""
}

func checkCreds(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	defer wipe(data)
	tok, err := jwt.ParseDecoratedJWT(data)
	if err != nil {
		return err
	}
	if _, err := jwt.DecodeUserClaims(tok); err != nil {
		return fmt.Errorf("no user JWT in it: %w", err)
	}
	kp, err := jwt.ParseDecoratedUserNKey(data)
	if err != nil {
		return fmt.Errorf("no user nkey seed in it: %w", err)
	}
	kp.Wipe()
	return nil
}

func checkSeed(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	defer wipe(data)
	kp, err := nkeys.ParseDecoratedUserNKey(data)
	if err != nil {
		return fmt.Errorf("no user nkey seed (SU…) in it: %w", err)
	}
	kp.Wipe()
	return nil
}

func loadCA(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, errors.New("no PEM certificate in it")
	}
	return pool, nil
}

func wipe(b []byte) {
	for i := range b {
		b[i] = 'x'
	}
}

// Servers is the URL to dial: URL, or the default server.
func (o ConnOptions) Servers() string {
	if strings.TrimSpace(o.URL) == "" {
		return nats.DefaultURL
	}
	return o.URL
}

// NATSOptions checks o and returns the options that carry its
// credentials and TLS settings to nats.Connect. Files are read again at
// every (re)connection, so rotated certificates and credentials are
// picked up.
func (o ConnOptions) NATSOptions() ([]nats.Option, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	switch {
	case o.Creds != "":
		opts = append(opts, nats.UserCredentials(o.Creds))
	case o.NKey != "":
		opt, err := nats.NkeyOptionFromSeed(o.NKey)
		if err != nil {
			return nil, fmt.Errorf("nats: %s %s: %w", o.source("NKey"), o.NKey, err)
		}
		opts = append(opts, opt)
	case o.User != "":
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	case o.Token != "":
		opts = append(opts, nats.Token(o.Token))
	}
	if o.CA != "" {
		opts = append(opts, nats.RootCAs(o.CA))
	}
	if o.Cert != "" {
		opts = append(opts, nats.ClientCert(o.Cert, o.Key))
	}
	if o.TLSFirst {
		opts = append(opts, nats.TLSHandshakeFirst())
	}
	if p := o.Inbox(); p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	}
	if o.InProcess != nil {
		opts = append(opts, nats.InProcessServer(o.InProcess))
	}
	return opts, nil
}

// Dial connects to NATS as name (what `nats server report connections`
// shows), with extra options after o's own. A server older than
// MinServerVersion is refused at once (CheckServerVersion).
func (o ConnOptions) Dial(name string, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := o.NATSOptions()
	if err != nil {
		return nil, err
	}
	opts = append(append(opts, nats.Name(name)), extra...)
	nc, err := nats.Connect(o.Servers(), opts...)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", Redact(o.Servers()), err)
	}
	if err := CheckServerVersion(nc); err != nil {
		nc.Close()
		return nil, err
	}
	return nc, nil
}

// DialContext dials like Dial, and tries again while the servers cannot be
// reached, until ctx ends: a service started before its NATS server, or
// while it restarts, waits for it. onRetry, if not nil, hears each failed
// attempt. Anything but an unreachable server (credentials refused, TLS,
// a server too old) is returned at once.
func (o ConnOptions) DialContext(ctx context.Context, name string, onRetry func(error), extra ...nats.Option) (*nats.Conn, error) {
	return DialRetry(ctx, func() (*nats.Conn, error) { return o.Dial(name, extra...) }, onRetry)
}

// DialRetry calls dial until it succeeds, fails with anything but an
// unreachable server (Unreachable), or ctx ends, waiting 100 ms after the
// first failure and twice as long after each next one, up to a second.
func DialRetry(ctx context.Context, dial func() (*nats.Conn, error), onRetry func(error)) (*nats.Conn, error) {
	wait := 100 * time.Millisecond
	for {
		nc, err := dial()
		if err == nil || !Unreachable(err) {
			return nc, err
		}
		if onRetry != nil {
			onRetry(err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (gave up: %w)", err, context.Cause(ctx))
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// Unreachable reports whether err says that no server could be reached or
// none finished its handshake in time (refused, reset, closed, timed out):
// what a server starting or restarting, or a machine too busy to run the
// dialling goroutine before nats.go's 2 s connect deadline, gives. Trying
// again may help; with any other error it cannot.
func Unreachable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout)
}

// Redact hides the passwords and tokens that server URLs may carry
// (nats://user:secret@host), so that a URL can be logged or printed.
func Redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil || u.User == nil {
			continue
		}
		if _, ok := u.User.Password(); ok {
			parts[i] = u.Redacted()
		} else {
			u.User = url.User("xxxxx") // a lone user name is a token
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}
