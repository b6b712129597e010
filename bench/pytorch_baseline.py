"""PyTorch baseline for the benchmark: DDP + autocast fp16 + GradScaler + no_sync, the original
example's loop, on the configurations of bench_configs.h. Run under torchrun (one process per
GPU); rank 0 prints one JSON object per configuration.

  torchrun --standalone --nproc_per_node 2 bench/pytorch_baseline.py --warmup 10 --steps 50

--hook fp16|bf16 registers DDP's fp16/bf16_compress_hook (our grad_comm_dtype); --as_hosts gives
each rank its own NCCL_HOSTID, so that with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 the two GPUs
talk as two hosts would, over NCCL's socket transport (bench/run_net_bench.sh).
"""
import argparse
import contextlib
import json
import os
import statistics

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

CONFIGS = {
    "seed": ([1024, 16], 64),
    "mlp1k": ([1024, 1024, 1024, 1024, 1024], 512),
    "mlp8k": ([8192, 8192, 8192, 8192, 8192], 4096),
}
ACCUMULATION = 4


NORMS = {"layer_norm": torch.nn.LayerNorm, "batch_norm": torch.nn.BatchNorm1d,
         "sync_batch_norm": torch.nn.SyncBatchNorm}


def model_for(widths, norm="none"):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            if norm != "none":
                layers.append(NORMS[norm](widths[i + 1]))
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", default="seed,mlp1k,mlp8k")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--hook", choices=["none", "fp16", "bf16"], default="none")
    parser.add_argument("--as_hosts", action="store_true")
    parser.add_argument("--norm", choices=["none", *NORMS], default="none")
    args = parser.parse_args()
    if args.as_hosts:
        os.environ["NCCL_HOSTID"] = f"bench-host-{os.environ['RANK']}"
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    for name in args.configs.split(","):
        widths, batch = CONFIGS[name]
        torch.manual_seed(0)
        model = DDP(model_for(widths, args.norm).to(device), device_ids=[device.index])
        if args.hook != "none":
            model.register_comm_hook(None, default_hooks.fp16_compress_hook if args.hook == "fp16"
                                     else default_hooks.bf16_compress_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cuda")
        generator = torch.Generator(device=device).manual_seed(rank)
        x = torch.randn(batch, widths[0], device=device, generator=generator)
        y = torch.randn(batch, widths[-1], device=device, generator=generator)
        times = []
        for step in range(args.warmup + args.steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for micro in range(ACCUMULATION):
                sync = contextlib.nullcontext() if micro == ACCUMULATION - 1 else model.no_sync()
                with sync:
                    with torch.autocast("cuda", dtype=torch.float16):
                        loss = torch.nn.functional.mse_loss(model(x).float(), y) / ACCUMULATION
                    scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            end.record()
            end.synchronize()
            if step >= args.warmup:
                times.append(start.elapsed_time(end))
        step_ms = statistics.median(times)
        # A standalone NCCL allreduce of the gradient's size (parameters + the loss slot).
        params = sum(p.numel() for p in model.parameters())
        buffer = torch.zeros(params + 1, device=device)
        for _ in range(5):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            dist.all_reduce(buffer)
        end.record()
        end.synchronize()
        allreduce_ms = start.elapsed_time(end) / 50
        busbw = (params + 1) * 4 * 2 * (world - 1) / world / (allreduce_ms * 1e-3) / 1e9
        samples_per_gpu = batch * ACCUMULATION
        if rank == 0:
            print(json.dumps({
                "engine": "pytorch", "config": name, "gpus": world, "step_ms": step_ms,
                "grad_comm": args.hook if args.hook != "none" else "fp32", "norm": args.norm,
                "samples_per_s": samples_per_gpu * world / (step_ms * 1e-3),
                "tflops_per_gpu": 6 * params * samples_per_gpu / (step_ms * 1e-3) / 1e12,
                "params": params, "allreduce_ms": allreduce_ms,
                "allreduce_busbw_gbs": busbw if world > 1 else 0.0}), flush=True)
        del model, optimizer, buffer
        torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
