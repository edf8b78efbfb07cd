#!/usr/bin/env bash
# The regression gate of .github/workflows/gpu-bench.yml: hotops-compare gate of RUN against BASE,
# its markdown report printed and appended to the job summary, and the gate's exit code as its own.
#   usage: bash tools/ci_gate.sh BASE.json RUN.json
#   env:   HOTOPS_COMPARE       the tool (default: hotops-compare on PATH, else build-cuda/ or build/ here)
#          MAX_SLOWDOWN_PCT     5      an entry fails when significantly slower than base + this
#          ALPHA                0.05   the U test's significance level
#          GATE_FILTER          .      a regex on names: the entries judged
#          GITHUB_STEP_SUMMARY         where the report is appended (unset: printed only)
#   exit:  0 passed; 1 a regression, a vanished or a failing entry; 2 unreadable input or usage.
#
# The report goes to a file first and the gate's status is kept apart from it: with `gate | tee`, the
# step's status would be tee's, and a failed gate would pass under a shell without pipefail.
set -euo pipefail
if (($# != 2)); then
  echo "usage: bash tools/ci_gate.sh BASE.json RUN.json" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
tool=${HOTOPS_COMPARE:-}
if [ -z "$tool" ]; then
  for c in "$(command -v hotops-compare || true)" "$root/build-cuda/hotops-compare" "$root/build/hotops-compare"; do
    if [ -n "$c" ] && [ -x "$c" ]; then tool=$c; break; fi
  done
fi
if [ -z "$tool" ] || [ ! -x "$tool" ]; then
  echo "ci_gate.sh: hotops-compare not found${tool:+ at $tool} (set HOTOPS_COMPARE, or build it: cmake --build build --target hotops-compare)" >&2
  exit 2
fi

report=$(mktemp)
trap 'rm -f "$report"' EXIT
rc=0
"$tool" gate "$1" "$2" --max-slowdown "${MAX_SLOWDOWN_PCT:-5}" --alpha "${ALPHA:-0.05}" \
        --filter "${GATE_FILTER:-.}" --format=md >"$report" || rc=$?
cat "$report"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then cat "$report" >>"$GITHUB_STEP_SUMMARY"; fi
case $rc in
  0) ;;
  1) echo "ci_gate.sh: the gate failed (exit 1): a regression beyond ${MAX_SLOWDOWN_PCT:-5}%, or an entry vanished or failing" >&2 ;;
  *) echo "ci_gate.sh: hotops-compare gate could not judge the runs (exit $rc)" >&2 ;;
esac
exit "$rc"
