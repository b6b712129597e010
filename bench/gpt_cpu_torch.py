"""PyTorch eager's tokens/s for the same GPT training step as bench/gpt_cpu_bench.cc (one
process: forward, cross-entropy, backward, AdamW; parity/gpt_reference.py's model), for
bench/run_gpt_cpu_bench.sh.

  python3 bench/gpt_cpu_torch.py --tokens FILE --layers L --width C --heads H --context T \\
      --batch B --steps N --threads K [--precision fp32|bf16]
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import autocast_gemm  # noqa: E402
import gpt_reference as ref  # noqa: E402

autocast_gemm.PIN_RECIPE = False  # PyTorch's own bf16 GEMMs: its speed is what is measured.


def main():
    p = argparse.ArgumentParser()
    for name, default in (("layers", 2), ("width", 64), ("heads", 4), ("context", 64),
                          ("batch", 8), ("steps", 20), ("threads", 1)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--tokens", required=True)
    p.add_argument("--precision", default="fp32")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    raw = np.fromfile(a.tokens, dtype=np.uint16)
    if raw[:2].view(np.int32)[0] == 20240520:
        raw = raw[512:]
    tokens = torch.from_numpy(raw.astype(np.int64))
    config = ref.GptConfig(256, a.context, a.layers, a.heads, a.width)
    model = ref.Gpt(config)
    ref.init_gpt2(model, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    n = a.batch * a.context
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16")
    started = None
    for step in range(a.steps):
        if step == 1:
            started = time.perf_counter()
        window = tokens[step * n:(step + 1) * n + 1]
        x, y = window[:-1].view(a.batch, a.context), window[1:].view(a.batch, a.context)
        with autocast:
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1))[:, :256], y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - started
    print(f"tokens_per_second {(a.steps - 1) * n / elapsed:.1f}")


if __name__ == "__main__":
    main()
