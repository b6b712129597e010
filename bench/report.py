"""Reads the JSON lines of train_bench and pytorch_baseline.py (and the end-to-end timings) and
prints the side-by-side table that goes into BENCHMARKS.md."""
import json
import sys


def main(paths):
    rows = {}
    e2e = {}
    for path in paths:
        for line in open(path):
            line = line.strip()
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if record.get("engine") == "e2e":
                e2e[record["name"]] = record["seconds"]
                continue
            rows.setdefault((record["config"], record["gpus"]), {})[record["engine"]] = record
    print("| config | GPUs | PyTorch ms/step | mptrain ms/step | speed-up | PyTorch samples/s | "
          "mptrain samples/s | PyTorch TFLOP/s/GPU | mptrain TFLOP/s/GPU | grad allreduce ms "
          "(busbw GB/s) | NCCL allreduce ms via torch (busbw GB/s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    order = {"seed": 0, "mlp1k": 1, "mlp8k": 2}
    for (config, gpus), engines in sorted(rows.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0][1])):
        ours, torch_ = engines.get("mptrain"), engines.get("pytorch")
        def f(record, key, fmt):
            return fmt.format(record[key]) if record else "-"
        speedup = (f"{torch_['step_ms'] / ours['step_ms']:.2f}x" if ours and torch_ else "-")
        ar = lambda r: f"{r['allreduce_ms']:.4f} ({r['allreduce_busbw_gbs']:.1f})" if r and gpus > 1 else "-"
        print(f"| {config} | {gpus} | {f(torch_, 'step_ms', '{:.3f}')} | {f(ours, 'step_ms', '{:.3f}')} | "
              f"{speedup} | {f(torch_, 'samples_per_s', '{:.0f}')} | {f(ours, 'samples_per_s', '{:.0f}')} | "
              f"{f(torch_, 'tflops_per_gpu', '{:.1f}')} | {f(ours, 'tflops_per_gpu', '{:.1f}')} | "
              f"{ar(ours)} | {ar(torch_)} |")
    if e2e:
        print()
        print("| end to end, examples/seed.json on 2 GPUs | seconds |")
        print("|---|---|")
        for name, seconds in e2e.items():
            print(f"| {name} | {seconds:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
