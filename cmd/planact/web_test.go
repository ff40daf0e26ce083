package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/freeport"
	"github.com/planact/planact/internal/stack"
)

// freeAddr is a loopback address nothing listens on (for now).
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestUpWeb: `up --web ADDR` serves the web view until it stops.
func TestUpWeb(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"up", "--port", "-1", "--metrics", "", "--web", addr}, noenv, strings.NewReader(""), &stdout, &stderr)
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		res, err := http.Get("http://" + addr + "/api/rollouts")
		if err == nil {
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "[]" {
				t.Fatalf("/api/rollouts: %d %s", res.StatusCode, body)
			}
			break
		}
		select {
		case err := <-done:
			t.Fatalf("up stopped: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the web view never answered on %s: %v\n%s", addr, err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// up says where the web view is once every service is ready.
	for !strings.Contains(stdout.String(), "web view at http://"+addr+"/") {
		if time.Now().After(deadline) {
			t.Fatalf("up does not say where the web view is:\n%s", stdout.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("up: %v", err)
	}
}

// TestUpWebAddressInUse: the address in use is named, and up stops.
func TestUpWebAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr syncBuffer
	err = run(ctx, []string{"up", "--port", "-1", "--metrics", "", "--web", addr}, noenv, strings.NewReader(""), &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "address "+addr+" is already in use") {
		t.Errorf("up --web %s (in use): %v", addr, err)
	}
}

// TestWebFlags: the web flags refuse what cannot work before anything starts.
func TestWebFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--web-addr", "127.0.0.1:9", "actor-gateway"}, "--web-addr is for the web target"},
		{[]string{"serve", "webb"}, `unknown service "webb"`},
		{[]string{"up", "--services", "web"}, "the web service needs --web ADDR"},
		{[]string{"up", "--port", "-1", "--metrics", "", "--web", "8080"}, `address "8080": want host:port`},
	} {
		var out, errOut syncBuffer
		err := run(context.Background(), c.args, noenv, strings.NewReader(""), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// TestUpServicesConnectInProcess: with its embedded server, up's services
// pass messages to it in process. The server's /connz (served with
// --monitor-port) shows every planact connection without a socket (no
// port), beside a client of the test's that dials its listener.
func TestUpServicesConnectInProcess(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"up", "--port", "-1", "--monitor-port", "-1", "--metrics", ""}, noenv, strings.NewReader(""), &stdout, &stderr)
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(stdout.String(), "services running") {
		select {
		case err := <-done:
			t.Fatalf("up stopped: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("up never said its services run:\n%s\n%s", stdout.String(), stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	natsURL := wordAfter(t, stdout.String(), "NATS at ")
	monitor := wordAfter(t, stdout.String(), "NATS monitoring at ")
	nc, err := nats.Connect(natsURL, nats.Name("test-over-tcp"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	res, err := http.Get(monitor + "/connz?limit=1024")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var connz struct {
		Conns []struct {
			Name string `json:"name"`
			Port int    `json:"port"`
		} `json:"connections"`
	}
	if err := json.NewDecoder(res.Body).Decode(&connz); err != nil {
		t.Fatalf("%s/connz: %v", monitor, err)
	}
	planact, tcp := 0, 0
	for _, c := range connz.Conns {
		switch {
		case strings.HasPrefix(c.Name, "planact-"):
			planact++
			if c.Port != 0 {
				t.Errorf("%s connects over a socket (port %d), not in process", c.Name, c.Port)
			}
		case c.Name == "test-over-tcp":
			tcp++
			if c.Port == 0 {
				t.Errorf("the test's client shows no port: /connz does not tell a socket from a pipe")
			}
		}
	}
	if planact < len(stack.Services) || tcp != 1 {
		t.Errorf("/connz lists %d planact connections (want at least %d, one per service) and %d of the test's (want 1): %+v", planact, len(stack.Services), tcp, connz.Conns)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("up: %v", err)
	}
}

// wordAfter is the word that follows prefix in text.
func wordAfter(t *testing.T, text, prefix string) string {
	t.Helper()
	_, rest, ok := strings.Cut(text, prefix)
	if !ok {
		t.Fatalf("no %q in:\n%s", prefix, text)
	}
	return strings.Fields(rest)[0]
}
