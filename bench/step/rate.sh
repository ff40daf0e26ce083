#!/usr/bin/env bash
# rate.sh: does a service's CPU per act depend on how many replicas share
# the load, or on the rate each process runs at? The same quick step
# (32 prompts × 4 copies) with 1 and 2 act-dispatcher/actor-gateway
# replicas, and with 1 replica at engines 2× and 4× slower and 2× faster
# (the same tokens, each at another pace), each printing the per-process
# CPU per act from /proc. Single runs on a shared machine: read the pairs
# run one after the other, not the digits.
#
#   bench/step/rate.sh > bench/results/step-rate.txt
set -euo pipefail
cd "$(dirname "$0")/../.."
go build -o /tmp/planact-step ./bench/step
run() {
  echo "######## $1"; shift
  /tmp/planact-step -quick -prompts 32 -out "" -raw-messages 2000 "$@" 2>&1 |
    grep -E "^ *(act-dispatcher|actor-gateway|planact \(|nats \(|makespan)|per act \("
}
slow2="-planner-per-token 6ms -planner-ttft 300ms -actor-per-token 3ms -actor-ttft 100ms"
slow4="-planner-per-token 12ms -planner-ttft 600ms -actor-per-token 6ms -actor-ttft 200ms"
fast2="-planner-per-token 1500us -planner-ttft 75ms -actor-per-token 750us -actor-ttft 25ms"
two="-replicas act-dispatcher=2,actor-gateway=2"
run "1 replica"
run "2 replicas" $two
run "1 replica, engines 2x slower" $slow2
run "1 replica, engines 4x slower" $slow4
run "2 replicas, engines 2x faster" $two $fast2
run "1 replica, engines 2x faster" $fast2
run "1 replica (again)"
run "2 replicas (again)" $two
