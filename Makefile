# planact — `make run` for the demo, `make test` for the suite.
GO       ?= go
PKGS     ?= ./...
FUZZTIME ?= 5000x
FUZZLONG ?= 2m
FUZZPKGS ?= ./pkg/plan

NATSCLI  ?= v0.5.1

.PHONY: run up build test tools unit fuzz-smoke fuzz lint bench bench-step chaos soak flakehunt tidy clean

## run: the embedded default — NATS, the five services, simulated engines, and a demo of both trainers
run:
	$(GO) run ./cmd/planact up --demo --port -1

## up: the same, without the demo: serves until Ctrl-C on nats://127.0.0.1:4222
up:
	$(GO) run ./cmd/planact up

## build: the planact binary in ./bin
build:
	$(GO) build -o bin/planact ./cmd/planact

## test: the whole suite with the race detector and, beside it, every fuzz target for
## $(FUZZTIME) inputs on one worker (docs/testing.md says what runs and how long)
test: tools
	@$(MAKE) --no-print-directory -j2 unit fuzz-smoke

## tools: the real clients the suite runs: the nats CLI (go install, once)
tools:
	@command -v nats >/dev/null || [ -x "$$($(GO) env GOPATH)/bin/nats" ] || \
		{ echo "installing the nats CLI $(NATSCLI)"; $(GO) install github.com/nats-io/natscli/nats@$(NATSCLI); }

## unit: every package's tests with -race, TESTP packages at a time: the long ones (e2e, the
## in-suite chaos run) wait a good part of the time, so the small ones run beside them
## (the two long ones first); TESTPARALLEL parallel tests at a time within a package (e2e's
## mostly wait for engines, time-outs and the nats CLI); test binaries without DWARF (-w: links
## a quarter faster; stack traces and race reports need only the symbol table)
TESTP ?= 4
TESTPARALLEL ?= 3
unit:
	$(GO) test -race -shuffle=on -count=1 -p $(TESTP) -parallel $(TESTPARALLEL) -ldflags=-w -timeout 15m $(if $(filter ./...,$(PKGS)),./e2e ./internal/chaos) $(PKGS)

fuzz-smoke:
	@FUZZTIME=$(FUZZTIME) FUZZWORKERS=1 FUZZMINIMIZE=50x FUZZFRESH=1 FUZZPKGS="$(FUZZPKGS)" GO=$(GO) ./scripts/fuzz.sh

## fuzz: every fuzz target for $(FUZZLONG)
fuzz:
	@FUZZTIME=$(FUZZLONG) FUZZPKGS="$(FUZZPKGS)" GO=$(GO) ./scripts/fuzz.sh

## lint: go vet and gofmt
lint:
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "not gofmt-ed:"; echo "$$out"; exit 1; fi

## bench: the benchmark programs under bench/, each printing its table; bench/step in its quick
## version (16 prompts × 4 copies, printed only)
bench:
	@for d in bench/*/; do [ -f "$$d/main.go" ] || continue; [ "$$d" = bench/step/ ] && continue; echo "== $$d"; $(GO) run ./$$d || exit 1; done
	@echo "== bench/step (quick; make bench-step for the whole step)"; $(GO) run ./bench/step -quick

## bench-step: one realistic RL step as processes, 256 prompts × 8 copies, two async rollouts (a few
## minutes); writes bench/results/step.{txt,json,png}. STEPFLAGS adds flags (go run ./bench/step -h).
STEPFLAGS ?=
bench-step:
	$(GO) run ./bench/step $(STEPFLAGS)

## chaos: the real topology as processes (single node, then a three-node cluster), broken on a
## seeded schedule; checks the ledger and writes chaos/results/chaos.{md,json}. CHAOSFLAGS adds flags.
CHAOSFLAGS ?=
chaos:
	$(GO) run ./cmd/planact-chaos chaos --out chaos/results $(CHAOSFLAGS)

## soak: rollouts for --duration (default 10m) per topology, sampling memory, consumers, keys and
## objects; writes chaos/results/soak.{md,json} and soak-<topology>.{csv,png}. SOAKFLAGS adds flags.
SOAKFLAGS ?=
soak:
	$(GO) run ./cmd/planact-chaos soak --out chaos/results $(SOAKFLAGS)

## flakehunt: the whole suite RUNS times (default 20), every other run under a CPU hog on every
## core; tallies every test that failed even once into bench/results/flakehunt.md
RUNS ?= 20
flakehunt:
	RUNS=$(RUNS) GO=$(GO) ./scripts/flakehunt.sh

tidy:
	$(GO) mod tidy

clean:
	rm -rf bin
