"""The original example's loop in PyTorch: DDP + autocast + GradScaler + no_sync.

Run with torchrun (one process per GPU). Reads a case file written by compare.py (the job spec
as JSON plus the data and checkpoint paths), trains, and writes from rank 0:
  <out>/torch_steps.json        per optimizer step: loss, loss_scale, skipped
  <out>/torch_final.safetensors final parameters (layers.{i}.weight / .bias)
"""
import argparse
import contextlib
import json
import os

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.nn.parallel import DistributedDataParallel as DDP


def build_model(model_spec):
    widths = [model_spec["input_dim"], *model_spec.get("hidden_dims", []), model_spec["output_dim"]]
    activation = model_spec.get("activation", "relu").lower()
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU() if activation == "relu" else torch.nn.GELU())
    return torch.nn.Sequential(*layers), [l for l in layers if isinstance(l, torch.nn.Linear)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.case) as f:
        case = json.load(f)
    spec = case["spec"]

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    # Pure fp32 GEMMs for the fp32 case, as our backend does.
    torch.backends.cuda.matmul.allow_tf32 = False

    model, linears = build_model(spec["model"])
    init = load_file(spec["init_checkpoint"])
    with torch.no_grad():
        for i, linear in enumerate(linears):
            linear.weight.copy_(init[f"layers.{i}.weight"])
            linear.bias.copy_(init[f"layers.{i}.bias"])
    model = DDP(model.to(device), device_ids=[device.index])

    features = np.load(spec["data"]["npy"]["features_path"])
    targets = np.load(spec["data"]["npy"]["targets_path"])
    n = features.shape[0]
    first, last = rank * n // world, (rank + 1) * n // world
    shard_x = torch.from_numpy(features[first:last]).to(device)
    shard_y = torch.from_numpy(targets[first:last]).to(device)
    batch = spec["micro_batch_size"]
    accumulation = spec["accumulation_steps"]

    precision = spec.get("precision", "fp16").lower()
    autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler_spec = spec.get("loss_scaler", {})
    scaler_enabled = scaler_spec.get("enabled", precision == "fp16")
    scaler = torch.amp.GradScaler(
        "cuda",
        init_scale=scaler_spec.get("init_scale", 65536.0),
        growth_factor=scaler_spec.get("growth_factor", 2.0),
        backoff_factor=scaler_spec.get("backoff_factor", 0.5),
        growth_interval=scaler_spec.get("growth_interval", 2000),
        enabled=scaler_enabled,
    )
    optimizer_spec = spec["optimizer"]
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=optimizer_spec["lr"],
        momentum=optimizer_spec.get("momentum", 0.0),
        weight_decay=optimizer_spec.get("weight_decay", 0.0),
    )
    max_grad_norm = spec.get("max_grad_norm", 0.0)

    cursor = 0
    steps = []
    for step in range(1, spec["steps"] + 1):
        step_loss = torch.zeros((), device=device)
        for micro in range(accumulation):
            rows = [(cursor + r) % shard_x.shape[0] for r in range(batch)]
            cursor = (cursor + batch) % shard_x.shape[0]
            x, y = shard_x[rows], shard_y[rows]
            stepping = micro == accumulation - 1
            sync = contextlib.nullcontext() if stepping else model.no_sync()
            with sync:
                with torch.autocast("cuda", dtype=autocast_dtype, enabled=autocast_dtype is not None):
                    out = model(x)
                    loss = torch.nn.functional.mse_loss(out.float(), y) / accumulation
                scaler.scale(loss).backward()
            step_loss += loss.detach()
        scale_used = scaler.get_scale() if scaler_enabled else 1.0
        if max_grad_norm > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        skipped = scaler_enabled and scaler.get_scale() < scale_used
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(step_loss, op=dist.ReduceOp.AVG)  # Telemetry only.
        steps.append({"step": step, "loss": step_loss.item(), "loss_scale": scale_used,
                      "skipped": bool(skipped)})

    if rank == 0:
        final = {}
        for i, linear in enumerate(linears):
            final[f"layers.{i}.weight"] = linear.weight.detach().float().cpu().contiguous()
            final[f"layers.{i}.bias"] = linear.bias.detach().float().cpu().contiguous()
        save_file(final, os.path.join(args.out, "torch_final.safetensors"))
        with open(os.path.join(args.out, "torch_steps.json"), "w") as f:
            json.dump(steps, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
