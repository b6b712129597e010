"""Proof against PyTorch: the same jobs through PyTorch DDP (torchrun) and through our
coordinator + worker daemons, on two GPUs, then on the CPU backend; compares per step the loss,
the loss scale and the skipped flag, and the final parameters.

  source device_bundle/env.sh   # on the GPU machine (2 GPUs)
  python3 parity/compare.py --out /tmp/parity

Tolerances. Both sides round at the same points (autocast: fp16/bf16 GEMM inputs and outputs,
fp32 accumulation, fp32 loss, fp32 master weights and optimizer). What differs is the order in
which GEMMs sum their products (cuBLAS picks different kernels for PyTorch's addmm/cublasLt and
for our cublasGemmEx; the CPU backend uses OpenBLAS), which can move a low-precision result by
one ulp: 2^-11 relative for fp16, 2^-8 for bf16. So: loss scale and skipped steps must be
identical (they are discrete decisions); per-step losses agree to LOSS_TOL and final parameters
to PARAM_TOL (relative L2 norm of the difference), per precision.
"""
import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import torch
from safetensors.torch import load_file, save_file

LOSS_TOL = {"fp16": 2e-3, "bf16": 1e-2, "fp32": 1e-5}
PARAM_TOL = {"fp16": 2e-3, "bf16": 1e-2, "fp32": 1e-5}

CASES = {
    # The original example: Linear 1024->16, one fixed batch of 64 per rank, 4 micro-batches,
    # 5 optimizer steps, SGD lr 0.01, fp16.
    "seed": dict(model={"input_dim": 1024, "hidden_dims": [], "output_dim": 16,
                        "activation": "relu"},
                 rows_per_rank=64, micro_batch_size=64, accumulation_steps=4, steps=5,
                 precision="fp16", optimizer={"lr": 0.01}),
    "mlp_fp16": dict(model={"input_dim": 512, "hidden_dims": [1024, 1024], "output_dim": 128,
                            "activation": "relu"},
                     rows_per_rank=2048, micro_batch_size=256, accumulation_steps=4, steps=20,
                     precision="fp16",
                     optimizer={"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4},
                     max_grad_norm=1.0),
    "mlp_bf16": dict(model={"input_dim": 512, "hidden_dims": [1024, 1024], "output_dim": 128,
                            "activation": "gelu"},
                     rows_per_rank=2048, micro_batch_size=256, accumulation_steps=4, steps=20,
                     precision="bf16",
                     optimizer={"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4}),
    # An initial scale so large that fp16 gradients overflow for the first steps: the skipped
    # steps and the whole scale trajectory (backoff, then growth every 10 clean steps) must be
    # PyTorch's.
    "overflow": dict(model={"input_dim": 256, "hidden_dims": [256], "output_dim": 16,
                            "activation": "relu"},
                     rows_per_rank=512, micro_batch_size=64, accumulation_steps=4, steps=40,
                     precision="fp16", optimizer={"lr": 0.01, "momentum": 0.9},
                     loss_scaler={"init_scale": 2.0 ** 40, "growth_interval": 10}),
}


def write_inputs(name, case, out_dir, world=2):
    rng = np.random.default_rng(sum(map(ord, name)))
    widths = [case["model"]["input_dim"], *case["model"]["hidden_dims"], case["model"]["output_dim"]]
    rows = case["rows_per_rank"] * world
    features = rng.standard_normal((rows, widths[0]), dtype=np.float32)
    targets = rng.standard_normal((rows, widths[-1]), dtype=np.float32)
    np.save(os.path.join(out_dir, "features.npy"), features)
    np.save(os.path.join(out_dir, "targets.npy"), targets)
    init = {}
    for i in range(len(widths) - 1):
        bound = 1.0 / math.sqrt(widths[i])
        init[f"layers.{i}.weight"] = torch.from_numpy(
            rng.uniform(-bound, bound, (widths[i + 1], widths[i])).astype(np.float32))
        init[f"layers.{i}.bias"] = torch.from_numpy(
            rng.uniform(-bound, bound, (widths[i + 1],)).astype(np.float32))
    save_file(init, os.path.join(out_dir, "init.safetensors"))
    spec = {
        "name": name, "world_size": world, "device": "cuda", "model": case["model"],
        "data": {"npy": {"features_path": os.path.join(out_dir, "features.npy"),
                         "targets_path": os.path.join(out_dir, "targets.npy")}},
        "micro_batch_size": case["micro_batch_size"],
        "accumulation_steps": case["accumulation_steps"], "steps": case["steps"],
        "precision": case["precision"], "optimizer": case["optimizer"],
        "max_grad_norm": case.get("max_grad_norm", 0.0),
        "init_checkpoint": os.path.join(out_dir, "init.safetensors"),
    }
    if "loss_scaler" in case:
        spec["loss_scaler"] = case["loss_scaler"]
    return spec


class Cluster:
    """A coordinator, one CUDA worker per GPU and two CPU workers, from the bundle."""

    def __init__(self, bin_dir, log_dir, gpus, roots_dir):
        self.bin_dir, self.log_dir, self.processes = bin_dir, log_dir, []
        port_file = os.path.join(log_dir, "port")
        self._spawn("coordinator", [f"{bin_dir}/coordinator", "--listen=127.0.0.1:0",
                                    f"--port_file={port_file}", f"--state_dir={log_dir}/state"])
        # The cases' files (data, weights, outputs) live under --out: the workers' roots.
        roots = [f"--data_root={roots_dir}", f"--output_root={roots_dir}"]
        for _ in range(200):
            if os.path.exists(port_file):
                break
            time.sleep(0.05)
        self.address = "127.0.0.1:" + open(port_file).read().strip()
        for gpu in range(gpus):
            self._spawn(f"gpu{gpu}", [f"{bin_dir}/worker", f"--coordinator={self.address}",
                                      "--device=cuda", "--slots=1", f"--name=gpu{gpu}",
                                      f"--work_dir={log_dir}/gpu{gpu}"] + roots,
                        env={"CUDA_VISIBLE_DEVICES": str(gpu)})
        for cpu in range(2):
            self._spawn(f"cpu{cpu}", [f"{bin_dir}/worker", f"--coordinator={self.address}",
                                      "--device=cpu", "--slots=1", f"--name=cpu{cpu}",
                                      f"--work_dir={log_dir}/cpu{cpu}"] + roots)
        time.sleep(1.0)

    def _spawn(self, name, argv, env=None):
        environment = dict(os.environ, **(env or {}))
        log = open(os.path.join(self.log_dir, name + ".log"), "w")
        self.processes.append(subprocess.Popen(argv, stdout=log, stderr=log, env=environment))

    def run(self, spec, spec_path):
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        started = time.time()
        result = subprocess.run([f"{self.bin_dir}/trainctl", f"--coordinator={self.address}",
                                 "--output=json", "submit", spec_path, "--wait"],
                                capture_output=True, text=True)
        elapsed = time.time() - started
        steps, final_state = {}, None
        for line in result.stdout.splitlines():
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if "telemetry" in event:
                t = event["telemetry"]
                steps[int(t["step"])] = {"loss": float(t.get("loss", 0)),
                                         "loss_scale": float(t.get("loss_scale", 0)),
                                         "skipped": bool(t.get("skipped", False))}
            if "state_change" in event:
                final_state = event["state_change"]
        if result.returncode != 0:
            raise RuntimeError(f"{spec['name']} on {spec['device']} failed: {final_state}\n"
                               f"{result.stderr}")
        return [steps[s] for s in sorted(steps)], elapsed

    def close(self):
        for process in reversed(self.processes):
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def flat(tensors):
    keys = sorted(tensors)
    return torch.cat([tensors[k].flatten().double() for k in keys])


def rel(a, b):
    return (a - b).norm().item() / max(b.norm().item(), 1e-30)


def compare_steps(ours, reference, precision):
    problems, worst = [], 0.0
    if len(ours) != len(reference):
        return [f"{len(ours)} steps vs {len(reference)}"], math.inf
    for i, (a, b) in enumerate(zip(ours, reference), start=1):
        if a["skipped"] != b["skipped"]:
            problems.append(f"step {i}: skipped {a['skipped']} vs {b['skipped']}")
        if a["loss_scale"] != b["loss_scale"]:
            problems.append(f"step {i}: scale {a['loss_scale']} vs {b['loss_scale']}")
        if math.isfinite(b["loss"]):
            diff = abs(a["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-30)
            worst = max(worst, diff)
            if diff > LOSS_TOL[precision]:
                problems.append(f"step {i}: loss {a['loss']:.8g} vs {b['loss']:.8g}")
    return problems, worst


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.environ.get("MPTRAIN_BIN", "device_bundle/bin"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    gpus = torch.cuda.device_count()
    if gpus < 2:
        print(f"compare.py needs 2 GPUs, found {gpus}")
        return 2
    here = os.path.dirname(os.path.abspath(__file__))
    cluster = Cluster(args.bin, args.out, gpus=2, roots_dir=os.path.abspath(args.out))
    rows, failures = [], 0
    try:
        for name in args.cases.split(","):
            case = CASES[name]
            case_dir = os.path.join(args.out, name)
            os.makedirs(case_dir, exist_ok=True)
            spec = write_inputs(name, case, case_dir)
            with open(os.path.join(case_dir, "case.json"), "w") as f:
                json.dump({"spec": spec}, f)
            torchrun = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc_per_node=2", os.path.join(here, "pytorch_reference.py"),
                 "--case", os.path.join(case_dir, "case.json"), "--out", case_dir],
                capture_output=True, text=True)
            if torchrun.returncode != 0:
                print(torchrun.stdout[-3000:], torchrun.stderr[-3000:])
                raise RuntimeError(f"torchrun failed for {name}")
            torch_steps = json.load(open(os.path.join(case_dir, "torch_steps.json")))
            torch_final = flat(load_file(os.path.join(case_dir, "torch_final.safetensors")))
            init = flat(load_file(spec["init_checkpoint"]))
            results = {}
            for device in ("cuda", "cpu"):
                run_spec = dict(spec, device=device, name=f"{name}-{device}",
                                output_checkpoint=os.path.join(case_dir, f"{device}.safetensors"))
                steps, elapsed = cluster.run(run_spec, os.path.join(case_dir, f"{device}.json"))
                final = flat(load_file(run_spec["output_checkpoint"]))
                results[device] = (steps, final)
            precision = case["precision"]
            for label, (steps, final), (ref_steps, ref_final) in (
                    ("cuda vs torch", results["cuda"], (torch_steps, torch_final)),
                    ("cpu vs torch", results["cpu"], (torch_steps, torch_final)),
                    ("cpu vs cuda", results["cpu"], results["cuda"])):
                problems, worst_loss = compare_steps(steps, ref_steps, precision)
                param_err = rel(final, ref_final)
                if param_err > PARAM_TOL[precision]:
                    problems.append(f"parameters differ by {param_err:.3g}")
                skipped = sum(s["skipped"] for s in steps)
                ok = not problems
                failures += 0 if ok else 1
                rows.append((name, precision, label, len(steps), skipped, worst_loss, param_err,
                             rel(ref_final, init), "ok" if ok else "FAIL: " + "; ".join(problems[:3])))
            scales = [s["loss_scale"] for s in torch_steps]
            print(f"{name}: torch scale trajectory {scales[:12]}{' ...' if len(scales) > 12 else ''}")
    finally:
        cluster.close()
    header = ("case", "prec", "comparison", "steps", "skipped", "max loss rel diff",
              "param rel diff", "param change", "result")
    print("\nPer-step loss / scale / skipped and final parameters (relative L2):")
    print(f"{header[0]:<10}{header[1]:<6}{header[2]:<15}{header[3]:>6}{header[4]:>8}"
          f"{header[5]:>19}{header[6]:>16}{header[7]:>14}  {header[8]}")
    for r in rows:
        print(f"{r[0]:<10}{r[1]:<6}{r[2]:<15}{r[3]:>6}{r[4]:>8}{r[5]:>19.3e}{r[6]:>16.3e}"
              f"{r[7]:>14.3e}  {r[8]}")
    print(f"tolerances: loss {LOSS_TOL}, parameters {PARAM_TOL}; scale and skipped exact")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
