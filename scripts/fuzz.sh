#!/usr/bin/env bash
# Runs every fuzz target of $FUZZPKGS for $FUZZTIME each (a duration, or a
# number of inputs such as 20000x: the same work however busy the machine
# is), on $FUZZWORKERS workers (default: every core). go test -fuzz takes
# one target at a time, so this lists them and loops.
set -euo pipefail
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-20000x}
WORKERS=()
[ -n "${FUZZWORKERS:-}" ] && WORKERS=(-parallel "$FUZZWORKERS")
for pkg in ${FUZZPKGS:-./pkg/plan}; do
  for target in $($GO test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "fuzz $pkg $target for $FUZZTIME"
    $GO test "$pkg" -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "${WORKERS[@]}"
  done
done
