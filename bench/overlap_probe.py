"""Can memory-bound work hide behind mlp8k's GEMMs on one GPU? (issue 16)

Times, with CUDA events on one H200: eight 4096x8192x8192 fp16 GEMMs (mlp8k's shape) alone; an
SGD-like update over mlp8k's 268M fp32 parameters alone (read parameter and gradient, write the
parameter and an fp16 copy); and both at once, the update on a second stream, launched before
or after the GEMMs. `hidden` is the share of the update's time that the concurrent run saved:
(gemms + update - both) / update. Prints one line per case.

    python3 bench/overlap_probe.py [--iters 10]
"""

import argparse

import torch


def timed(fn, iters):
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--gemms", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(4096, 8192, device="cuda", dtype=torch.float16)
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.float16) / 90
    y = torch.empty(4096, 8192, device="cuda", dtype=torch.float16)
    n = 4 * 8192 * 8192
    params = torch.randn(n, device="cuda")
    grads = torch.randn(n, device="cuda")
    low = torch.empty(n, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    main_stream = torch.cuda.current_stream()

    def gemms():
        for _ in range(args.gemms):
            torch.matmul(x, w.t(), out=y)

    def update():
        params.add_(grads, alpha=-0.01)
        low.copy_(params)

    def both(update_first):
        # The side stream waits only for the work queued before this point: the update runs
        # beside the GEMMs, its kernels reaching the GPU before theirs or while the first runs.
        side.wait_stream(main_stream)
        if update_first:
            with torch.cuda.stream(side):
                update()
            gemms()
        else:
            gemms()
            with torch.cuda.stream(side):
                update()
        main_stream.wait_stream(side)

    def both_interleaved():
        # The update cut in as many pieces as there are GEMMs, each beside one GEMM (as a
        # per-layer update beside the next step's forward would be).
        side.wait_stream(main_stream)
        pieces_p = params.chunk(args.gemms)
        pieces_g = grads.chunk(args.gemms)
        pieces_l = low.chunk(args.gemms)
        for i in range(args.gemms):
            with torch.cuda.stream(side):
                pieces_p[i].add_(pieces_g[i], alpha=-0.01)
                pieces_l[i].copy_(pieces_p[i])
            torch.matmul(x, w.t(), out=y)
        main_stream.wait_stream(side)

    t_gemms = timed(gemms, args.iters)
    t_update = timed(update, args.iters)
    flops = 2 * 4096 * 8192 * 8192 * args.gemms
    print(f"gemms alone      {t_gemms:8.3f} ms  ({flops / t_gemms / 1e9:.0f} TFLOP/s)")
    moved = n * 18  # add_: 12 bytes per parameter, copy_ to fp16: 6
    print(f"update alone     {t_update:8.3f} ms  ({moved / (t_update * 1e-3) / 1e9:.0f} GB/s)")
    for name, fn in [("update first", lambda: both(True)), ("update after", lambda: both(False)),
                     ("interleaved", both_interleaved)]:
        t_both = timed(fn, args.iters)
        hidden = (t_gemms + t_update - t_both) / t_update
        print(f"both, {name:11s}{t_both:8.3f} ms  hidden {100 * hidden:5.1f}% of the update")
    t_serial = timed(lambda: (gemms(), update()), args.iters)
    print(f"serial           {t_serial:8.3f} ms")


if __name__ == "__main__":
    main()
