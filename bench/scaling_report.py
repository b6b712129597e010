"""The pure parts of bench/run_scaling_bench.sh (issue 17: N GPUs on one host).

  scaling_report.py job EXPORT.jsonl --config C --gpus N --layout L --warmup W [--state S]
      One JSON line for a job run through the service: the median step_time_ms of its telemetry
      (trainctl export --format=jsonl) after W warm-up steps.
  scaling_report.py table RESULTS.jsonl
      The table: per configuration, GPU count and layout, ours through the service beside
      PyTorch DDP, samples/s, weak-scaling efficiency against 1 GPU (t1 / tN: the micro-batch
      per rank is fixed) and the gradient allreduce's bus bandwidth (ours from train_bench, our
      in-process engine with the same Collective; PyTorch's a dist.all_reduce of the same size),
      then issue 17's goals.

RESULTS.jsonl holds three kinds of lines: "engine": "mptrain" with a "layout" (this script's
`job`), "engine": "mptrain" without one (bench/train_bench), and "engine": "pytorch"
(bench/pytorch_baseline.py). Other lines are ignored.
"""
import argparse
import json
import statistics
import sys

ACCUMULATION = 4
MICRO_BATCH = {"seed": 64, "mlp1k": 512, "mlp8k": 4096}  # bench/bench_configs.h
ORDER = {"seed": 0, "mlp1k": 1, "mlp8k": 2}


def layout_name(layout):
    """'1xN': one worker daemon with N slots; 'Nx1': N daemons of one slot each."""
    workers, slots = layout.split("x")
    if workers == "1" and slots == "1":
        return "1 worker x 1 slot"
    if workers == "1":
        return f"1 worker x {slots} slots"
    return f"{workers} workers x 1 slot"


def job_record(path, config, gpus, layout, warmup, state):
    records = []
    try:
        records = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    except OSError:
        pass
    times = []
    for r in records:
        step = int(r.get("step", 0))
        t = r.get("stepTimeMs", r.get("step_time_ms"))
        if step > warmup and t is not None and r.get("rank", 0) in (0, None):
            times.append(float(t))
    step_ms = statistics.median(times) if times else None
    record = {"engine": "mptrain", "config": config, "gpus": gpus, "layout": layout,
              "state": state, "step_ms": step_ms, "steps": len(times)}
    if state != "SUCCEEDED":  # Its steps so far stay out of the table and the goals.
        record["step_ms"], record["partial_step_ms"] = None, step_ms
    if record["step_ms"]:
        record["samples_per_s"] = MICRO_BATCH[config] * ACCUMULATION * gpus / (step_ms * 1e-3)
    return record


def load(path):
    service, in_process, torch = {}, {}, {}
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        key = (r.get("config"), int(r.get("gpus", 0)))
        if r.get("engine") == "pytorch":
            torch[key] = r
        elif r.get("engine") == "mptrain" and "layout" in r:
            service[key + (r["layout"],)] = r
        elif r.get("engine") == "mptrain":
            in_process[key] = r
    return service, in_process, torch


def fmt(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def table(path, out=sys.stdout):
    service, in_process, torch = load(path)
    # t1: our 1-GPU job (one worker, one slot) and PyTorch's 1-process run, per configuration.
    t1_ours = {c: r.get("step_ms") for (c, n, _), r in service.items() if n == 1}
    t1_torch = {c: r.get("step_ms") for (c, n), r in torch.items() if n == 1}
    efficiency = {}  # (engine, config, gpus, layout) -> t1 / tN
    print("| config | GPUs | our layout | mptrain ms/step | mptrain samples/s | mptrain efficiency "
          "| PyTorch DDP ms/step | PyTorch samples/s | PyTorch efficiency | speed-up "
          "| our allreduce busbw GB/s (train_bench) | PyTorch allreduce busbw GB/s |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|", file=out)
    rows = sorted(service, key=lambda k: (ORDER.get(k[0], 9), k[1], k[2] != f"1x{k[1]}"))
    for config, gpus, layout in rows:
        ours = service[(config, gpus, layout)]
        theirs = torch.get((config, gpus), {})
        bench = in_process.get((config, gpus), {})
        t_ours, t_torch = ours.get("step_ms"), theirs.get("step_ms")
        e_ours = t1_ours.get(config) / t_ours if t_ours and t1_ours.get(config) else None
        e_torch = t1_torch.get(config) / t_torch if t_torch and t1_torch.get(config) else None
        efficiency[("mptrain", config, gpus, layout)] = e_ours
        efficiency[("pytorch", config, gpus, layout)] = e_torch
        state = "" if ours.get("state", "SUCCEEDED") == "SUCCEEDED" else f" ({ours['state']})"
        speedup = f"{t_torch / t_ours:.2f}x" if t_ours and t_torch else "-"
        busbw = lambda r: fmt(r.get("allreduce_busbw_gbs"), ".1f") if gpus > 1 else "-"
        print(f"| {config} | {gpus} | {layout_name(layout)}{state} | {fmt(t_ours, '.3f')} "
              f"| {fmt(ours.get('samples_per_s'), '.0f')} | {fmt(e_ours, '.1%')} "
              f"| {fmt(t_torch, '.3f')} | {fmt(theirs.get('samples_per_s'), '.0f')} "
              f"| {fmt(e_torch, '.1%')} | {speedup} | {busbw(bench)} | {busbw(theirs)} |",
              file=out)
    if not any(n > 1 for (_, n) in in_process):
        print("\nour allreduce busbw: no train_bench line with more than 1 GPU in this run",
              file=out)

    print(file=out)
    goals(service, efficiency, out)


def goals(service, efficiency, out):
    """Issue 17's goals, for each of our layouts: mlp8k's efficiency at 8 GPUs >= 95% and above
    PyTorch DDP's; the seed job's step time within +-20% of its 2-GPU time up to 8 GPUs."""
    for family, layout_at in (("1 worker x N slots", lambda n: f"1x{n}"),
                              ("N workers x 1 slot", lambda n: f"{n}x1")):
        ours = efficiency.get(("mptrain", "mlp8k", 8, layout_at(8)))
        theirs = efficiency.get(("pytorch", "mlp8k", 8, layout_at(8)))
        if ours is None:
            verdict = "not measured (no successful mlp8k job on 8 GPUs in this run)"
        else:
            met = ours >= 0.95 and theirs is not None and ours > theirs
            verdict = (f"{'met' if met else 'NOT met'}: {ours:.1%}, PyTorch DDP "
                       f"{fmt(theirs, '.1%', 'not measured')}")
        print(f"goal, {family}: mlp8k efficiency at 8 GPUs >= 95% and ahead of PyTorch DDP: "
              f"{verdict}", file=out)
        seed = {n: service.get(("seed", n, layout_at(n)), {}).get("step_ms") for n in (2, 4, 8)}
        if seed[2] is None or seed[8] is None:
            verdict = "not measured (needs seed jobs on 2 and 8 GPUs)"
        else:
            measured = [(n, t) for n, t in seed.items() if t is not None]
            spread = max(abs(t / seed[2] - 1) for _, t in measured)
            verdict = (f"{'met' if spread <= 0.2 else 'NOT met'}: largest change {spread:.0%} ("
                       + ", ".join(f"{n} GPUs {t:.3f} ms" for n, t in measured) + ")")
        print(f"goal, {family}: seed step time flat (+-20%) from 2 to 8 GPUs: {verdict}", file=out)


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    job = sub.add_parser("job")
    job.add_argument("export")
    job.add_argument("--config", required=True, choices=sorted(MICRO_BATCH))
    job.add_argument("--gpus", type=int, required=True)
    job.add_argument("--layout", required=True)
    job.add_argument("--warmup", type=int, required=True)
    job.add_argument("--state", default="SUCCEEDED")
    report = sub.add_parser("table")
    report.add_argument("results")
    args = parser.parse_args()
    if args.command == "job":
        print(json.dumps(job_record(args.export, args.config, args.gpus, args.layout, args.warmup,
                                    args.state)), flush=True)
    else:
        table(args.results)


if __name__ == "__main__":
    main()
