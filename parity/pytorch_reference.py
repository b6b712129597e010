"""The training loop in PyTorch: DDP + autocast + GradScaler + no_sync, with the job spec's
loss (mse, cross_entropy with label_smoothing), gradient communication (fp32, or DDP's fp16/bf16
compress hook for grad_comm_dtype), optimizer (SGD with momentum/nesterov/weight
decay, Adam, AdamW), learning-rate schedule (LambdaLR / StepLR, stepped once per attempted
step), data (contiguous shards, or DistributedSampler epochs) and evaluation (eval_data).

Two ways to run it, one process per rank, env:// rendezvous:
  GPU (compare.py):     torchrun --nproc_per_node=2 pytorch_reference.py --case C --out D
                        (NCCL, torch.amp.GradScaler; PyTorch 2.x)
  CPU (cpu_parity.py):  RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p \
                        python3 pytorch_reference.py --case C --out D
                        (gloo; Debian's PyTorch 1.13, whose torchrun fails under Python 3.11;
                        CPU autocast is bf16 only, fp32 runs without autocast; its bf16
                        GEMMs accumulate in fp32 on every CPU: autocast_gemm.py)

model.norm (none | layer_norm | batch_norm | sync_batch_norm) puts torch.nn.LayerNorm,
BatchNorm1d or SyncBatchNorm (CUDA only) after each hidden Linear, before its activation; DDP
keeps its default broadcast_buffers=True; evaluation runs the module in eval mode.

Reads a case file (the job spec as JSON; its data and checkpoint paths) and writes from rank 0:
  <out>/torch_steps.json        per optimizer step: loss, loss_scale, skipped, lr, accuracy,
                                eval_loss and eval_accuracy on evaluation steps
  <out>/torch_final.safetensors final parameters (layers.{i}.weight / .bias, norms.{i}.weight /
                                .bias) and rank 0's running statistics (norms.{i}.running_mean /
                                .running_var / .num_batches_tracked), under our checkpoint names
  <out>/torch_buffers_rank{r}.safetensors  every rank's running statistics (batch norms)
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from autocast_gemm import Linear  # noqa: E402
from common import load_safetensors, save_safetensors  # noqa: E402


def bf16_compress_hook_gloo(process_group, bucket):
    """DDP's bf16_compress_hook for gloo, which has no bf16 allreduce (PyTorch 1.13 refuses the
    hook without NCCL): the same arithmetic, the bucket rounded to bf16 and divided by the world
    size in bf16, the ranks' values summed in bf16 in rank order (with two ranks exactly the one
    rounded addition of a ring allreduce), copied back into the fp32 bucket."""
    world = dist.get_world_size()
    compressed = bucket.buffer().to(torch.bfloat16).div_(world)
    gathered = [torch.empty_like(compressed, dtype=torch.float32) for _ in range(world)]
    dist.all_gather(gathered, compressed.float())  # bf16 values travel exactly as fp32.
    total = gathered[0].to(torch.bfloat16)
    for values in gathered[1:]:
        total = total + values.to(torch.bfloat16)
    buffer = bucket.buffer()
    buffer.copy_(total)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


NORMS = {"layer_norm": torch.nn.LayerNorm, "batch_norm": torch.nn.BatchNorm1d,
         "sync_batch_norm": torch.nn.SyncBatchNorm}


def build_model(model_spec):
    """nn.Sequential(Linear, [norm,] act, ..., Linear); returns it, its Linear layers and its
    norms (one per hidden Linear, or none)."""
    widths = [model_spec["input_dim"], *model_spec.get("hidden_dims", []), model_spec["output_dim"]]
    activation = model_spec.get("activation", "relu").lower()
    norm = model_spec.get("norm", "none").lower()
    layers, norms = [], []
    for i in range(len(widths) - 1):
        layers.append(Linear(widths[i], widths[i + 1]))  # autocast_gemm: the bf16 recipe
        if i + 2 < len(widths):
            if norm != "none":
                norms.append(NORMS[norm](widths[i + 1]))  # eps 1e-5, momentum 0.1, affine
                layers.append(norms[-1])
            layers.append(torch.nn.ReLU() if activation == "relu" else torch.nn.GELU())
    return (torch.nn.Sequential(*layers), [l for l in layers if isinstance(l, torch.nn.Linear)],
            norms)


def norm_tensors(norms, buffers_only=False):
    """Our checkpoint names for the norms' tensors (README "Normalization layers")."""
    out = {}
    for i, norm in enumerate(norms):
        if not buffers_only:
            out[f"norms.{i}.weight"] = norm.weight.detach().float().cpu().numpy()
            out[f"norms.{i}.bias"] = norm.bias.detach().float().cpu().numpy()
        if getattr(norm, "running_mean", None) is not None:
            out[f"norms.{i}.running_mean"] = norm.running_mean.float().cpu().numpy()
            out[f"norms.{i}.running_var"] = norm.running_var.float().cpu().numpy()
            out[f"norms.{i}.num_batches_tracked"] = np.array(
                norm.num_batches_tracked.item(), dtype=np.float32)
    return out


def make_optimizer(parameters, spec):
    o = spec["optimizer"]
    kind = o.get("kind", "sgd").lower()
    if kind == "sgd":
        return torch.optim.SGD(parameters, lr=o["lr"], momentum=o.get("momentum", 0.0),
                               nesterov=o.get("nesterov", False),
                               weight_decay=o.get("weight_decay", 0.0), foreach=False)
    betas = (o.get("beta1", 0.9), o.get("beta2", 0.999))
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    # weight_decay defaults to 0 for every optimizer in a job spec (AdamW's own default is 1e-2).
    return cls(parameters, lr=o["lr"], betas=betas, eps=o.get("eps", 1e-8),
               weight_decay=o.get("weight_decay", 0.0), foreach=False)


def make_scheduler(optimizer, spec):
    """The same factors as trainer/optim/schedule.cc, operation for operation."""
    s = spec.get("lr_schedule", {})
    kind = s.get("kind", "constant").lower()
    total, base = spec["steps"], spec["optimizer"]["lr"]
    if kind in ("warmup_cosine", "warmup_linear"):
        warmup, ratio = s.get("warmup_steps", 0), s.get("min_lr", 0.0) / base

        def factor(t):
            if t < warmup:
                return t / warmup
            progress = (t - warmup) / max(1, total - warmup)
            shape = (0.5 * (1.0 + math.cos(math.pi * progress)) if kind == "warmup_cosine"
                     else 1.0 - progress)
            return ratio + (1.0 - ratio) * shape
        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    if kind == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=s["step_size"],
                                               gamma=s["gamma"])
    return None


def make_scaler(cuda, spec):
    precision = spec.get("precision", "fp16").lower()
    s = spec.get("loss_scaler", {})
    enabled = s.get("enabled", precision == "fp16")
    if enabled and not cuda:
        raise SystemExit("GradScaler runs on CUDA only")
    kwargs = dict(init_scale=s.get("init_scale", 65536.0), growth_factor=s.get("growth_factor", 2.0),
                  backoff_factor=s.get("backoff_factor", 0.5),
                  growth_interval=s.get("growth_interval", 2000), enabled=enabled)
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", **kwargs), enabled
    return torch.cuda.amp.GradScaler(**kwargs), enabled


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.case) as f:
        case = json.load(f)
    spec = case["spec"]
    cuda = spec.get("device", "cuda").lower() == "cuda"

    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        # Pure fp32 GEMMs for the fp32 case, as our backend does.
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)

    model, linears, norms = build_model(spec["model"])
    init = load_safetensors(spec["init_checkpoint"])
    with torch.no_grad():
        for i, linear in enumerate(linears):
            linear.weight.copy_(torch.from_numpy(init[f"layers.{i}.weight"]))
            linear.bias.copy_(torch.from_numpy(init[f"layers.{i}.bias"]))
        for i, norm in enumerate(norms):
            if f"norms.{i}.weight" in init:
                norm.weight.copy_(torch.from_numpy(init[f"norms.{i}.weight"]))
                norm.bias.copy_(torch.from_numpy(init[f"norms.{i}.bias"]))
    model = DDP(model.to(device), device_ids=[device.index] if cuda else None)
    comm_dtype = spec.get("grad_comm_dtype", "fp32").lower()
    if comm_dtype == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif comm_dtype == "bf16":
        model.register_comm_hook(
            None, default_hooks.bf16_compress_hook if cuda else bf16_compress_hook_gloo)

    classification = spec.get("loss", "mse").lower() == "cross_entropy"
    precision = spec.get("precision", "fp16").lower()
    autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    if autocast_dtype is not None:
        autocast = lambda: torch.autocast("cuda" if cuda else "cpu", dtype=autocast_dtype)
    else:
        autocast = contextlib.nullcontext
    smoothing = spec.get("label_smoothing", 0.0)
    features = np.load(spec["data"]["npy"]["features_path"])
    targets = np.load(spec["data"]["npy"]["targets_path"])
    if classification:
        targets = targets.reshape(-1).astype(np.int64)
    n = features.shape[0]
    batch = spec["micro_batch_size"]
    accumulation = spec["accumulation_steps"]
    npy = spec["data"]["npy"]
    if npy.get("shuffle", False):
        # DistributedSampler itself, epoch after epoch; micro-batches take the next rows.
        data_x = torch.from_numpy(features).to(device)
        data_y = torch.from_numpy(targets).to(device)
        sampler = torch.utils.data.DistributedSampler(
            list(range(n)), num_replicas=world, rank=rank, shuffle=True,
            seed=npy.get("shuffle_seed", 0), drop_last=False)

        def stream():
            epoch = 0
            while True:
                sampler.set_epoch(epoch)
                yield from iter(sampler)
                epoch += 1
        rows_of = stream()

        def next_batch():
            rows = [next(rows_of) for _ in range(batch)]
            return data_x[rows], data_y[rows]
    else:
        first, last = rank * n // world, (rank + 1) * n // world
        shard_x = torch.from_numpy(features[first:last]).to(device)
        shard_y = torch.from_numpy(targets[first:last]).to(device)
        cursor = [0]

        def next_batch():
            rows = [(cursor[0] + r) % shard_x.shape[0] for r in range(batch)]
            cursor[0] = (cursor[0] + batch) % shard_x.shape[0]
            return shard_x[rows], shard_y[rows]

    evaluate = None
    if "eval_data" in spec:
        eval_x = np.load(spec["eval_data"]["features_path"])
        eval_y = np.load(spec["eval_data"]["targets_path"])
        if classification:
            eval_y = eval_y.reshape(-1).astype(np.int64)
        eval_n = eval_x.shape[0]
        first, last = rank * eval_n // world, (rank + 1) * eval_n // world
        eval_x = torch.from_numpy(eval_x[first:last]).to(device)
        eval_y = torch.from_numpy(eval_y[first:last]).to(device)

        def evaluate():
            """Each sample's loss and the correct predictions, summed over the whole set."""
            sums = torch.zeros(2, device=device)
            # A forward through DDP would first broadcast rank 0's buffers (broadcast_buffers,
            # after a synchronising forward): every rank evaluates rank 0's model. SyncBatchNorm's
            # are equal on every rank already.
            for buffer in model.module.buffers():
                dist.broadcast(buffer, 0)
            model.module.eval()  # batch norms: the running statistics
            with torch.no_grad():
                for begin in range(0, eval_x.shape[0], batch):
                    x, y = eval_x[begin:begin + batch], eval_y[begin:begin + batch]
                    with autocast():
                        out = model.module(x)
                    if classification:
                        sums[0] += torch.nn.functional.cross_entropy(
                            out.float(), y, label_smoothing=smoothing, reduction="sum")
                        sums[1] += (out.float().argmax(dim=1) == y).sum()
                    else:
                        sums[0] += torch.nn.functional.mse_loss(
                            out.float(), y, reduction="sum") / out.shape[1]
            model.module.train()
            dist.all_reduce(sums)
            return sums[0].item() / eval_n, sums[1].item() / eval_n


    scaler, scaler_enabled = make_scaler(cuda, spec)
    optimizer = make_optimizer(model.parameters(), spec)
    scheduler = make_scheduler(optimizer, spec)
    max_grad_norm = spec.get("max_grad_norm", 0.0)

    steps = []
    eval_every = spec.get("eval_every", 0)
    for step in range(1, spec["steps"] + 1):
        step_loss = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        lr = optimizer.param_groups[0]["lr"]
        for micro in range(accumulation):
            x, y = next_batch()
            stepping = micro == accumulation - 1
            sync = contextlib.nullcontext() if stepping else model.no_sync()
            with sync:
                with autocast():
                    out = model(x)
                    if classification:
                        loss = torch.nn.functional.cross_entropy(
                            out.float(), y, label_smoothing=smoothing) / accumulation
                    else:
                        loss = torch.nn.functional.mse_loss(out.float(), y) / accumulation
                scaler.scale(loss).backward()
            step_loss += loss.detach()
            if classification:
                correct += (out.detach().float().argmax(dim=1) == y).sum()
        scale_used = scaler.get_scale() if scaler_enabled else 1.0
        # The global L2 norm of the unscaled gradients before clipping (what our telemetry
        # reports; inf or NaN on an overflowed step), as clip_grad_norm_ computes it. Unscaling
        # here rather than inside scaler.step() is the same arithmetic.
        scaler.unscale_(optimizer)
        grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
        grad_norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g, 2.0) for g in grads]), 2.0).item()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        if scheduler is not None:
            scheduler.step()  # Once per attempted step, skipped or not.
        skipped = scaler_enabled and scaler.get_scale() < scale_used
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(step_loss)  # Telemetry only (SUM: gloo has no AVG).
        dist.all_reduce(correct)
        record = {"step": step, "loss": step_loss.item() / world, "loss_scale": scale_used,
                  "skipped": bool(skipped), "lr": lr, "grad_norm": grad_norm}
        if classification:
            record["accuracy"] = correct.item() / (batch * accumulation * world)
        if evaluate is not None and ((eval_every > 0 and step % eval_every == 0)
                                     or step == spec["steps"]):
            record["eval_loss"], eval_accuracy = evaluate()
            if classification:
                record["eval_accuracy"] = eval_accuracy
        steps.append(record)

    if norms and getattr(norms[0], "running_mean", None) is not None:
        save_safetensors(norm_tensors(norms, buffers_only=True),
                         os.path.join(args.out, f"torch_buffers_rank{rank}.safetensors"))
    if rank == 0:
        final = {}
        for i, linear in enumerate(linears):
            final[f"layers.{i}.weight"] = linear.weight.detach().float().cpu().numpy()
            final[f"layers.{i}.bias"] = linear.bias.detach().float().cpu().numpy()
        final.update(norm_tensors(norms))
        save_safetensors(final, os.path.join(args.out, "torch_final.safetensors"))
        with open(os.path.join(args.out, "torch_steps.json"), "w") as f:
            json.dump(steps, f)
    dist.barrier()
    # Not destroy_process_group() and a normal exit: PyTorch 1.13 with gloo was seen to hang
    # there once the work was done. Everything is written and flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
