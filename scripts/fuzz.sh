#!/usr/bin/env bash
# Runs every fuzz target of $FUZZPKGS for $FUZZTIME each. go test -fuzz
# takes one target at a time, so this lists them and loops.
set -euo pipefail
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-3s}
for pkg in ${FUZZPKGS:-./pkg/plan}; do
  for target in $($GO test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "fuzz $pkg $target for $FUZZTIME"
    $GO test "$pkg" -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME"
  done
done
