"""The GradScaler trajectory in CI, on the CPU: fp16 jobs through our coordinator and two CPU
workers against a small, independent model of torch.cuda.amp.GradScaler (PyTorch's GradScaler
runs on CUDA only, so cpu_parity.py has no fp16 case). Overflows are forced by the data: rows
with a value beyond fp16's range (1e5, or NaN) at chosen (rank, step, micro-batch) places make
that step's gradients non-finite once autocast casts the inputs to fp16, on one rank only
(the allreduce must carry it to the other). Checked per step, exactly: the loss scale used and
whether the step was skipped; and the loss, the gradient norm (non-finite on both sides on an
overflowed step) and the final parameters against the model's float64 training within a
tolerance for fp16's rounding.

The model (ScalerModel, Float64Mlp) does what GradScaler and SGD do, written from their
definitions: found_inf is an inf/NaN in the unscaled gradients; on it the scale is multiplied by
backoff_factor, the growth tracker reset and the optimizer step skipped (momentum untouched);
otherwise the tracker counts, and at growth_interval clean steps in a row the scale is
multiplied by growth_factor and the tracker reset. Every clean step of a case is also checked
to be far from fp16's range (scaled gradients and activations below 65504 / 16): there only the
poisoned rows can overflow, so an exact comparison is sound.

  /usr/bin/python3 parity/grad_scaler_check.py --bin DIR --out DIR [--cases a,b]
"""
import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Cluster, flat, load_safetensors, rel, write_inputs  # noqa: E402

FP16_MAX = 65504.0
WORLD = 2
LOSS_TOL = 1e-2       # fp16 GEMM inputs (2^-11 relative) against float64.
GRAD_NORM_TOL = 2e-2
PARAM_TOL = 0.05      # Of the distance training moved the parameters.

CASES = {
    # Default factors, growth every 3 clean steps; single, repeated and two-rank overflows,
    # poisoned by 1e5 (inf in fp16) on one rank at a time.
    "scaler_default_factors": dict(
        model={"input_dim": 16, "hidden_dims": [32], "output_dim": 4, "activation": "relu"},
        micro_batch_size=8, accumulation_steps=2, steps=24, precision="fp16",
        optimizer={"lr": 0.05, "momentum": 0.9},
        loss_scaler={"init_scale": 256.0, "growth_interval": 3},
        poison=[(0, 5, 0), (1, 6, 1), (0, 13, 0), (1, 14, 0), (0, 15, 1), (0, 20, 0),
                (1, 20, 1)], poison_value=1e5),
    # Other factors (x4 growth every 2 clean steps, x0.25 backoff), poisoned by a huge target
    # (1e9, finite: data files must hold finite values): the scaled fp16 output gradient
    # overflows while the forward stays in range.
    "scaler_other_factors_output_grad": dict(
        model={"input_dim": 16, "hidden_dims": [32], "output_dim": 4, "activation": "relu"},
        micro_batch_size=8, accumulation_steps=2, steps=20, precision="fp16",
        optimizer={"lr": 0.05, "momentum": 0.9},
        loss_scaler={"init_scale": 4.0, "growth_factor": 4.0, "backoff_factor": 0.25,
                     "growth_interval": 2},
        poison=[(1, 3, 0), (0, 4, 1), (1, 9, 0), (0, 16, 0)], poison_value=1e9,
        poison_targets=True),
}


class ScalerModel:
    """torch.cuda.amp.GradScaler's scale and growth tracker, from its definition."""

    def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000):
        self.scale, self.tracker = float(init_scale), 0
        self.growth, self.backoff, self.interval = growth_factor, backoff_factor, growth_interval

    def update(self, found_inf):
        if found_inf:
            self.scale *= self.backoff
            self.tracker = 0
        else:
            self.tracker += 1
            if self.tracker == self.interval:
                self.scale *= self.growth
                self.tracker = 0


def to_fp16(values):
    """autocast's cast of a GEMM input: round to fp16 (beyond its range: inf)."""
    with np.errstate(over="ignore"):
        return values.astype(np.float16).astype(np.float64)


class Float64Mlp:
    """Linear -> ReLU -> ... -> Linear with MSE and SGD (momentum), in float64."""

    def __init__(self, tensors, layers, lr, momentum):
        self.w = [tensors[f"layers.{i}.weight"].astype(np.float64) for i in range(layers)]
        self.b = [tensors[f"layers.{i}.bias"].astype(np.float64) for i in range(layers)]
        self.lr, self.momentum, self.buffers = lr, momentum, None

    def loss_and_grads(self, x, y, seed=1.0):
        """The micro-batch's mean squared error, its gradients and the largest magnitude of
        any activation and (unscaled) gradient the fp16 path holds."""
        with np.errstate(all="ignore"):
            inputs, pre = [to_fp16(x)], []
            h = inputs[0]
            for i in range(len(self.w)):
                z = h @ self.w[i].T + self.b[i]
                pre.append(z)
                if i < len(self.w) - 1:
                    h = np.maximum(z, 0.0)
                    h[np.isnan(z)] = np.nan
                    inputs.append(h)
            out = pre[-1]
            loss = float(np.mean((out - y) ** 2))
            d = 2.0 * (out - y) / out.size
            # The backward is seeded in fp16 with d * scale / accumulation (GradScaler's
            # scaled loss): beyond fp16's range it is inf, and so is every gradient.
            if not np.all(np.isfinite(to_fp16(d * seed))):
                d = d * np.inf
            gw, gb, largest_grad = [None] * len(self.w), [None] * len(self.w), 0.0
            for i in reversed(range(len(self.w))):
                gw[i] = d.T @ inputs[i]
                gb[i] = d.sum(axis=0)
                largest_grad = max(largest_grad, np.max(np.abs(d)), np.max(np.abs(gw[i])))
                if i > 0:
                    d = (d @ self.w[i]) * (pre[i - 1] > 0)
            largest_activation = max(np.max(np.abs(z)) for z in pre)
        return loss, gw, gb, largest_activation, largest_grad

    def step(self, gw, gb):
        grads = gw + gb
        if self.buffers is None:
            self.buffers = [g.copy() for g in grads]
        else:
            self.buffers = [self.momentum * m + g for m, g in zip(self.buffers, grads)]
        params = self.w + self.b
        for p, m in zip(params, self.buffers):
            p -= self.lr * m

    def flat(self):
        layers = len(self.w)
        tensors = {f"layers.{i}.weight": self.w[i] for i in range(layers)}
        tensors.update({f"layers.{i}.bias": self.b[i] for i in range(layers)})
        return np.concatenate([tensors[k].ravel() for k in sorted(tensors)])


def model_run(case, features, targets, init):
    """The case's steps as the model sees them: [{loss, loss_scale, skipped, grad_norm}] and
    the final parameters (flat, in name order)."""
    mb, accumulation = case["micro_batch_size"], case["accumulation_steps"]
    rows_per_rank = len(features) // WORLD
    mlp = Float64Mlp(init, len(case["model"]["hidden_dims"]) + 1, case["optimizer"]["lr"],
                     case["optimizer"].get("momentum", 0.0))
    scaler = ScalerModel(**case["loss_scaler"])
    steps = []
    for step in range(1, case["steps"] + 1):
        losses, grads, largest = [], [], (0.0, 0.0)
        for rank in range(WORLD):
            for micro in range(accumulation):
                first = rank * rows_per_rank + ((step - 1) * accumulation + micro) * mb
                loss, gw, gb, act, grad = mlp.loss_and_grads(
                    features[first:first + mb], targets[first:first + mb],
                    seed=scaler.scale / accumulation)
                losses.append(loss)
                grads.append(gw + gb)
                largest = (max(largest[0], act), max(largest[1], grad))
        # DDP's average over ranks of each rank's sum over micro-batches of loss / accumulation.
        with np.errstate(all="ignore"):
            mean = [sum(g[i] for g in grads) / len(grads) for i in range(len(grads[0]))]
            grad_norm = float(np.sqrt(sum(np.sum(g * g) for g in mean)))
        found_inf = not all(np.all(np.isfinite(g)) for g in mean)
        if not found_inf and max(largest[0], scaler.scale * largest[1]) > FP16_MAX / 16:
            raise ValueError(f"step {step} is too close to fp16's range ({largest}, scale "
                             f"{scaler.scale}): the case cannot tell a forced overflow apart")
        steps.append({"step": step, "loss": float(np.mean(losses)),
                      "loss_scale": scaler.scale, "skipped": found_inf,
                      "grad_norm": grad_norm})
        layers = len(mlp.w)
        if not found_inf:
            mlp.step(mean[:layers], mean[layers:])
        scaler.update(found_inf)
    return steps, mlp.flat()


def poison(case, case_dir):
    """Writes the case's overflow-forcing values into features.npy (or targets.npy); returns
    features, targets."""
    name = "targets.npy" if case.get("poison_targets") else "features.npy"
    path = os.path.join(case_dir, name)
    values = np.load(path)
    mb, accumulation = case["micro_batch_size"], case["accumulation_steps"]
    rows_per_rank = len(values) // WORLD
    for rank, step, micro in case["poison"]:
        row = rank * rows_per_rank + ((step - 1) * accumulation + micro) * mb + 3
        values[row, 1] = case["poison_value"]
    np.save(path, values)
    return (np.load(os.path.join(case_dir, "features.npy")).astype(np.float64),
            np.load(os.path.join(case_dir, "targets.npy")).astype(np.float64))


def both_non_finite_or_close(a, b, tol):
    if a is None:
        return False
    if not math.isfinite(b) or not math.isfinite(a):
        return not math.isfinite(a) and not math.isfinite(b)
    return abs(a - b) <= tol * max(abs(b), 1e-30)


def compare(ours, model):
    """Problems of our steps against the model's: scale and skipped exact, loss and grad norm
    within their tolerances (non-finite on both sides, or neither)."""
    problems = []
    if len(ours) != len(model):
        return [f"{len(ours)} steps vs the model's {len(model)}"]
    for a, b in zip(ours, model):
        i = b["step"]
        if a["loss_scale"] != b["loss_scale"]:
            problems.append(f"step {i}: scale {a['loss_scale']} vs the model's {b['loss_scale']}")
        if a["skipped"] != b["skipped"]:
            problems.append(f"step {i}: skipped {a['skipped']} vs the model's {b['skipped']}")
        if not both_non_finite_or_close(a["loss"], b["loss"], LOSS_TOL):
            problems.append(f"step {i}: loss {a['loss']!r} vs the model's {b['loss']!r}")
        if not both_non_finite_or_close(a.get("grad_norm"), b["grad_norm"], GRAD_NORM_TOL):
            problems.append(f"step {i}: grad norm {a.get('grad_norm')!r} vs the model's "
                            f"{b['grad_norm']!r}")
    return problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    cluster = Cluster(args.bin, out, gpus=0, roots_dir=out)
    rows, failures = [], 0
    try:
        for name in args.cases.split(","):
            case = dict(CASES[name])
            case["rows_per_rank"] = case["steps"] * case["accumulation_steps"] * \
                case["micro_batch_size"]
            case_dir = os.path.join(out, name)
            os.makedirs(case_dir, exist_ok=True)
            spec = write_inputs(name, case, case_dir, device="cpu", world=WORLD)
            features, targets = poison(case, case_dir)
            init = load_safetensors(spec["init_checkpoint"])
            model_steps, model_final = model_run(case, features, targets, init)
            run_spec = dict(spec, output_checkpoint=os.path.join(case_dir, "ours.safetensors"))
            steps, _ = cluster.run(run_spec, os.path.join(case_dir, "ours.json"))
            final = flat(load_safetensors(run_spec["output_checkpoint"]))
            problems = compare(steps, model_steps)
            change = rel(model_final, flat(init))
            param_err = float(np.linalg.norm(final - model_final) /
                              max(np.linalg.norm(model_final - flat(init)), 1e-30))
            if not param_err <= PARAM_TOL:
                problems.append(f"final parameters {param_err:.3g} of the training's change "
                                f"from the model's (tolerance {PARAM_TOL})")
            skipped = sum(s["skipped"] for s in model_steps)
            if skipped == 0 or skipped == len(model_steps) or change < 1e-3:
                problems.append(f"the case proves nothing: {skipped} skipped steps, the "
                                f"parameters moved {change:.3g}")
            ok = not problems
            failures += 0 if ok else 1
            scales = " ".join(f"{math.log2(s['loss_scale']):g}" for s in steps)
            rows.append((name, len(steps), skipped, param_err, change, scales,
                         "ok" if ok else "FAIL: " + "; ".join(problems[:4])))
    finally:
        cluster.close()
    print("\nfp16 loss scale and skips against the GradScaler model (exact); loss, grad norm, "
          "parameters within fp16's rounding:")
    print(f"{'case':<26}{'steps':>6}{'skipped':>8}{'param diff':>12}{'param change':>14}  "
          "result / log2(scale) per step")
    for r in rows:
        print(f"{r[0]:<26}{r[1]:>6}{r[2]:>8}{r[3]:>12.3e}{r[4]:>14.3e}  {r[6]}\n"
              f"{'':<26}log2(scale): {r[5]}")
    print(f"{len(rows) - failures} passed, {failures} failed")
    return 1 if failures or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
