#!/usr/bin/env bash
# Runs bench once, every entry its arguments select (all of them without a filter), with each entry's
# set-up traced and every console line time-stamped, and says where the time went.
#   usage: bash tools/fullrun.sh BENCH OUT_DIR [BENCH_ARGS...]
#   e.g.   bash tools/fullrun.sh build/bench fullrun            the whole list, as one process
# OUT_DIR gets all.json (the run's JSON), console.log (stdout and stderr, each line after the
# seconds since the start and a tab) and entries.tsv (tools/entries_tsv.py: one line an entry).
# Prints the wall time, bench's exit status and the seconds by group; exits with bench's status, or
# 1 when an entry is an error.
set -uo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,8p' "$0" >&2
  exit 2
fi
bench=$(realpath "$1")
out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
# Microseconds since the start (bash's EPOCHREALTIME without its decimal point).
start=${EPOCHREALTIME/[.,]/}
stamp() { local us=$((${EPOCHREALTIME/[.,]/} - start)); printf '%d.%02d' $((us / 1000000)) $((us % 1000000 / 10000)); }
HOTOPS_TRACE_SETUP=1 "$bench" --benchmark_out="$out/all.json" "$@" 2>&1 |
  while IFS= read -r line; do
    printf '%s\t%s\n' "$(stamp)" "$line"
  done >"$out/console.log"
rc=${PIPESTATUS[0]}
echo "bench exit $rc, $(stamp) s"
python3 "$here/entries_tsv.py" "$out/console.log" "$out/entries.tsv"
listed=$?
[ "$rc" -ne 0 ] && exit "$rc"
exit "$listed"
