#!/usr/bin/env bash
# run-local.sh: the compose topology as plain processes on loopback.
#
#   three nats-server processes (compose/nats/*.conf, ports moved to
#   loopback: clients CLIENT_PORT..+2, routes ROUTE_PORT..+2, monitoring
#   MONITOR_PORT..+2; by default 14222, 16222 and 18222)
#   simulated planner and actor engines (planact sim)
#   one process per service as its own NATS user (planact serve), with
#   act-dispatcher x3 and actor-gateway x2
#   then a demo: both trainers play a few rollouts (planact up --demo
#   --services none against the cluster; it plays both roles from one
#   process, so it connects as admin: a real trainer connects as its own
#   role's user, trainer-planner or trainer-actor).
#
# nats-server (2.12 or later) comes from $PATH, else $(go env GOPATH)/bin, else it is built
# with `go install github.com/nats-io/nats-server/v2@v2.15.2`. If that fails
# too, one embedded server without users stands in (planact up --services none).
#
# Usage: compose/run-local.sh [--keep] [demo flags…]   (--keep: stay up after the demo)
# Ports are settable in the environment: CLIENT_PORT, ROUTE_PORT, MONITOR_PORT
# (each the first of three), SIM_PORT (planner engine; the actor's is the next),
# WEB_PORT (the web view, served as the read-only viewer user; 18080).
set -euo pipefail

client_port="${CLIENT_PORT:-14222}"
route_port="${ROUTE_PORT:-16222}"
monitor_port="${MONITOR_PORT:-18222}"
sim_port="${SIM_PORT:-30100}"
web_port="${WEB_PORT:-18080}"
for p in "$client_port" "$route_port" "$monitor_port" "$sim_port" "$web_port"; do
  [[ "$p" =~ ^[0-9]+$ ]] && (( p > 0 && p < 65534 )) || { echo "run-local: port $p: want a number from 1 to 65533" >&2; exit 2; }
done

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
work="$(mktemp -d -t planact-local-XXXXXX)"
keep=0
if [[ "${1:-}" == "--keep" ]]; then keep=1; shift; fi
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

log() { printf 'run-local: %s\n' "$*" >&2; }

# wait_for FILE PATTERN: until PATTERN shows up in FILE (a process's log).
wait_for() {
  for _ in $(seq 1 300); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  log "timed out waiting for '$2' in $1:"; tail -20 "$1" >&2; return 1
}

log "building planact into $work"
(cd "$root" && go build -o "$work/planact" ./cmd/planact)
planact="$work/planact"

for u in SESSION_STORE PLANNER_GATEWAY PLAN_PARSER ACT_DISPATCHER ACTOR_GATEWAY TRAINER_PLANNER TRAINER_ACTOR VIEWER ADMIN SYS; do
  export "PLANACT_PW_$u=${PLANACT_PW_PREFIX:-local}-$u"
done

# planact needs nats-server 2.12 or later (bus.MinServerVersion); Debian's
# package is 2.9, so a nats-server found first may be too old.
new_enough() { # new_enough BINARY
  local v
  v="$("$1" --version 2>/dev/null | sed -n 's/.*v\([0-9][0-9.]*\).*/\1/p')"
  [[ -n "$v" && "$(printf '%s\n' 2.12.0 "$v" | sort -V | head -1)" == 2.12.0 ]]
}
nats_server=""
for candidate in "$(command -v nats-server || true)" "$(go env GOPATH)/bin/nats-server"; do
  [[ -n "$candidate" && -x "$candidate" ]] || continue
  if new_enough "$candidate"; then nats_server="$candidate"; break; fi
  log "$candidate is $("$candidate" --version 2>/dev/null), older than planact needs (2.12): not using it"
done
if [[ -z "$nats_server" ]]; then
  log "no nats-server: go install github.com/nats-io/nats-server/v2@v2.15.2"
  if GOBIN="$work" go install github.com/nats-io/nats-server/v2@v2.15.2 >"$work/install.log" 2>&1; then
    nats_server="$work/nats-server"
  else
    log "could not build nats-server ($(tail -1 "$work/install.log")); using one embedded server"
  fi
fi

url() { # url USER PORT: for the hints printed to people, password included
  local var="PLANACT_PW_$(echo "$1" | tr 'a-z-' 'A-Z_')"
  echo "nats://$1:${!var}@127.0.0.1:$2"
}

# Processes connect as their NATS user through the environment (NATS_USER,
# NATS_PASSWORD, as the nats CLI reads them), not on the command line where
# ps would show the password. user_of/password_of USER: empty without users.
users=1
user_of() { if [[ $users == 1 ]]; then echo "$1"; fi; }
password_of() {
  local var="PLANACT_PW_$(echo "$1" | tr 'a-z-' 'A-Z_')"
  if [[ $users == 1 ]]; then echo "${!var}"; fi
}

if [[ -n "$nats_server" ]]; then
  cp "$here/nats/accounts.conf" "$work/"
  for i in 1 2 3; do
    mkdir -p "$work/js-$i"
    sed -e "s|listen: 0.0.0.0:4222|listen: 127.0.0.1:$((client_port+i-1))|" \
        -e "s|http: 0.0.0.0:8222|http: 127.0.0.1:$((monitor_port+i-1))|" \
        -e "s|listen: 0.0.0.0:6222|listen: 127.0.0.1:$((route_port+i-1))|" \
        -e "s|nats-route://nats-1:6222|nats-route://127.0.0.1:$route_port|" \
        -e "s|nats-route://nats-2:6222|nats-route://127.0.0.1:$((route_port+1))|" \
        -e "s|nats-route://nats-3:6222|nats-route://127.0.0.1:$((route_port+2))|" \
        -e "s|store_dir: /data/jetstream|store_dir: $work/js-$i|" \
        "$here/nats/nats-$i.conf" >"$work/nats-$i.conf"
    "$nats_server" -c "$work/nats-$i.conf" >"$work/nats-$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 1 2 3; do wait_for "$work/nats-$i.log" "Server is ready"; done
  wait_for "$work/nats-1.log" "JetStream cluster new metadata leader\|Self is new JetStream cluster metadata leader" || true
  ports=("$client_port" "$((client_port+1))" "$((client_port+2))")
  replicas=3
  log "NATS cluster up: nats://127.0.0.1:${ports[0]},${ports[1]},${ports[2]} (admin: $(url admin "${ports[0]}"))"
else
  "$planact" up --services none --port "$client_port" --metrics "" --planner-url http://127.0.0.1:1 --actor-url http://127.0.0.1:1 >"$work/nats-1.log" 2>&1 &
  pids+=($!)
  wait_for "$work/nats-1.log" "ready"
  ports=("$client_port" "$client_port" "$client_port")
  replicas=1
  users=0
  url() { echo "nats://127.0.0.1:$2"; }
  log "embedded NATS up: nats://127.0.0.1:$client_port"
fi

"$planact" sim --planner-addr "127.0.0.1:$sim_port" --actor-addr "127.0.0.1:$((sim_port+1))" >"$work/sim.log" 2>&1 &
pids+=($!)

# serve NAME REPLICA: one process of one service, on one of the three servers.
serve() {
  local port="${ports[$(( $2 % 3 ))]}" user pass
  user="$(user_of "$1")" pass="$(password_of "$1")"
  # Assignments before the command itself, so that $! is its pid.
  NATS_URL="nats://127.0.0.1:$port" NATS_USER="$user" NATS_PASSWORD="$pass" \
    "$planact" serve --replicas "$replicas" "$1" >"$work/$1-$2.log" 2>&1 &
  pids+=($!)
}
# Provisioning, once, as the admin: the services' users may create nothing.
if ! NATS_URL="nats://127.0.0.1:${ports[0]}" NATS_USER="$(user_of admin)" NATS_PASSWORD="$(password_of admin)" \
  "$planact" provision --replicas "$replicas" >"$work/provision.log" 2>&1; then
  log "planact provision failed:"; cat "$work/provision.log" >&2; exit 1
fi
serve session-store 0
wait_for "$work/session-store-0.log" "service started"
serve planner-gateway 0
serve plan-parser 0
for r in 0 1 2; do serve act-dispatcher "$r"; done
for r in 0 1; do serve actor-gateway "$r"; done
for f in planner-gateway-0 plan-parser-0 act-dispatcher-0 act-dispatcher-1 act-dispatcher-2 actor-gateway-0 actor-gateway-1; do
  wait_for "$work/$f.log" "service started"
done
NATS_URL="nats://127.0.0.1:${ports[2]}" NATS_USER="$(user_of viewer)" NATS_PASSWORD="$(password_of viewer)" \
  "$planact" serve --web-addr "127.0.0.1:$web_port" web >"$work/web.log" 2>&1 &
pids+=($!)
wait_for "$work/web.log" "service started"
log "services up; logs in $work; the web view on http://127.0.0.1:$web_port/"

NATS_URL="nats://127.0.0.1:${ports[1]}" NATS_USER="$(user_of admin)" NATS_PASSWORD="$(password_of admin)" \
  "$planact" up --demo --services none --metrics "" \
  --planner-url "http://127.0.0.1:$sim_port" --actor-url "http://127.0.0.1:$((sim_port+1))" "$@"
status=$?

if [[ $keep == 1 ]]; then
  log "staying up (Ctrl-C stops); try: nats --server '$(url admin "${ports[0]}")' micro ls"
  wait
fi
exit $status
