package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestSubmitRefusesWhatItWouldIgnore: submit took a word that is no flag
// and stopped reading flags there (submit --rollout 7 extra
// --planner-engine URL said --planner-engine is required), ran --timeout 0
// for no time and blamed planact ("is planact there? context deadline
// exceeded"), dropped --sim-tasks beside --tasks, took --sim-tasks -2 for
// none, sent no tasks with --role actor, and read the first of two JSON
// values in a config or on a task line, dropping the second. Each is
// refused before anything is sent, naming what is wrong.
func TestSubmitRefusesWhatItWouldIgnore(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tasks := write("tasks.jsonl", `{"prompt":"What is the capital of Peru?","label":"Lima"}`+"\n")
	twoOnALine := write("two.jsonl", `{"prompt":"a"} {"prompt":"b"}`+"\n")
	twoConfigs := write("config.json", `{"max_turns": 2} {"max_turns": 3}`)
	// No server listens here: a refusal comes before any connection.
	base := []string{"submit", "--nats", "nats://127.0.0.1:1", "--planner-engine", "http://p", "--actor-engine", "http://a"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--rollout", "7", "extra", "--sim-tasks", "2"}, `submit: unexpected arguments ["extra"]`},
		{[]string{"--rollout", "7", "--sim-tasks", "2", "--timeout", "0"}, "submit: --timeout 0s: want a positive duration"},
		{[]string{"--rollout", "7", "--sim-tasks", "2", "--timeout", "-1m"}, "submit: --timeout -1m0s: want a positive duration"},
		{[]string{"--rollout", "-3", "--sim-tasks", "2"}, "submit: --rollout -3: want a rollout id"},
		{[]string{"--rollout", "7", "--sim-tasks", "-2", "--role", "actor"}, "submit: --sim-tasks -2: want 1 or more"},
		{[]string{"--rollout", "7", "--sim-tasks", "0"}, "submit: --sim-tasks 0: want 1 or more"},
		{[]string{"--rollout", "7", "--sim-tasks", "2", "--tasks", tasks}, "--sim-tasks 2: give one of them"},
		{[]string{"--rollout", "7", "--tasks", twoOnALine}, "two.jsonl:1: more after the JSON value that ends at byte 14"},
		{[]string{"--rollout", "7", "--sim-tasks", "2", "--config", twoConfigs}, "config.json: more after the JSON value that ends at byte 16"},
	} {
		var out syncBuffer
		err := run(context.Background(), append(base, c.args...), noenv, strings.NewReader(""), &out, &out)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.want)
		}
		if strings.Contains(out.String(), "waiting for") {
			t.Errorf("%v went on before refusing its flags:\n%s", c.args, out.String())
		}
	}
	// What is meant still goes as far as the connection.
	var out syncBuffer
	err := run(context.Background(), append(base, "--rollout", "7", "--tasks", tasks, "--timeout", "1m"), noenv, strings.NewReader(""), &out, &out)
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("good flags: %v, want the connection refused", err)
	}
}

// TestDecodeReadsFlagsAfterTheFile: decode body.bin --compact printed
// indented JSON (the flag, after the file, was not read), and a second
// file was ignored.
func TestDecodeReadsFlagsAfterTheFile(t *testing.T) {
	body, err := schema.Marshal(&schema.ActDone{Rollout: 7, Episode: 1, Turn: 2, Key: "t2-s1", Status: schema.ActDoneOK})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "body.bin")
	if err := os.WriteFile(file, body, 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"decode", file, "--compact"}, noenv, nil, &out, &out); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(out.String(), "\n"); got != 1 {
		t.Errorf("decode FILE --compact printed %d lines, want one:\n%s", got, out.String())
	}
	var v map[string]any
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || v["key"] != "t2-s1" {
		t.Errorf("decoded %v (%v)", v, err)
	}
	out.Reset()
	err = run(context.Background(), []string{"decode", file, file}, noenv, nil, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "decode: unexpected arguments") {
		t.Errorf("two files: %v, want an error naming the second", err)
	}
	if out.Len() > 0 {
		t.Errorf("two files: printed %q before refusing", out.String())
	}
}

// TestSubmitActorBringsTheTasks: submit --role actor --tasks FILE read the
// file and sent an arrival without the tasks. Either role may bring the
// batch; alone, the actor brings what it was given.
func TestSubmitActorBringsTheTasks(t *testing.T) {
	_, url := bustest.Server(t)
	bustest.Provision(t, url) // the streams, and no services: nothing answers
	tasks := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(tasks, []byte(`{"prompt":"What is the capital of Peru?","label":"Lima"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	err := run(context.Background(), []string{"submit", "--nats", url, "--rollout", "7", "--role", "actor", "--actor-engine", "http://a",
		"--tasks", tasks, "--timeout", "2s"}, noenv, nil, &out, &out)
	if !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("submit with no planact services: %v, want ErrTimeout\n%s", err, out.String())
	}
	js, err := jetstream.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := js.Stream(ctx, bus.StreamTrainer(schema.RoleActor))
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, subject.Arrive(7, schema.RoleActor))
	if err != nil {
		t.Fatal(err)
	}
	var a schema.Arrive
	if err := schema.Unmarshal(m.Data, &a); err != nil {
		t.Fatal(err)
	}
	if len(a.Tasks) != 1 || a.Tasks[0].Label != "Lima" {
		t.Errorf("the actor's arrival holds tasks %+v, want the file's one", a.Tasks)
	}
}
