"""PyTorch's causal SDPA at the GPT's shapes, per backend (flash, cuDNN, efficient), forward and
forward + backward: the reference for bench/attention_plans (BENCHMARKS.md round 8). The packed
qkv is viewed as the nanoGPT model does (split, view, transpose: no copy into the kernel)."""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_ms(fn, runs=20):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[0], times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="32,1024,12,64 16,1024,16,64")
    parser.add_argument("--dtypes", default="bf16 fp16")
    args = parser.parse_args()
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    for shape in args.shapes.split():
        B, T, H, hs = (int(x) for x in shape.split(","))
        C = H * hs
        for dtype_name in args.dtypes.split():
            dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float16
            qkv = torch.randn(B, T, 3 * C, device="cuda", dtype=dtype, requires_grad=True)
            dy = torch.randn(B, H, T, hs, device="cuda", dtype=dtype) * 0.01
            fwd_flops = 2 * 2 * B * H * T * T * hs / 2
            bwd_flops = 5 * 2 * B * H * T * T * hs / 2
            for name, backend in backends.items():
                def forward():
                    q, k, v = qkv.split(C, dim=2)
                    q = q.view(B, T, H, hs).transpose(1, 2)
                    k = k.view(B, T, H, hs).transpose(1, 2)
                    v = v.view(B, T, H, hs).transpose(1, 2)
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
                try:
                    with sdpa_kernel(backend):
                        f_min, f_med = time_ms(lambda: forward())
                        y = forward()
                        fb_min, fb_med = time_ms(lambda: torch.autograd.grad(forward(), qkv, dy))
                except RuntimeError as error:
                    print(f"torch {name} B={B} T={T} H={H} hs={hs} {dtype_name}: "
                          f"unavailable ({str(error).splitlines()[0][:80]})")
                    continue
                b_min = fb_min - f_min
                print(f"torch {name:9s} B={B} T={T} H={H} hs={hs} {dtype_name}: forward "
                      f"{f_min:.3f} ms ({fwd_flops / f_min / 1e9:.0f} TFLOP/s), backward ~"
                      f"{b_min:.3f} ms ({bwd_flops / b_min / 1e9:.0f} TFLOP/s)")


if __name__ == "__main__":
    main()
