#!/usr/bin/env bash
# ab.sh: the same bench/step run for two commits, alternating (before,
# after, before, after, …) so that both meet the same machine, printing
# each run's makespan, its rollouts' settle times and the CPU lines of
# the processes named in SHOW.
#
#   bench/step/ab.sh BEFORE [AFTER] [-- step flags]     AFTER defaults to the work tree
#   ROUNDS=2 SHOW='session-store|planact \(|nats \(' bench/step/ab.sh 29d0469 -- -prompts 64 -copies 8 -rollouts 1
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
before=$1; shift
after=""
if [ $# -gt 0 ] && [ "$1" != "--" ]; then after=$1; shift; fi
[ "${1:-}" = "--" ] && shift
ROUNDS=${ROUNDS:-2}
SHOW=${SHOW:-'session-store|planact \(|nats \('}
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/before" 2>/dev/null; [ -n "$after" ] && git -C "$root" worktree remove --force "$work/after" 2>/dev/null; rm -rf "$work"' EXIT
git -C "$root" worktree add -q --detach "$work/before" "$before"
adir=$root
if [ -n "$after" ]; then git -C "$root" worktree add -q --detach "$work/after" "$after"; adir=$work/after; fi
run() {
  (cd "$1" && go run ./bench/step -out "" -raw-messages 2000 "${@:2}" 2>&1 |
    grep -E "^ *($SHOW)|makespan: first|^ +[0-9]+ +0\.[0-9]+ ")
}
for i in $(seq "$ROUNDS"); do
  echo "######## before ($before) $i"; run "$work/before" "$@"
  echo "######## after (${after:-work tree}) $i"; run "$adir" "$@"
done
