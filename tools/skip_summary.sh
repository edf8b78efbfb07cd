#!/usr/bin/env bash
# Prints the tests a ctest run skipped, grouped by the reason each test gave (GTEST_SKIP's message),
# most frequent first, from the JUnit file of `ctest --output-junit`.
#   usage: bash tools/skip_summary.sh JUNIT.xml
# tools/test.sh runs it after ctest. awk only: a fresh machine need not have python.
set -euo pipefail
junit=${1:?usage: bash tools/skip_summary.sh JUNIT.xml}
[ -r "$junit" ] || { echo "skip_summary.sh: $junit: cannot read" >&2; exit 2; }
awk '
  function unxml(s) {
    gsub(/&lt;/, "<", s); gsub(/&gt;/, ">", s); gsub(/&quot;/, "\"", s); gsub(/&apos;/, "\047", s)
    gsub(/&amp;/, "\\&", s)
    return s
  }
  function close_case() {
    if (!notrun) return
    r = reason
    if (r == "") r = in_reason ? "(the test gave no reason)" : "(not run: no skip message in its output)"
    n[r]++; total++
    if (!(r in example)) example[r] = name
    notrun = 0
  }
  /<testcase / {
    close_case()
    notrun = ($0 ~ /status="notrun"/); reason = ""; in_reason = 0
    name = $0; sub(/.*<testcase name="/, "", name); sub(/".*/, "", name); sub(/  # GetParam.*/, "", name)
    next
  }
  /<\/testcase>/ { close_case(); next }
  notrun && /: Skipped$/ { in_reason = 1; next }
  notrun && in_reason && /^\[  SKIPPED \]/ { in_reason = 0; next }
  notrun && in_reason { line = unxml($0); reason = reason == "" ? line : reason " " line }
  END {
    close_case()
    if (!total) { print "no test was skipped"; exit }
    printf "%d tests skipped; by reason (ctest -L/-LE cpu, cuda, slow, compare selects tests):\n", total
    for (r in n) printf "%7d  %s\t%s\n", n[r], r, example[r]
  }
' "$junit" | {
  IFS= read -r head
  echo "$head"
  # The biggest groups first; one example test per reason, so that it can be rerun on its own.
  sort -t$'\t' -k1,1nr | awk -F'\t' '{ printf "%s\n         e.g. %s\n", $1, $2 }'
}
