"""Random cases against PyTorch on the CPU: the fixed table of cpu_parity.py, widened. Each case is
drawn from the job-spec space that validation accepts and pytorch_reference.py can express
(world size 1..3, depth and widths, relu/gelu, none/layer_norm/batch_norm, micro-batch and
accumulation, fp32/bf16, mse/cross-entropy with smoothing and int32 / [N, 1] class ids,
SGD/Adam/AdamW with their options, every schedule, clipping, fp16/bf16 gradient communication,
shuffled epochs, evaluation, checkpoints) and run exactly as cpu_parity.py runs its table: the same
inputs (common.write_inputs), the same cluster of our binaries (common.Cluster), the same
reference (DDP over gloo, ranks started by hand) and the same comparison and tolerances.

  /usr/bin/python3 parity/random_parity.py --bin DIR --out DIR [--seed S] [--count N]
      [--start I] [--minutes M] [--only I[,J...]] [--case-json FILE_OR_JSON [--name N]]

Case I of seed S is drawn from its own generator (seed S, index I): `--seed S --only I` reruns
exactly that case. --case-json runs one case given as JSON ({"world": W, ...cpu_parity case
keys...}; the spec each run prints is in that form; --name seeds its inputs as write_inputs
does: `--name s1-27` gives case 27 of seed 1 its data back). --profile conditioned draws the same
cases kept out of ill-conditioned corners (condition()). Exits 1 when a case disagrees or fails.

Verdicts: ok; MISMATCH; "weak" marks a case whose parameters moved too little for the comparison
to prove much (cpu_parity.py fails those; here only noted).

Not drawn: fp16 and loss scaling (CPU autocast is bf16 only and GradScaler CUDA only in the
reference), sync_batch_norm (CUDA), layer_norm under bf16 (PyTorch 1.13 refuses it on the CPU),
synthetic data (our generator; the reference reads npy files), Adam with batch norm (the gradient
of a Linear bias right before a batch norm is exactly 0 but for rounding noise, which Adam turns
into lr-sized steps: see cpu_parity.py), telemetry_every > 1 (steps left out of telemetry).
"""
import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_parity  # noqa: E402
from common import Cluster, compare_steps, flat, load_safetensors, rel, write_inputs  # noqa: E402


# ---------------------------------------------------------------------------------------------
# Drawing a case.


def _maybe(r, p):
    return r.random() < p


def draw_case(seed, index):
    """A case in cpu_parity's form plus "world" (and "targets_2d", "checkpoint_every")."""
    r = random.Random(f"{seed}:{index}")
    world = r.choice([1, 2, 2, 3, 3])
    precision = r.choice(["fp32", "fp32", "bf16"])
    loss = r.choice(["mse", "cross_entropy"])
    norm = r.choice(["none", "none", "none", "layer_norm", "batch_norm"])
    if norm == "layer_norm" and precision == "bf16":
        norm = r.choice(["none", "batch_norm"])
    depth = r.choice([0, 1, 1, 2, 2, 3])
    model = {"input_dim": r.randint(1, 24),
             "hidden_dims": [r.randint(1, 40) for _ in range(depth)],
             "output_dim": r.randint(2, 8) if loss == "cross_entropy" else r.randint(1, 8),
             "activation": r.choice(["relu", "gelu"])}
    if norm != "none":
        model["norm"] = norm
    micro = r.choice([1, 2, 3, 4, 5, 8, 12, 16])
    if norm == "batch_norm":
        micro = max(micro, 2)
    case = dict(model=model, micro_batch_size=micro, accumulation_steps=r.randint(1, 4),
                steps=r.randint(1, 12), precision=precision, world=world)
    if loss == "cross_entropy":
        case["loss"] = loss
        if _maybe(r, 0.5):
            case["label_smoothing"] = r.choice([round(r.uniform(0.01, 0.3), 3), 1.0])
        if _maybe(r, 0.3):
            case["int32_targets"] = True
        if _maybe(r, 0.3):
            case["targets_2d"] = True
    # Data: contiguous shards (sometimes one micro-batch per shard: used in place), or shuffled
    # epochs over any row count.
    if _maybe(r, 0.35):
        case["shuffle"] = True
        case["rows"] = r.randint(1, 70)
        case["rows_per_rank"] = max(1, case["rows"] // world)
        if _maybe(r, 0.7):
            case["shuffle_seed"] = r.choice([r.randint(0, 100), r.randint(2 ** 32, 2 ** 40)])
    else:
        per_rank = micro if _maybe(r, 0.2) else r.randint(1, 40)
        case["rows_per_rank"] = per_rank
        if _maybe(r, 0.3):
            case["rows"] = r.randint(world, per_rank * world + world)  # uneven shards
    # Optimizer.
    kind = r.choice(["sgd", "sgd", "adam", "adamw"]) if norm != "batch_norm" else "sgd"
    if kind == "sgd":
        opt = {"kind": "sgd", "lr": round(r.uniform(0.01, 0.1), 4)}
        if _maybe(r, 0.7):
            opt["momentum"] = round(r.uniform(0.5, 0.95), 3)
            if _maybe(r, 0.4):
                opt["nesterov"] = True
    else:
        opt = {"kind": kind, "lr": round(r.uniform(0.002, 0.02), 4)}
        if _maybe(r, 0.4):
            opt["beta1"] = r.choice([0.0, 0.5, 0.8, round(r.uniform(0.6, 0.95), 3)])
        if _maybe(r, 0.4):
            opt["beta2"] = r.choice([0.9, 0.99, round(r.uniform(0.9, 0.9999), 4)])
        if _maybe(r, 0.4):
            opt["eps"] = r.choice([1e-6, 1e-4, 1e-3, 0.1])
    if _maybe(r, 0.5):
        opt["weight_decay"] = r.choice([1e-4, 1e-3, 1e-2, 0.05, 0.1])
    case["optimizer"] = opt
    # Schedule.
    sched = r.choice(["none", "constant", "warmup_cosine", "warmup_linear", "step"])
    steps = case["steps"]
    if sched == "constant":
        case["lr_schedule"] = {"kind": "constant"}
    elif sched.startswith("warmup"):
        s = {"kind": sched}
        if _maybe(r, 0.8):
            s["warmup_steps"] = r.randint(0, steps)
        if _maybe(r, 0.7):
            s["min_lr"] = round(opt["lr"] * r.choice([0.0, 0.1, 0.5, 1.0, r.random()]), 6)
        case["lr_schedule"] = s
    elif sched == "step":
        case["lr_schedule"] = {"kind": "step", "step_size": r.randint(1, steps + 2),
                               "gamma": r.choice([1.0, 0.5, 0.1, round(r.uniform(0.2, 0.99), 3)])}
    if _maybe(r, 0.35):
        case["max_grad_norm"] = r.choice([0.05, 0.2, 0.5, 1.0, 5.0])
    if _maybe(r, 0.3):
        case["grad_comm_dtype"] = r.choice(["fp16", "bf16", "fp32"])
    if _maybe(r, 0.35):
        case["eval_rows"] = r.choice([1, 2, 3, r.randint(1, 50)])
        if _maybe(r, 0.7):
            case["eval_every"] = r.randint(1, steps + 1)
    if _maybe(r, 0.15):
        case["checkpoint_every"] = r.randint(1, steps)
    return case


def condition(case):
    """--profile conditioned: the same draw, kept away from ill-conditioned corners where
    rounding noise alone exceeds the tolerances (seen in the wide draw, and reproduced by
    PyTorch against itself with its initial weights moved by 1e-7): batch norm over 2-3 rows and
    norms over 1-3 features (normalised outputs near +-1: gradients by cancellation), Adam under
    bf16 (it turns the sign of near-zero gradients into lr-sized steps), and fp16/bf16 gradient
    communication over 3 ranks (a sum of 3 rounded values depends on the order, which differs
    between gloo's ring over DDP's bucket and ours)."""
    case = json.loads(json.dumps(case))
    model = case["model"]
    if model.get("norm", "none") != "none":
        model["hidden_dims"] = [max(8, w) for w in model["hidden_dims"]]
        if model["norm"] == "batch_norm":
            # At least 8 distinct rows in every micro-batch.
            case["micro_batch_size"] = max(case["micro_batch_size"], 8)
            case["rows_per_rank"] = max(case["rows_per_rank"], case["micro_batch_size"])
            if "rows" in case:
                case["rows"] = max(case["rows"], case["micro_batch_size"] * case["world"])
    if case["precision"] == "bf16" and case["optimizer"]["kind"] != "sgd":
        case["precision"] = "fp32"
    if case.get("grad_comm_dtype", "fp32") != "fp32" and case["world"] == 3:
        case["world"] = 2
    if case.get("label_smoothing") == 1.0 and case["precision"] == "bf16":
        case["label_smoothing"] = 0.1  # uniform targets: every logit equal, argmax by rounding
    return case


def check_case(case):
    """The rules a case must follow (validation, and what the reference can do); a reason or
    None."""
    world = case["world"]
    shuffled = case.get("shuffle", False)
    rows = case.get("rows", case["rows_per_rank"] * world)
    if not shuffled and rows < world:
        return "a rank without data"
    if case["model"].get("norm") == "layer_norm" and case["precision"] == "bf16":
        return "layer_norm under CPU bf16 autocast fails in PyTorch 1.13"
    if case["model"].get("norm") == "batch_norm" and case["micro_batch_size"] < 2:
        return "batch_norm needs micro_batch_size >= 2"
    return None


# ---------------------------------------------------------------------------------------------
# Running one case: cpu_parity.main's steps, for any world size.


def run_torch(case_dir, world, timeout=300):
    """cpu_parity.run_torch for `world` ranks."""
    return cpu_parity.run_torch(case_dir, timeout=timeout, world=world)


def make_spec(name, case, case_dir):
    world = case["world"]
    spec = write_inputs(name, case, case_dir, device="cpu", world=world)
    if case.get("targets_2d"):
        for prefix in ("", "eval_"):
            path = os.path.join(case_dir, prefix + "targets.npy")
            if os.path.exists(path):
                np.save(path, np.load(path).reshape(-1, 1))
    if case.get("checkpoint_every"):
        spec["checkpoint_every"] = case["checkpoint_every"]
        spec["checkpoint_dir"] = os.path.join(case_dir, "checkpoints")
    if "eval_rows" in case and "eval_every" not in case:
        spec.pop("eval_every", None)
    return spec


def run_case(cluster, name, case, out):
    """Returns (ok, figures, problems); cpu_parity.main's comparison for one case."""
    case_dir = os.path.join(out, name)
    os.makedirs(case_dir, exist_ok=True)
    world = case["world"]
    spec = make_spec(name, case, case_dir)
    with open(os.path.join(case_dir, "case.json"), "w") as f:
        json.dump({"spec": spec}, f)
    with open(os.path.join(case_dir, "random_case.json"), "w") as f:
        json.dump(case, f)
    started = time.time()
    run_torch(case_dir, world)
    torch_s = time.time() - started
    torch_steps = json.load(open(os.path.join(case_dir, "torch_steps.json")))
    torch_tensors = load_safetensors(os.path.join(case_dir, "torch_final.safetensors"))
    torch_final = flat(torch_tensors)
    init = flat(load_safetensors(spec["init_checkpoint"]))
    run_spec = dict(spec, output_checkpoint=os.path.join(case_dir, "ours.safetensors"))
    # A rerun into the same --out: our job never writes over an earlier run's files.
    if os.path.exists(run_spec["output_checkpoint"]):
        os.remove(run_spec["output_checkpoint"])
    if "checkpoint_dir" in spec and os.path.isdir(spec["checkpoint_dir"]):
        shutil.rmtree(spec["checkpoint_dir"])
    steps, ours_s = cluster.run(run_spec, os.path.join(case_dir, "ours.json"), timeout=300)
    with open(os.path.join(case_dir, "ours_steps.json"), "w") as f:
        json.dump(steps, f)
    ours_tensors = load_safetensors(run_spec["output_checkpoint"])
    precision = case["precision"]
    samples = case["micro_batch_size"] * case["accumulation_steps"] * world
    accuracy_tol = 0.0 if precision == "fp32" else 2.0 / samples
    eval_accuracy_tol = 0.0 if precision == "fp32" else 2.0 / case.get("eval_rows", 1)
    problems, worst_loss = compare_steps(steps, torch_steps, cpu_parity.LOSS_TOL[precision],
                                         accuracy_tol, eval_accuracy_tol)
    param_err, param_tol, stats_err = cpu_parity.compare_final(case, ours_tensors, torch_tensors,
                                                               problems)
    change = rel(torch_final, init)
    weak = change < 10 * max(param_err, param_tol / 10)
    figures = dict(steps=len(steps), worst_loss=worst_loss, param_err=param_err,
                   stats_err=stats_err, change=change, torch_s=round(torch_s, 1),
                   ours_s=round(ours_s, 1), weak=weak)
    return not problems, figures, problems


# ---------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    default_bin = os.path.join(os.path.dirname(here), "bazel-bin")
    parser.add_argument("--bin", default=None, help="coordinator, worker and trainctl "
                        "(default: a directory of links into bazel-bin)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=0, help="stop drawing after this long")
    parser.add_argument("--profile", choices=["wide", "conditioned"], default="wide",
                        help="conditioned: see condition()")
    parser.add_argument("--only", default="", help="case indices of --seed, comma-separated")
    parser.add_argument("--case-json", default="", help="one case: a JSON file or text")
    parser.add_argument("--name", default="custom", help="--case-json's case name (it seeds "
                        "the inputs: s<S>-<I> gives case I of seed S its own data)")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    bin_dir = args.bin
    if bin_dir is None:
        bin_dir = os.path.join(out, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        for target in ("coordinator/coordinator", "worker/worker", "client/trainctl"):
            link = os.path.join(bin_dir, os.path.basename(target))
            if not os.path.exists(link):
                os.symlink(os.path.join(default_bin, target), link)

    if args.case_json:
        text = args.case_json
        if os.path.exists(text):
            text = open(text).read()
        cases = [(args.name, json.loads(text))]
    else:
        draw = draw_case if args.profile == "wide" else (
            lambda seed, index: condition(draw_case(seed, index)))
        prefix = "s" if args.profile == "wide" else "c"
        indices = ([int(i) for i in args.only.split(",")] if args.only
                   else range(args.start, args.start + args.count))
        cases = ((f"{prefix}{args.seed}-{i}", draw(args.seed, i)) for i in indices)

    deadline = time.time() + 60 * args.minutes if args.minutes else math.inf
    # common.Cluster reads the coordinator's port from <out>/port: a stale one from an earlier
    # run in the same directory would point at a coordinator that is gone.
    if os.path.exists(os.path.join(out, "port")):
        os.remove(os.path.join(out, "port"))
    cluster = Cluster(bin_dir, out, gpus=0, roots_dir=out, cpu_workers=3)
    counts = {"ok": 0, "MISMATCH": 0, "ERROR": 0, "skipped": 0, "weak": 0}
    try:
        for name, case in cases:
            if time.time() > deadline:
                break
            case.setdefault("world", 2)
            reason = check_case(case)
            if reason:
                counts["skipped"] += 1
                print(f"[{name}] skipped ({reason})", flush=True)
                continue
            print(f"[{name}] case {json.dumps(case, sort_keys=True)}", flush=True)
            try:
                ok, figures, problems = run_case(cluster, name, case, out)
            except Exception as error:  # noqa: BLE001
                counts["ERROR"] += 1
                print(f"[{name}] ERROR {type(error).__name__}: {str(error)[-1500:]}", flush=True)
                traceback.print_exc(limit=2)
                # A failed job may leave ranks behind: start a fresh cluster.
                cluster.close()
                cluster = Cluster(bin_dir, out, gpus=0, roots_dir=out, cpu_workers=3)
                continue
            verdict = "ok" if ok else "MISMATCH"
            counts[verdict] += 1
            if ok and figures["weak"]:
                counts["weak"] += 1
            print(f"[{name}] {verdict} loss {figures['worst_loss']:.3e} params "
                  f"{figures['param_err']:.3e} stats {figures['stats_err']} change "
                  f"{figures['change']:.3e}{' (weak: barely moved)' if figures['weak'] else ''} "
                  f"torch/ours {figures['torch_s']}/{figures['ours_s']} s", flush=True)
            for problem in problems[:8]:
                print(f"[{name}]   {problem}", flush=True)
    finally:
        cluster.close()
    print(f"summary: {counts}", flush=True)
    return 1 if counts["MISMATCH"] or counts["ERROR"] else 0


if __name__ == "__main__":
    sys.exit(main())
