"""The original example as a plain torchrun script (the end-to-end baseline): Linear 1024->16,
micro-batch 64, accumulation 4, 5 optimizer steps, SGD lr 0.01, fp16 autocast + GradScaler,
DDP with no_sync, one fixed synthetic batch per rank."""
import contextlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
rank = dist.get_rank()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
torch.manual_seed(0)
model = DDP(torch.nn.Linear(1024, 16).to(device), device_ids=[device.index])
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cuda")
torch.manual_seed(rank)
x = torch.randn(64, 1024, device=device)
y = torch.randn(64, 16, device=device)
for step in range(5):
    for micro in range(4):
        sync = contextlib.nullcontext() if micro == 3 else model.no_sync()
        with sync:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y) / 4
            scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if rank == 0:
        print(f"step {step + 1} loss {loss.item() * 4:.6f}", flush=True)
dist.destroy_process_group()
