"""GPU proof of issue 14 (normalization layers; SyncBatchNorm under no_sync), on two GPUs:

1. torch.nn.SyncBatchNorm + DDP + no_sync + GradScaler (fp16), 2 ranks with different data per
   rank (rank 1's features scaled and shifted), accumulation 4, against our sync_batch_norm on
   CUDA (and on the CPU backend): per-step loss, loss scale and skipped flag, rank 0's running
   statistics and the final parameters within compare.py's fp16 tolerances.
2. The demonstration: with a local BatchNorm1d (DDP's broadcast_buffers default) each rank's
   running statistics differ at the end; with SyncBatchNorm they are identical (PyTorch's two
   ranks' buffers, side by side), and ours equal PyTorch's rank 0's in both cases.
3. layer_norm in fp16 (autocast runs it in fp32) against torch.nn.LayerNorm.

  source device_bundle/env.sh   # on the GPU machine (2 GPUs)
  python3 parity/sync_bn_compare.py --out /tmp/syncbn     # or: bash scripts/device_run.sh syncbn
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (Cluster, compare_steps, flat, load_safetensors, rel,  # noqa: E402
                    run_gpu_reference)
from compare import LOSS_TOL, PARAM_TOL  # noqa: E402

MODEL = {"input_dim": 256, "hidden_dims": [512, 512], "output_dim": 16, "activation": "relu"}
BASE = dict(rows_per_rank=1024, shift_rank1=True, micro_batch_size=64, accumulation_steps=4,
            steps=20, precision="fp16", optimizer={"lr": 0.02, "momentum": 0.9},
            eval_rows=256, eval_every=10)
CASES = {
    "sync_bn_fp16": dict(BASE, model=dict(MODEL, norm="sync_batch_norm")),
    "local_bn_fp16": dict(BASE, model=dict(MODEL, norm="batch_norm")),
    "layer_norm_fp16": dict(BASE, model=dict(MODEL, norm="layer_norm", activation="gelu")),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.environ.get("MPTRAIN_BIN", "device_bundle/bin"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if torch.cuda.device_count() < 2:
        print(f"sync_bn_compare.py needs 2 GPUs, found {torch.cuda.device_count()}")
        return 2
    cluster = Cluster(args.bin, args.out, gpus=2, roots_dir=os.path.abspath(args.out))
    rows, demo, failures = [], [], 0
    try:
        for name in args.cases.split(","):
            case = CASES[name]
            case_dir, spec, torch_steps = run_gpu_reference(name, case, args.out)
            torch_tensors = load_safetensors(os.path.join(case_dir, "torch_final.safetensors"))
            init = flat(load_safetensors(spec["init_checkpoint"]))
            precision = case["precision"]
            if os.path.exists(os.path.join(case_dir, "torch_buffers_rank1.safetensors")):
                # PyTorch's own two ranks: local statistics differ, synchronised ones do not.
                b0 = flat(load_safetensors(os.path.join(case_dir, "torch_buffers_rank0.safetensors")), True)
                b1 = flat(load_safetensors(os.path.join(case_dir, "torch_buffers_rank1.safetensors")), True)
                demo.append((name, "torch rank 0 vs rank 1", rel(b1, b0),
                             bool(np.array_equal(b0, b1))))
            results = {}
            for device in ("cuda", "cpu"):
                run_spec = dict(spec, device=device, name=f"{name}-{device}",
                                output_checkpoint=os.path.join(case_dir, f"{device}.safetensors"))
                steps, _ = cluster.run(run_spec, os.path.join(case_dir, f"{device}.json"))
                results[device] = (steps, load_safetensors(run_spec["output_checkpoint"]))
            for label, (steps, ours), (ref_steps, ref) in (
                    ("cuda vs torch", results["cuda"], (torch_steps, torch_tensors)),
                    ("cpu vs torch", results["cpu"], (torch_steps, torch_tensors)),
                    ("cpu vs cuda", results["cpu"], results["cuda"])):
                samples = case["micro_batch_size"] * case["accumulation_steps"] * 2
                problems, worst_loss = compare_steps(steps, ref_steps, LOSS_TOL[precision],
                                                     2.0 / samples, 2.0 / case["eval_rows"])
                param_err = rel(flat(ours), flat(ref))
                if param_err > PARAM_TOL[precision]:
                    problems.append(f"parameters differ by {param_err:.3g}")
                stats_err = float("nan")
                if len(flat(ref, True)):
                    stats_err = rel(flat(ours, True), flat(ref, True))
                    if stats_err > PARAM_TOL[precision]:
                        problems.append(f"running statistics differ by {stats_err:.3g}")
                if sorted(ours) != sorted(ref):
                    problems.append("tensor names differ")
                ok = not problems
                failures += 0 if ok else 1
                rows.append((name, precision, label, len(steps), sum(s["skipped"] for s in steps),
                             worst_loss, param_err, stats_err, rel(flat(ref), init),
                             "ok" if ok else "FAIL: " + "; ".join(problems[:3])))
    finally:
        cluster.close()
    print("\nPer-step loss / scale / skipped, rank 0's running statistics and final parameters "
          "(relative L2):")
    print(f"{'case':<16}{'prec':<6}{'comparison':<15}{'steps':>6}{'skipped':>8}"
          f"{'max loss diff':>15}{'param diff':>12}{'stats diff':>12}{'param change':>14}  result")
    for r in rows:
        print(f"{r[0]:<16}{r[1]:<6}{r[2]:<15}{r[3]:>6}{r[4]:>8}{r[5]:>15.3e}{r[6]:>12.3e}"
              f"{r[7]:>12.3e}{r[8]:>14.3e}  {r[9]}")
    print(f"tolerances: loss {LOSS_TOL}, parameters and statistics {PARAM_TOL}")
    print("\nRunning statistics across PyTorch's two ranks at the end (different data per rank):")
    for name, label, diff, identical in demo:
        print(f"  {name:<16}{label:<24} relative L2 {diff:.3e}  identical: {identical}")
    expected = {"sync_bn_fp16": True, "local_bn_fp16": False}
    for name, _, _, identical in demo:
        if name in expected and identical != expected[name]:
            print(f"FAIL: {name}: identical={identical}, expected {expected[name]}")
            failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
