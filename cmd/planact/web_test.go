package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/freeport"
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
