package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/planact/planact/pkg/fail"
)

// RoutingKeyHeader carries Request.RoutingKey. SGLang's router
// (sgl-model-gateway) reads it for its consistent_hashing and manual
// policies (routers/header_utils.rs: "x-smg-routing-key"), and SGLang's
// OpenAI-compatible server takes it as the request's routing_key
// (entrypoints/openai/serving_base.py extract_routing_key). Any router that
// hashes on a header can be pointed at it.
const RoutingKeyHeader = "X-SMG-Routing-Key"

// Backoff says how a client waits out a busy engine, one that answers 429
// Too Many Requests or 503 Service Unavailable, before trying again itself.
// A Retry-After header (RFC 9110 §10.2.3: seconds, or an HTTP date) says how
// long, and is waited in full up to the caller's deadline; otherwise the
// wait doubles from Base, with jitter, up to Max. The caller's context
// bounds it all. An engine that asks for a wait past the deadline is not
// tried again: the error says so in the engine's words, permanent (nothing
// may try again before the engine said), with ErrBusy in its chain and the
// wait in fail.RetryAfter. A caller without a deadline waits at most Max;
// a longer wait, or the last attempt, returns the error transient with the
// wait in fail.RetryAfter, for the caller to honour.
type Backoff struct {
	Attempts int           // tries in all, the first included; 0 means 6; 1 never retries
	Base     time.Duration // first wait when the engine names none; 0 means 200ms
	Max      time.Duration // longest wait planact picks itself (or waits without a deadline); 0 means 30s
}

// ErrBusy is in the chain of the error of a request whose engine, busy,
// asked to be tried again (Retry-After) only after the caller's deadline.
var ErrBusy = errors.New("the engine is busy past the deadline")

func (b Backoff) withDefaults() Backoff {
	if b.Attempts <= 0 {
		b.Attempts = 6
	}
	if b.Base <= 0 {
		b.Base = 200 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 30 * time.Second
	}
	return b
}

// delay is the wait before try attempt+1 when the engine named none: Base
// doubled attempt-1 times, capped at Max, the upper half of it random so
// that callers turned away together do not come back together.
func (b Backoff) delay(attempt int) time.Duration {
	d := b.Max
	if attempt < 32 {
		d = min(b.Base<<(attempt-1), b.Max)
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date
// (a date in the past means now). ok is false when there is none or it
// cannot be read.
func parseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(min(n, int64(24*time.Hour/time.Second))) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// conn is what every client shares: the engine's base URL, the HTTP client
// and how a busy engine is waited out.
type conn struct {
	base    string
	hc      *http.Client
	backoff Backoff
	absent  *absentPaths // the engine's endpoints that answered 404; nil: none remembered
}

// statusErr is an engine's reply with a status other than 200.
type statusErr struct {
	op     string
	status int
	body   []byte
}

func (e *statusErr) Error() string {
	return fmt.Sprintf("%s: %d %s: %s", e.op, e.status, http.StatusText(e.status), bytes.TrimSpace(e.body))
}

// statusOf returns the HTTP status of an engine's refusal in err's chain, or 0.
func statusOf(err error) int {
	var se *statusErr
	if errors.As(err, &se) {
		return se.status
	}
	return 0
}

func statusError(op string, status int, body []byte) error {
	err := &statusErr{op: op, status: status, body: body}
	if status == http.StatusTooManyRequests || status == http.StatusRequestTimeout || status >= 500 {
		return fail.E(fail.Transient, err)
	}
	return fail.E(fail.Permanent, err)
}

// notSupported reports an operation the engine does not have.
func notSupported(op string, why error) error {
	if why != nil {
		return fail.E(fail.Permanent, fmt.Errorf("%s: %w (%v)", op, ErrNotSupported, why))
	}
	return fail.E(fail.Permanent, fmt.Errorf("%s: %w", op, ErrNotSupported))
}

// do sends a JSON request to path and returns the response for the caller
// to read; the body is closed unless the status is 200. A busy engine (429,
// 503) is tried again as c.backoff says. Errors are classified: transport
// errors, time-outs, 408, 429 and 5xx are transient, other statuses
// permanent; a cancelled context gives its own error.
func (c *conn) do(ctx context.Context, method, path string, in any, header http.Header) (*http.Response, error) {
	return c.send(ctx, method, path, in, header, c.backoff.Attempts)
}

func (c *conn) send(ctx context.Context, method, path string, in any, header http.Header, attempts int) (*http.Response, error) {
	url := c.base + path
	var data []byte
	if in != nil {
		var err error
		if data, err = json.Marshal(in); err != nil {
			return nil, fail.E(fail.Invalid, fmt.Errorf("encode request: %w", err))
		}
	}
	for attempt := 1; ; attempt++ {
		var body io.Reader
		if in != nil {
			body = bytes.NewReader(data)
		}
		req, err := http.NewRequestWithContext(ctx, method, url, body)
		if err != nil {
			return nil, fail.Permanentf("%s %s: %w", method, url, err)
		}
		if in != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, vs := range header {
			req.Header[k] = vs
		}
		if g := GenerationOf(ctx); g != "" {
			req.Header.Set(GenerationHeader, g)
		}
		resp, err := c.hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				// Deadline counts as transient, cancellation as unknown (fail.KindOf).
				return nil, fmt.Errorf("%s %s: %w", method, url, ctx.Err())
			}
			return nil, fail.Transientf("%s %s: %w", method, url, err)
		}
		if resp.StatusCode == http.StatusOK {
			return resp, nil
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		resp.Body.Close()
		err = statusError(method+" "+url, resp.StatusCode, msg)
		if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
			return nil, err
		}
		wait, named := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		if !named {
			wait = c.backoff.delay(attempt)
		}
		deadline, bounded := ctx.Deadline()
		left := time.Until(deadline)
		switch {
		case named && bounded && left < wait:
			// The engine's own words say it cannot be had in time: tried
			// again at once (here or by the caller) it would refuse again.
			return nil, fail.E(fail.Permanent, fail.After(wait, fmt.Errorf("%w: it asked to be tried again in %v (Retry-After), and the deadline is in %v: %w",
				ErrBusy, wait, left.Round(time.Millisecond), err)))
		case attempt >= attempts || (bounded && left < wait) || (!bounded && wait > c.backoff.Max):
			if named {
				return nil, fail.After(wait, err)
			}
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%s %s: %w (waiting out: %v)", method, url, ctx.Err(), err)
		}
	}
}

// doJSON sends in and decodes a 200 reply into out.
func (c *conn) doJSON(ctx context.Context, method, path string, in, out any, header http.Header) error {
	resp, err := c.do(ctx, method, path, in, header)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		// A cut connection shows up here too, so retrying is reasonable.
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w", method, c.base+path, ctx.Err())
		}
		return fail.Transientf("%s %s: decode reply: %w", method, c.base+path, err)
	}
	return nil
}

// doRead sends in and hands a 200 reply's body, read whole, to decode (a
// reader made for the reply, see reply.go). The body is read into a buffer
// used again by the next reply: decode must copy what it keeps.
func (c *conn) doRead(ctx context.Context, method, path string, in any, header http.Header, decode func([]byte) error) error {
	resp, err := c.do(ctx, method, path, in, header)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	buf := replyBuffers.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= maxPooledReply {
			replyBuffers.Put(buf)
		}
	}()
	if _, err = buf.ReadFrom(resp.Body); err == nil {
		err = decode(buf.Bytes())
	}
	if err != nil {
		// A cut connection shows up here too, so retrying is reasonable.
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w", method, c.base+path, ctx.Err())
		}
		return fail.Transientf("%s %s: decode reply: %w", method, c.base+path, err)
	}
	return nil
}

// replyBuffers hold the engines' replies while they are read; one grown
// past maxPooledReply (a rare, huge reply) is left to the collector.
var replyBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledReply = 4 << 20

// routingHeader is the header that carries a routing key, or nil.
func routingHeader(key string) http.Header {
	if key == "" {
		return nil
	}
	return http.Header{RoutingKeyHeader: {key}}
}

// newRID names a request for the engine: unique, and telling which episode
// it belongs to.
func newRID(key string) string {
	if key == "" {
		return fmt.Sprintf("planact-%016x", rand.Uint64())
	}
	return fmt.Sprintf("planact-%s-%016x", key, rand.Uint64())
}

// tokenize speaks the /tokenize endpoint shared by SGLang and vLLM:
// {"model"?, "prompt", "add_special_tokens"} -> {"tokens": […]}.
func (c *conn) tokenize(ctx context.Context, model, text string) ([]int, error) {
	in := map[string]any{"prompt": text, "add_special_tokens": false}
	if model != "" {
		in["model"] = model
	}
	var tokens *[]int
	err := c.doRead(ctx, http.MethodPost, "/tokenize", in, nil, func(b []byte) (err error) {
		tokens, err = decodeTokens(b)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	if tokens == nil {
		return nil, fail.E(fail.Permanent, errors.New(`tokenize: reply has no "tokens"`))
	}
	if len(*tokens) == 0 && strings.TrimSpace(text) != "" {
		// A request sent as no ids goes out as text, which the engine
		// tokenizes itself: the sample's prompt ids would be none, and
		// what the engine took unchecked.
		return nil, fail.E(fail.Permanent, fmt.Errorf("tokenize: the engine turned %d bytes of text into no tokens", len(text)))
	}
	return *tokens, nil
}

// health calls GET /health.
func (c *conn) health(ctx context.Context) error {
	return c.doJSON(ctx, http.MethodGet, "/health", nil, nil, nil)
}

// SGLang's control endpoints (python/sglang/srt/entrypoints/http_server.py):
//
//	POST /pause_generation    {"mode": "abort"|"retract"|"in_place"} (io_struct.py PauseGenerationReqInput; default abort)
//	POST /continue_generation {}
//	GET  /get_weight_version  -> {"weight_version"}; older servers: GET /get_model_info -> {…, "weight_version"};
//	                             newer ones may answer only GET /model_info (the same)
//	POST /abort_request       {"rid", "abort_all"?} (io_struct.py AbortReq)
//
// SGLang's OpenAI-compatible server is the same HTTP server, so the OpenAI
// clients fall back to them where vLLM's are missing.

func (c *conn) sglangPause(ctx context.Context, op string, mode PauseMode) error {
	switch mode {
	case PauseAbort, PauseInPlace, PauseRetract:
	case "":
		mode = PauseAbort
	default:
		return notSupported(fmt.Sprintf("%s: pause mode %q (SGLang has abort, in_place and retract)", op, mode), nil)
	}
	err := c.doJSON(ctx, http.MethodPost, "/pause_generation", map[string]any{"mode": mode}, nil, nil)
	if statusOf(err) == http.StatusNotFound {
		return notSupported(op, err)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

func (c *conn) sglangResume(ctx context.Context, op string) error {
	err := c.doJSON(ctx, http.MethodPost, "/continue_generation", map[string]any{}, nil, nil)
	if statusOf(err) == http.StatusNotFound {
		return notSupported(op, err)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// weightVersionPaths are where an engine may say which weights it serves,
// asked in turn: SGLang's GET /get_weight_version, an older SGLang's GET
// /get_model_info, a newer one's GET /model_info.
var weightVersionPaths = []string{"/get_weight_version", "/get_model_info", "/model_info"}

func (c *conn) weightVersion(ctx context.Context, op string) (string, error) {
	var out struct {
		WeightVersion json.RawMessage `json:"weight_version"`
	}
	var absent error // the last 404 asked now
	for _, path := range weightVersionPaths {
		if c.absent.known(path) {
			continue
		}
		err := c.doJSON(ctx, http.MethodGet, path, nil, &out, nil)
		if statusOf(err) == http.StatusNotFound {
			c.absent.add(path)
			absent = err
			continue
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", op, err)
		}
		if path != weightVersionPaths[0] && out.WeightVersion == nil {
			// A server from before weight versions: it cannot say.
			return "", notSupported(op, fmt.Errorf("GET /get_weight_version: 404, and GET %s names no weight_version", path))
		}
		return rawString(out.WeightVersion), nil
	}
	if absent == nil {
		absent = fmt.Errorf("GET %s: each answered 404 within the last %v", strings.Join(weightVersionPaths, ", "), absentRecheck)
	}
	return "", notSupported(op, absent)
}

// absentRecheck is how long a client takes an engine's 404 at one of its
// endpoints as its answer, asking only the others meanwhile: an engine
// without weight versions (vLLM) costs no request per check, and one
// upgraded or replaced behind its URL is heard again within it. What an
// engine serves (a version) is never remembered: it is asked every time.
const absentRecheck = time.Minute

// absentPaths remembers the paths an engine answered 404 at, and until
// when they are not asked again.
type absentPaths struct {
	now   func() time.Time // nil: time.Now
	mu    sync.Mutex
	until map[string]time.Time
}

func (a *absentPaths) clock() time.Time {
	if a.now != nil {
		return a.now()
	}
	return time.Now()
}

// known reports whether path answered 404 less than absentRecheck ago
// (never, for a nil a).
func (a *absentPaths) known(path string) bool {
	if a == nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	until, ok := a.until[path]
	return ok && a.clock().Before(until)
}

// add remembers that path answered 404 now.
func (a *absentPaths) add(path string) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.until == nil {
		a.until = make(map[string]time.Time)
	}
	a.until[path] = a.clock().Add(absentRecheck)
}

// abortTimeout bounds telling an engine to abort a request the caller gave up on.
const abortTimeout = 2 * time.Second

// sglangAbort tells the engine to abort request rid, once, whatever ctx
// (already over, as a rule) says: the engine would otherwise go on
// generating for nobody. SGLang also aborts a request whose client
// disconnects, but not one a router in between keeps open.
func (c *conn) sglangAbort(ctx context.Context, rid string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	resp, err := c.send(ctx, http.MethodPost, "/abort_request", map[string]any{"rid": rid}, nil, 1)
	if err != nil {
		return fmt.Errorf("abort %s: %w", rid, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil
}

// vLLM's control endpoints (vllm/entrypoints/serve/rlhf/api_router.py,
// served with VLLM_SERVER_DEV_MODE=1):
//
//	POST /pause?mode=abort|wait|keep    -> {"status": "paused"}
//	POST /resume                        -> {"status": "resumed"}
//
// vLLM aborts a request whose client disconnects
// (vllm/entrypoints/utils.py with_cancellation), so the OpenAI clients
// abort by closing the connection.

func (c *conn) openaiPause(ctx context.Context, op string, mode PauseMode) error {
	vmode := ""
	switch mode {
	case PauseAbort, "":
		vmode = "abort"
	case PauseWait:
		vmode = "wait"
	case PauseInPlace:
		vmode = "keep"
	}
	if vmode != "" {
		err := c.doJSON(ctx, http.MethodPost, "/pause?mode="+vmode, nil, nil, nil)
		if statusOf(err) != http.StatusNotFound {
			if err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
			return nil
		}
	}
	// Not vLLM (or vLLM without its dev endpoints): SGLang's, if it has them.
	return c.sglangPause(ctx, op, mode)
}

func (c *conn) openaiResume(ctx context.Context, op string) error {
	err := c.doJSON(ctx, http.MethodPost, "/resume", nil, nil, nil)
	if statusOf(err) != http.StatusNotFound {
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		return nil
	}
	return c.sglangResume(ctx, op)
}
