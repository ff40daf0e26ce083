#!/usr/bin/env bash
# Runs every fuzz target of $FUZZPKGS for $FUZZTIME each (a duration, or a
# number of inputs such as 20000x: the same work however busy the machine
# is), on $FUZZWORKERS workers (default: every core). go test -fuzz takes
# one target at a time, so this lists them and loops. $FUZZMINIMIZE (a
# duration or a count, default go's 60s) caps how long the fuzzer spends
# shrinking each new interesting input: the smoke in make test gives it 50
# tries, so that a slow target's shrinking does not outlast its fuzzing.
# FUZZFRESH=1 starts from the seed corpus (f.Add and testdata) in a fresh
# cache rather than from every input go's fuzz cache has kept from earlier
# runs: the smoke then does the same work on every machine, as on a fresh CI
# one, instead of growing with each run (make fuzz keeps the cache).
set -euo pipefail
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-20000x}
FLAGS=()
[ -n "${FUZZWORKERS:-}" ] && FLAGS=(-parallel "$FUZZWORKERS")
[ -n "${FUZZMINIMIZE:-}" ] && FLAGS+=(-fuzzminimizetime "$FUZZMINIMIZE")
ARGS=()
if [ -n "${FUZZFRESH:-}" ]; then
  cache=$(mktemp -d)
  trap 'rm -rf "$cache"' EXIT
  ARGS=(-args "-test.fuzzcachedir=$cache")
fi
for pkg in ${FUZZPKGS:-./pkg/plan}; do
  for target in $($GO test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "fuzz $pkg $target for $FUZZTIME"
    $GO test "$pkg" -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "${FLAGS[@]}" "${ARGS[@]}"
  done
done
