"""What the proofs against PyTorch share: case inputs (npy data, safetensors weights), a local
cluster of our binaries, and the comparison of per-step telemetry and final parameters.

Used by compare.py (2 GPUs, PyTorch 2.x, torchrun) and cpu_parity.py (CI: Debian's PyTorch 1.13
on the CPU, DDP over gloo with ranks started by hand). Needs numpy; torch only where noted.
"""
import json
import math
import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np

# ---------------------------------------------------------------------------------------------
# safetensors, float32 only (Debian has no python3-safetensors; the GPU machine may).


def save_safetensors(tensors, path):
    """tensors: name -> numpy float32 array."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name], dtype="<f4")
        blob = array.tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def load_safetensors(path):
    """name -> numpy float32 array (F32 tensors only)."""
    with open(path, "rb") as f:
        data = f.read()
    length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + length])
    base = 8 + length
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {info['dtype']}, only F32 is read")
        begin, end = info["data_offsets"]
        tensors[name] = np.frombuffer(data[base + begin:base + end], dtype="<f4").reshape(
            info["shape"]).copy()
    return tensors


# ---------------------------------------------------------------------------------------------
# Case inputs.


def widths_of(model):
    return [model["input_dim"], *model.get("hidden_dims", []), model["output_dim"]]


def write_inputs(name, case, out_dir, device, world=2):
    """Writes features.npy, targets.npy (float32, or int64/int32 class ids for cross_entropy) and
    init.safetensors (torch.nn.Linear's distribution), and returns the job spec (a dict)."""
    rng = np.random.default_rng(sum(map(ord, name)))
    widths = widths_of(case["model"])
    classification = case.get("loss", "mse") == "cross_entropy"
    # Learnable labels: the class of a fixed random linear map, with some noise.
    projection = rng.standard_normal((widths[0], widths[-1])).astype(np.float32)

    def draw(rows, prefix):
        features = rng.standard_normal((rows, widths[0]), dtype=np.float32)
        if classification:
            logits = features @ projection + 0.5 * rng.standard_normal((rows, widths[-1]))
            # int64 class ids as torch uses them, or int32 (case "int32_targets") as npy allows.
            targets = np.argmax(logits, axis=1).astype(
                np.int32 if case.get("int32_targets") else np.int64)
        else:
            targets = rng.standard_normal((rows, widths[-1]), dtype=np.float32)
        np.save(os.path.join(out_dir, prefix + "features.npy"), features)
        np.save(os.path.join(out_dir, prefix + "targets.npy"), targets)

    # An odd row count when shuffling: the sampler pads, epochs end inside micro-batches.
    draw(case.get("rows", case["rows_per_rank"] * world), "")
    if case.get("shift_rank1"):
        # Different data per rank: rank 1's contiguous shard scaled and shifted, so that its
        # batch statistics are far from rank 0's.
        path = os.path.join(out_dir, "features.npy")
        features = np.load(path)
        features[case["rows_per_rank"]:] = 2.0 * features[case["rows_per_rank"]:] + 1.5
        np.save(path, features)
    if "eval_rows" in case:
        draw(case["eval_rows"], "eval_")
    init = {}
    for i in range(len(widths) - 1):
        bound = 1.0 / math.sqrt(widths[i])
        init[f"layers.{i}.weight"] = rng.uniform(
            -bound, bound, (widths[i + 1], widths[i])).astype(np.float32)
        init[f"layers.{i}.bias"] = rng.uniform(-bound, bound, (widths[i + 1],)).astype(np.float32)
    if case["model"].get("norm", "none").lower() != "none":
        # Affine parameters away from torch's 1 and 0, so that their use is tested too (drawn
        # after everything else: the cases without norms keep their inputs).
        for i in range(len(widths) - 2):
            init[f"norms.{i}.weight"] = (1.0 + 0.2 * rng.standard_normal(widths[i + 1])).astype(
                np.float32)
            init[f"norms.{i}.bias"] = (0.2 * rng.standard_normal(widths[i + 1])).astype(np.float32)
    save_safetensors(init, os.path.join(out_dir, "init.safetensors"))
    spec = {
        "name": name, "world_size": world, "device": device, "model": case["model"],
        "data": {"npy": {"features_path": os.path.join(out_dir, "features.npy"),
                         "targets_path": os.path.join(out_dir, "targets.npy")}},
        "micro_batch_size": case["micro_batch_size"],
        "accumulation_steps": case["accumulation_steps"], "steps": case["steps"],
        "precision": case["precision"], "optimizer": case["optimizer"],
        "max_grad_norm": case.get("max_grad_norm", 0.0),
        "init_checkpoint": os.path.join(out_dir, "init.safetensors"),
    }
    for key in ("loss", "label_smoothing", "lr_schedule", "loss_scaler", "eval_every",
                "grad_comm_dtype"):
        if key in case:
            spec[key] = case[key]
    if case.get("shuffle"):
        spec["data"]["npy"].update(shuffle=True, shuffle_seed=case.get("shuffle_seed", 0))
    if "eval_rows" in case:
        spec["eval_data"] = {"features_path": os.path.join(out_dir, "eval_features.npy"),
                             "targets_path": os.path.join(out_dir, "eval_targets.npy")}
    return spec


# ---------------------------------------------------------------------------------------------
# Our side: a coordinator and workers from built binaries.


class Cluster:
    """A coordinator, one CUDA worker per GPU and `cpu_workers` CPU workers."""

    def __init__(self, bin_dir, log_dir, gpus, roots_dir, cpu_workers=2):
        self.bin_dir, self.log_dir, self.processes = bin_dir, log_dir, []
        port_file = os.path.join(log_dir, "port")
        self._spawn("coordinator", [f"{bin_dir}/coordinator", "--listen=127.0.0.1:0",
                                    f"--port_file={port_file}", f"--state_dir={log_dir}/state"])
        # The cases' files (data, weights, outputs) live under roots_dir: the workers' roots.
        roots = [f"--data_root={roots_dir}", f"--output_root={roots_dir}"]
        for _ in range(400):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            time.sleep(0.05)
        self.address = "127.0.0.1:" + open(port_file).read().strip()
        for gpu in range(gpus):
            self._spawn(f"gpu{gpu}", [f"{bin_dir}/worker", f"--coordinator={self.address}",
                                      "--device=cuda", "--slots=1", f"--name=gpu{gpu}",
                                      f"--work_dir={log_dir}/gpu{gpu}"] + roots,
                        env={"CUDA_VISIBLE_DEVICES": str(gpu)})
        for cpu in range(cpu_workers):
            self._spawn(f"cpu{cpu}", [f"{bin_dir}/worker", f"--coordinator={self.address}",
                                      "--device=cpu", "--slots=1", f"--name=cpu{cpu}",
                                      f"--work_dir={log_dir}/cpu{cpu}"] + roots)
        time.sleep(1.0)

    def _spawn(self, name, argv, env=None):
        environment = dict(os.environ, **(env or {}))
        log = open(os.path.join(self.log_dir, name + ".log"), "w")
        self.processes.append(subprocess.Popen(argv, stdout=log, stderr=log, env=environment))

    def run(self, spec, spec_path, timeout=600):
        """Submits and waits; returns the per-step telemetry (a list, step order) and seconds."""
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        started = time.time()
        result = subprocess.run([f"{self.bin_dir}/trainctl", f"--coordinator={self.address}",
                                 "--output=json", "submit", spec_path, "--wait"],
                                capture_output=True, text=True, timeout=timeout)
        elapsed = time.time() - started
        steps, final_state = {}, None
        for line in result.stdout.splitlines():
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if "telemetry" in event:
                t = event["telemetry"]
                steps[int(t["step"])] = {
                    "step": int(t["step"]),
                    "loss": float(t.get("loss", 0)),
                    "grad_norm": float(t["grad_norm"]) if "grad_norm" in t else None,
                    "loss_scale": float(t.get("loss_scale", 0)),
                    "skipped": bool(t.get("skipped", False)),
                    "lr": float(t.get("lr", 0)),
                    # proto3 JSON: "Infinity" / "NaN" on an overflowed step, absent when 0.
                    "grad_norm": float(t.get("grad_norm", 0)),
                    "accuracy": float(t["accuracy"]) if "accuracy" in t else None,
                    "eval_loss": float(t["eval_loss"]) if "eval_loss" in t else None,
                    "eval_accuracy": float(t["eval_accuracy"]) if "eval_accuracy" in t else None}
            if "state_change" in event:
                final_state = event["state_change"]
        if result.returncode != 0:
            raise RuntimeError(f"{spec['name']} on {spec['device']} failed: {final_state}\n"
                               f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
        return [steps[s] for s in sorted(steps)], elapsed

    def close(self):
        for process in reversed(self.processes):
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


# ---------------------------------------------------------------------------------------------
# Comparison.


def is_buffer(name):
    """Batch norms' running statistics (norms.{i}.running_mean / running_var /
    num_batches_tracked), as opposed to parameters."""
    return ".running_" in name or name.endswith(".num_batches_tracked")


def flat(tensors, buffers=False):
    """The parameters (or, with buffers=True, the running statistics) in name order."""
    keys = [k for k in sorted(tensors) if is_buffer(k) == buffers]
    if not keys:
        return np.zeros(0)
    return np.concatenate([np.asarray(tensors[k], dtype=np.float64).ravel() for k in keys])


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def close_or_both_non_finite(a, b, tol):
    """(agree, relative difference): a within tol of b (relative), or both inf/NaN (an
    overflowed step's gradient norm, a diverged loss). One finite and one not never agree."""
    if a is None or not math.isfinite(a) or not math.isfinite(b):
        both = a is not None and not math.isfinite(a) and not math.isfinite(b)
        return both, 0.0 if both else math.inf
    diff = abs(a - b) / max(abs(b), 1e-30)
    return diff <= tol, diff


def compare_steps(ours, reference, loss_tol, accuracy_tol=0.0, eval_accuracy_tol=0.0,
                  grad_norm_tol=None):
    """Loss and eval loss within loss_tol (relative; a non-finite reference loss must be
    non-finite in ours too); loss scale, skipped and lr exactly; accuracy and eval accuracy
    within accuracy_tol / eval_accuracy_tol (0: exactly); with grad_norm_tol, the gradient norm
    (unscaled, before clipping) within it, or non-finite on both sides (an overflowed step),
    wherever the reference has one. Returns (problems, worst relative loss difference)."""
    problems, worst = [], 0.0
    if len(ours) != len(reference):
        return [f"{len(ours)} steps vs {len(reference)}"], math.inf
    for i, (a, b) in enumerate(zip(ours, reference), start=1):
        if a["skipped"] != b["skipped"]:
            problems.append(f"step {i}: skipped {a['skipped']} vs {b['skipped']}")
        if a["loss_scale"] != b["loss_scale"]:
            problems.append(f"step {i}: scale {a['loss_scale']} vs {b['loss_scale']}")
        if "lr" in b and a.get("lr") != b["lr"]:
            problems.append(f"step {i}: lr {a.get('lr')!r} vs {b['lr']!r}")
        if b.get("accuracy") is not None and (
                a.get("accuracy") is None or abs(a["accuracy"] - b["accuracy"]) > accuracy_tol):
            problems.append(f"step {i}: accuracy {a.get('accuracy')} vs {b['accuracy']}")
        if b.get("eval_loss") is not None:
            if a.get("eval_loss") is None:
                problems.append(f"step {i}: no evaluation")
            elif abs(a["eval_loss"] - b["eval_loss"]) > loss_tol * abs(b["eval_loss"]):
                problems.append(f"step {i}: eval loss {a['eval_loss']:.9g} vs {b['eval_loss']:.9g}")
        if b.get("eval_accuracy") is not None and (
                a.get("eval_accuracy") is None or
                abs(a["eval_accuracy"] - b["eval_accuracy"]) > eval_accuracy_tol):
            problems.append(f"step {i}: eval accuracy {a.get('eval_accuracy')} vs "
                            f"{b['eval_accuracy']}")
        agree, diff = close_or_both_non_finite(a["loss"], b["loss"], loss_tol)
        worst = max(worst, diff)
        if not agree:
            problems.append(f"step {i}: loss {a['loss']:.9g} vs {b['loss']:.9g}")
        if grad_norm_tol is not None and b.get("grad_norm") is not None:
            agree, _ = close_or_both_non_finite(a.get("grad_norm"), b["grad_norm"],
                                                grad_norm_tol)
            if not agree:
                problems.append(f"step {i}: grad norm {a.get('grad_norm')!r} vs "
                                f"{b['grad_norm']!r}")
    return problems, worst


def run_torchrun(case_dir, world=2):
    """parity/pytorch_reference.py on `world` GPUs (torchrun, NCCL) for <case_dir>/case.json;
    its torch_steps.json and torch_final.safetensors land in case_dir."""
    here = os.path.dirname(os.path.abspath(__file__))
    torchrun = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc_per_node={world}", os.path.join(here, "pytorch_reference.py"), "--case",
         os.path.join(case_dir, "case.json"), "--out", case_dir],
        capture_output=True, text=True)
    if torchrun.returncode != 0:
        print(torchrun.stdout[-3000:], torchrun.stderr[-3000:])
        raise RuntimeError(f"torchrun failed in {case_dir}")


def run_gpu_reference(name, case, out_dir, world=2):
    """A case's inputs in <out_dir>/<name> and PyTorch's run of it on `world` GPUs
    (run_torchrun): returns (case_dir, spec, torch_steps)."""
    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    spec = write_inputs(name, case, case_dir, device="cuda", world=world)
    with open(os.path.join(case_dir, "case.json"), "w") as f:
        json.dump({"spec": spec}, f)
    run_torchrun(case_dir, world)
    with open(os.path.join(case_dir, "torch_steps.json")) as f:
        return case_dir, spec, json.load(f)
