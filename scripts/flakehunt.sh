#!/usr/bin/env bash
# flakehunt: run the whole suite (go test -race, every package, TESTP at a
# time, with make test's flags) RUNS times,
# half of them under a CPU hog that keeps every core busy, and tally every
# test that failed even once. A flaky test rejects a correct change: each
# name in the tally is a bug to fix in the behaviour, never by a timeout.
#
#   RUNS=20 scripts/flakehunt.sh            # 20 runs: 10 quiet, 10 hogged
#   RUNS=4 PKGS=./e2e scripts/flakehunt.sh  # fewer runs, one package
#
# Writes OUT (default bench/results/flakehunt.md): one line per run (when,
# hog or not, seconds, failed tests) and the tally. The go test JSON of a
# failed run is kept beside it (flakehunt-run<N>.json) for the post-mortem.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-20}
PKGS=${PKGS:-./...}
OUT=${OUT:-bench/results/flakehunt.md}
GO=${GO:-go}
dir=$(dirname "$OUT")
mkdir -p "$dir"

hog_pids=()
hog_start() {
  local n
  n=$(nproc)
  for _ in $(seq "$n"); do
    (while :; do :; done) &
    hog_pids+=($!)
  done
}
hog_stop() {
  for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null; done
  wait "${hog_pids[@]}" 2>/dev/null
  hog_pids=()
}
trap hog_stop EXIT

# report writes the tally so far: after every run, so that a hunt cut
# short still leaves what it found.
report() {
  {
    echo "# Flake hunt: $done_runs of $RUNS runs of \`go test -race -shuffle=on $PKGS\`"
    echo
    echo "Commit $(git rev-parse --short HEAD), $(nproc) cores; every other run under a busy loop on every core."
    echo
    echo "Runs with a failure: **$failed_runs of $done_runs**."
    echo
    echo "| run | ended | CPU hog | seconds | failed tests |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${lines[@]}"
    echo
    echo "## Tally"
    echo
    if [ ${#tally[@]} = 0 ]; then
      echo "No test failed."
    else
      echo "| test | failures |"
      echo "|---|---|"
      for k in "${!tally[@]}"; do echo "| $k | ${tally[$k]} |"; done | sort
    fi
  } >"$OUT"
}

# As make test: the two long packages start first.
first=""
[ "$PKGS" = "./..." ] && first="./e2e ./internal/chaos"

declare -A tally=()
done_runs=0
lines=()
failed_runs=0
for i in $(seq "$RUNS"); do
  hog=no
  if (( i % 2 == 0 )); then hog=yes; hog_start; fi
  start=$(date +%s)
  json=$(mktemp)
  $GO test -race -shuffle=on -count=1 -p "${TESTP:-4}" -parallel "${TESTPARALLEL:-3}" -ldflags=-w -timeout 30m -json $first $PKGS >"$json" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  [ "$hog" = yes ] && hog_stop
  # A failed test is a "fail" action with a Test name; a package that failed
  # to build or timed out fails without one.
  fails=$(python3 - "$json" <<'PY'
import json, sys
seen = []
for line in open(sys.argv[1], errors="replace"):
    try:
        ev = json.loads(line)
    except ValueError:
        continue
    if ev.get("Action") != "fail":
        continue
    name = ev.get("Package", "?") + ("." + ev["Test"] if ev.get("Test") else "")
    if name not in seen:
        seen.append(name)
# A subtest's failure fails its parents, and a test's its package: keep the
# deepest names (a package named alone failed to build or timed out).
leaves = [n for n in seen
          if not any(o != n and (o.startswith(n + "/") or o.startswith(n + ".")) for o in seen)]
print(" ".join(leaves))
PY
)
  if [ "$rc" != 0 ] && [ -z "$fails" ]; then fails="(exit $rc, no test named)"; fi
  if [ -n "$fails" ]; then
    failed_runs=$((failed_runs + 1))
    cp "$json" "$dir/flakehunt-run$i.json"
    for f in $fails; do tally[$f]=$(( ${tally[$f]:-0} + 1 )); done
  fi
  rm -f "$json"
  line="| $i | $(date -u +%FT%TZ) | $hog | $secs | ${fails:-none} |"
  lines+=("$line")
  echo "run $i/$RUNS: hog=$hog ${secs}s failures: ${fails:-none}"
  done_runs=$i
  report
done

echo "tally: $OUT"
[ "$failed_runs" = 0 ]
