"""Sums Nsight Compute's per-kernel durations (ncu --csv --metrics gpu__time_duration.sum) by
kernel name: where a step's GPU time goes (scripts/device_run.sh profile)."""
import collections
import csv
import sys

totals = collections.defaultdict(float)
counts = collections.Counter()
with open(sys.argv[1], newline="") as f:
    lines = [line for line in f if line.startswith('"')]
for row in csv.DictReader(lines):
    if row.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = row["Kernel Name"][:90]
    totals[name] += float(row["Metric Value"].replace(",", "")) / 1e6  # ns -> ms
    counts[name] += 1
total = sum(totals.values())
print(f"{'kernel':90s} {'calls':>5s} {'ms':>9s} {'share':>6s}")
for name, ms in sorted(totals.items(), key=lambda kv: -kv[1]):
    print(f"{name:90s} {counts[name]:5d} {ms:9.3f} {100 * ms / total:5.1f}%")
print(f"{'total':90s} {sum(counts.values()):5d} {total:9.3f}")
