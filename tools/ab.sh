#!/usr/bin/env bash
# Before and after, measured the way docs/timing.md asks: two bench builds run the same entries in the
# same order, in alternating processes (base, new, base, new, ...), ROUNDS processes each, one JSON per
# process; then, per entry, each build's fastest and median time over all its samples, and new/base.
# An entry's time moves from one process to the next (where its buffers land, what ran before it, how
# fast a CPU team's threads wake), so one process a side shows little.
#   usage: bash tools/ab.sh BASE_BENCH NEW_BENCH OUTDIR [ROUNDS] -- [bench arguments...]
#          e.g. bash tools/ab.sh old/build/bench build/bench ab 3 -- \
#                 --benchmark_filter='model.mlp_tiny/cpu/' --benchmark_repetitions=3
#   writes OUTDIR/base-R.json, OUTDIR/new-R.json (R = 1..ROUNDS, default 3; each process's stderr
#          beside it as .err) and OUTDIR/ab.md, the table, also printed
#   exit:  0 done; 1 a process failed (the table is not made); 2 usage, or bench's own exit 2 (bad input)
set -euo pipefail
usage() {
  echo "usage: bash tools/ab.sh BASE_BENCH NEW_BENCH OUTDIR [ROUNDS] -- [bench arguments...]" >&2
  exit 2
}
(($# >= 3)) || usage
base=$1 new=$2 out=$3
shift 3
rounds=3
if (($#)) && [ "$1" != -- ]; then
  rounds=$1
  shift
fi
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: ROUNDS is a whole number from 1, not '$rounds'" >&2; exit 2; }
(($# == 0)) || [ "$1" = -- ] || usage
(($# == 0)) || shift
for b in "$base" "$new"; do
  [ -x "$b" ] || { echo "ab.sh: $b is not an executable bench" >&2; exit 2; }
done
command -v python3 >/dev/null || { echo "ab.sh: python3 is needed for the table" >&2; exit 2; }
mkdir -p "$out"

for ((r = 1; r <= rounds; ++r)); do
  for side in base new; do
    bin=$base
    [ "$side" = new ] && bin=$new
    json="$out/$side-$r.json"
    status=0
    "$bin" "$@" --benchmark_out="$json" --benchmark_out_format=json >/dev/null 2>"$out/$side-$r.err" || status=$?
    if ((status)); then
      echo "ab.sh: $side process $r failed with exit $status ($bin; $out/$side-$r.err):" >&2
      tail -3 "$out/$side-$r.err" >&2
      exit $((status == 2 ? 2 : 1))
    fi
    echo "ab.sh: $side $r of $rounds done" >&2
  done
done

python3 - "$out" "$rounds" <<'EOF' | tee "$out/ab.md"
import json, math, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
to_us = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
def samples(side):
    got, order = {}, []
    for r in range(1, rounds + 1):
        for b in json.load(open(f"{out}/{side}-{r}.json"))["benchmarks"]:
            if b.get("run_type") == "aggregate" or b.get("error_occurred"):
                continue
            name = b.get("run_name", b["name"])
            if name not in got:
                got[name] = []
                order.append(name)
            got[name].append(b["real_time"] * to_us[b.get("time_unit", "ns")])
    return got, order
base, order = samples("base")
new, _ = samples("new")
print(f"{rounds} processes of each build, alternating; fastest / median of each build's samples, us\n")
print("| entry | base | new | new/base: fastest / median |")
print("|---|---|---|---|")
ratios, slower = [], []
for name in order:
    if name not in new:
        continue
    b, n = base[name], new[name]
    rf, rm = min(n) / min(b), statistics.median(n) / statistics.median(b)
    ratios.append((rf, rm))
    mark = " (slower by both)" if rf > 1.05 and rm > 1.05 else ""
    if mark:
        slower.append(name)
    print(f"| `{name}` | {min(b):.4g} / {statistics.median(b):.4g} | {min(n):.4g} / {statistics.median(n):.4g} "
          f"| {rf:.3f} / {rm:.3f}{mark} |")
only = [n for n in order if n not in new] + [n for n in new if n not in base]
if not ratios:
    print("\nno entry has times in both builds")
    sys.exit(0)
geo = [math.exp(sum(math.log(r[k]) for r in ratios) / len(ratios)) for k in (0, 1)]
print(f"\n{len(ratios)} entries in both: geometric mean of new/base {geo[0]:.3f} (fastest), {geo[1]:.3f} (median); "
      f"{len(slower)} more than 5% slower by both")
if only:
    print(f"{len(only)} entries with a time in one build only: " + ", ".join(only[:5]) + (" ..." if len(only) > 5 else ""))
EOF
