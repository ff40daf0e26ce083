#!/usr/bin/env bash
# Runs every fuzz target of $FUZZPKGS for $FUZZTIME each. go test -fuzz
# takes one target at a time, so this lists them and loops. FUZZPARALLEL
# bounds the fuzzing workers (make test: 1, beside the suite; default: one
# per core).
set -euo pipefail
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-3s}
for pkg in ${FUZZPKGS:-./pkg/plan}; do
  for target in $($GO test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "fuzz $pkg $target for $FUZZTIME"
    $GO test "$pkg" -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" ${FUZZPARALLEL:+-parallel "$FUZZPARALLEL"}
  done
done
