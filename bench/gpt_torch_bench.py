"""PyTorch's GPT-2 training step on one GPU, eager and torch.compile, for bench/run_gpt_bench.sh:
nanoGPT's model (tied LM head, F.scaled_dot_product_attention(is_causal=True), GELU tanh,
LayerNorm eps 1e-5, no dropout) and the original example's loop (autocast; GradScaler for
fp16; `accum` micro-batches per step; clip at 1.0; fused AdamW with nanoGPT's decay groups).
Prints one JSON line per configuration: ms/step (median after warm-up), tokens/s, TFLOP/s
(6N + attention per token, as nanoGPT's estimate_mfu), peak memory.

  python3 bench/gpt_torch_bench.py --layers 12 --width 768 --heads 12 --batch 16 --accum 4 \\
      --precision bf16 --mode compile [--steps 20 --warmup 5]
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, V, T, L, C, H):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif "ln" not in name:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def main():
    p = argparse.ArgumentParser()
    for name, default in (("layers", 12), ("width", 768), ("heads", 12), ("context", 1024),
                          ("vocab", 50304), ("batch", 16), ("accum", 4), ("steps", 20),
                          ("warmup", 5)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--precision", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--mode", choices=("eager", "compile"), default="eager")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = Gpt(a.vocab, a.context, a.layers, a.width, a.heads).to(device)
    n_params = sum(p.numel() for p in model.parameters()) - a.context * a.width
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), fused=True)
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=a.precision == "fp16")
    step_model = torch.compile(model) if a.mode == "compile" else model
    data = torch.randint(0, 50257, (a.steps + a.warmup, a.accum, a.batch, a.context + 1),
                         device=device)
    times = []
    compile_started = time.time()
    first_step_s = None
    for step in range(a.steps + a.warmup):
        torch.cuda.synchronize()
        started = time.time()
        for micro in range(a.accum):
            x, y = data[step, micro, :, :-1], data[step, micro, :, 1:]
            with torch.autocast("cuda", dtype=dtype):
                loss = step_model(x, y) / a.accum
            scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step == 0:
            first_step_s = time.time() - compile_started
        if step >= a.warmup:
            times.append(time.time() - started)
    ms = statistics.median(times) * 1000
    tokens = a.batch * a.accum * a.context
    flops_per_token = 6 * n_params + 12 * a.layers * a.context * a.width
    print(json.dumps({
        "engine": f"pytorch {a.mode}", "precision": a.precision, "layers": a.layers,
        "width": a.width, "batch": a.batch, "accum": a.accum, "ms_per_step": round(ms, 2),
        "tokens_per_s": round(tokens / ms * 1000), "tflops": round(
            flops_per_token * tokens / ms / 1e9, 1),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "first_step_s": round(first_step_s, 2), "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
