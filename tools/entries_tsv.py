#!/usr/bin/env python3
"""Where a run's time went, entry by entry, from its time-stamped console (tools/fullrun.sh).

    usage: entries_tsv.py CONSOLE_LOG ENTRIES_TSV

CONSOLE_LOG: bench's stdout and stderr, each line prefixed by the seconds since the start and a tab,
with HOTOPS_TRACE_SETUP=1 (a line "setup S s (case C, verify V, warm-up W) NAME" when an entry's
set-up ends). Writes ENTRIES_TSV, one line an entry in the order they ended: when it ended, its
seconds (from the end of the one before), its set-up split into case, verification and warm-up,
its name and its time (or ERROR), and prints the seconds by group (op families and models, CPU
and CUDA), the error entries and how many entries bench marked as timed on a busy CPU.
"""
import re
import sys

SETUP = re.compile(r"setup ([\d.]+) s \(case ([\d.]+), verify ([\d.]+), warm-up ([\d.]+)\) (\S+)")
# A result line of Google Benchmark's console: the name (with its /real_time or /manual_time), then
# the time and its unit, or an error.
RESULT = re.compile(r"^(\S+/(?:real_time|manual_time))\s+(?:([\d.]+) (ns|us|ms|s)\b|ERROR OCCURRED: (.*))")


def main(log_path, tsv_path):
    setups = {}
    rows = []
    busy = 0  # entries bench marked [BUSY CPU: ...] (cpu_wait_pct over 5%)
    last = None
    with open(log_path, encoding="utf-8", errors="replace") as log:
        for line in log:
            stamp, _, text = line.rstrip("\n").partition("\t")
            try:
                t = float(stamp)
            except ValueError:
                continue
            m = SETUP.match(text)
            if m:
                setups[m.group(5)] = tuple(float(m.group(i)) for i in range(1, 5))
                continue
            m = RESULT.match(text)
            if not m:
                continue
            name = m.group(1)
            busy += "[BUSY CPU" in text
            base = name.rsplit("/", 1)[0]
            setup, case, verify, warmup = setups.pop(base, (0.0, 0.0, 0.0, 0.0))
            entry = t - last if last is not None else t
            last = t
            shown = f"{m.group(2)} {m.group(3)}" if m.group(2) else "ERROR " + m.group(4).strip()
            rows.append((t, entry, setup, case, verify, warmup, name, shown))
    with open(tsv_path, "w", encoding="utf-8") as out:
        out.write("# finished_s\tentry_s\tsetup_s\tcase_s\tverify_s\twarmup_s\tname\ttime\n")
        for r in rows:
            out.write(f"{r[0]:.2f}\t{r[1]:.2f}\t{r[2]:.3f}\t{r[3]:.3f}\t{r[4]:.3f}\t{r[5]:.3f}\t{r[6]}\t{r[7]}\n")

    groups = {}
    for r in rows:
        parts = r[6].split("/")
        kind = "models" if parts[0].startswith("model.") else "op families"
        backend = parts[1] if len(parts) > 1 else "?"
        g = groups.setdefault(f"{kind}, {backend}", [0, 0.0, 0.0, 0.0, 0.0])
        g[0] += 1
        g[1] += r[1]
        g[2] += r[3]
        g[3] += r[4]
        g[4] += r[1] - r[2]
    print("| entries | count | all, s | case, s | verification, s | after setup, s |")
    print("|---|---|---|---|---|---|")
    for key in sorted(groups):
        n, total, case, verify, after = groups[key]
        print(f"| {key} | {n} | {total:.0f} | {case:.0f} | {verify:.0f} | {after:.0f} |")
    errors = [r for r in rows if r[7].startswith("ERROR")]
    first = rows[0][0] if rows else 0.0
    end = rows[-1][0] if rows else 0.0
    print(f"{len(rows)} entries, {len(errors)} error entries; the first ended at {first:.1f} s, the last at {end:.1f} s")
    for r in errors:
        print(f"  {r[6]}: {r[7]}")
    if busy:
        print(f"{busy} entries timed on a busy CPU (their threads waited for a core more than 5% of the time: "
              "other work on the machine is in their times)")
    return 1 if errors else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
