"""PyTorch's time for the GEMMs of one MLP layer's training step (fp16 autocast shapes), beside
bench/gemm_algos in the same run: forward addmm (+ReLU), data gradient, weight gradient."""
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--rows", type=int, default=4096)
parser.add_argument("--width", type=int, default=8192)
parser.add_argument("--iters", type=int, default=10)
parser.add_argument("--dtype", default="f16")
args = parser.parse_args()
dtype = torch.float16 if args.dtype == "f16" else torch.bfloat16
x = torch.randn(args.rows, args.width, device="cuda", dtype=dtype)
w = torch.randn(args.width, args.width, device="cuda", dtype=dtype) * 0.05
b = torch.randn(args.width, device="cuda", dtype=dtype)
dy = torch.randn(args.rows, args.width, device="cuda", dtype=dtype) * 0.01
cases = {
    "forward addmm": lambda: torch.addmm(b, x, w.t()),
    "forward linear+relu": lambda: torch.relu(torch.nn.functional.linear(x, w, b)),
    "data gradient": lambda: dy @ w,
    "weight gradient": lambda: dy.t() @ x,
    "bias gradient": lambda: dy.sum(0),
}
flops = {"weight gradient": 2.0 * args.width * args.width * args.rows}
for name, fn in cases.items():
    for _ in range(2):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.iters):
        fn()
    stop.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(stop) / args.iters
    flop = flops.get(name, 2.0 * args.rows * args.width * args.width)
    print(f"torch {name:22s} {ms:8.3f} ms  {flop / ms / 1e9:7.1f} TFLOP/s")
