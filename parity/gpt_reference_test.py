"""Self-tests of parity/gpt_reference.py (the GPT reference must be right before our GPT is
proven against it) and of gpt_parity.compare_gpt. Prints the numbers each check measured.

  /usr/bin/python3 parity/gpt_reference_test.py [--out DIR]

(a) the written-out attention against a naive per-head loop (float64);
(b) world 2 with micro-batch B against world 1 with 2B (the ranks' batches concatenated: DDP's
    averaging), fp32, to 1e-6;
(c) no_sync accumulation over 2 micro-batches against one micro-batch of twice the size, in
    world 2, fp32, to 1e-6;
(d) the HF-layout writer/reader round trip, the Conv1D transposes (an independent numpy forward
    of the HF tensors, written as transformers' GPT2 computes, against the model, float64), the
    stripped padded vocabulary, and a malformed file refused;
(e) bf16 autocast: runs, its logits are bf16, and its losses are a plausible distance from fp32;
(f) perturbation: the run with initial weights nudged by 1e-7 (relative), fp32 and bf16: how far
    PyTorch moves against itself, which must stay below gpt_parity's tolerances;
(g) the token loader's cut (and token_batches.py against this file's own copy, when present);
(h) compare_gpt passes identical runs and names each kind of difference;
(i) autocast_gemm: its recipe GEMM (bf16 operands, fp32 accumulation, one rounding) forward and
    backward against float64 arithmetic rounded once, and its probe, which must tell the recipe
    from a GEMM that rounds at every step (PyTorch 1.13's CPU fallback without AVX-512).
"""
import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import autocast_gemm  # noqa: E402
import gpt_parity  # noqa: E402
import gpt_reference as ref  # noqa: E402

failures = []


def check(name, ok, detail):
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def max_rel(a, b, key):
    return max(abs(x[key] - y[key]) / abs(y[key]) for x, y in zip(a, b))


def param_rel(a, b):
    names = sorted(b)
    fa = np.concatenate([np.asarray(a[n], np.float64).ravel() for n in names])
    fb = np.concatenate([np.asarray(b[n], np.float64).ravel() for n in names])
    return float(np.linalg.norm(fa - fb) / np.linalg.norm(fb))


def naive_attention(q, k, v):
    B, H, T, hs = q.shape
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                scores = torch.stack([q[b, h, i] @ k[b, h, j] for j in range(i + 1)])
                weights = torch.exp(scores / math.sqrt(hs) - (scores / math.sqrt(hs)).max())
                weights = weights / weights.sum()
                out[b, h, i] = sum(weights[j] * v[b, h, j] for j in range(i + 1))
    return out


def test_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=g, dtype=torch.float64) for _ in range(3))
    err = (ref.causal_attention(q, k, v) - naive_attention(q, k, v)).abs().max().item()
    check("(a) attention vs per-head loop (float64)", err < 1e-12, f"max abs diff {err:.3g}")


def hf_forward_numpy(t, config, idx):
    """transformers' GPT2LMHeadModel forward (eager attention, gelu_new) from HF-layout tensors,
    in float64 numpy: Conv1D is x @ W + b."""
    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * t[p + ".weight"] + t[p + ".bias"]

    def conv1d(x, p):
        return x @ t[p + ".weight"] + t[p + ".bias"]

    T, C, H = idx.shape[1], config.width, config.heads
    hs = C // H
    x = t["transformer.wte.weight"][idx] + t["transformer.wpe.weight"][:T]
    for i in range(config.layers):
        p = f"transformer.h.{i}"
        qkv = conv1d(ln(x, p + ".ln_1"), p + ".attn.c_attn")
        q, k, v = (a.reshape(idx.shape[0], T, H, hs).transpose(0, 2, 1, 3)
                   for a in np.split(qkv, 3, axis=-1))
        w = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)
        w = np.where(np.tril(np.ones((T, T), bool)), w, np.finfo(np.float64).min)
        w = np.exp(w - w.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        y = (w @ v).transpose(0, 2, 1, 3).reshape(idx.shape[0], T, C)
        x = x + conv1d(y, p + ".attn.c_proj")
        h = conv1d(ln(x, p + ".ln_2"), p + ".mlp.c_fc")
        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
        x = x + conv1d(h, p + ".mlp.c_proj")
    return ln(x, "transformer.ln_f") @ t["transformer.wte.weight"].T


def emulated_bf16_logits(model, idx):
    """The module docstring's bf16 forward written with explicit roundings in fp32 arithmetic,
    no autocast: what the C++ must compute. rb = round to bf16 (kept in fp32)."""
    import torch.nn.functional as F

    def rb(t):
        return t.bfloat16().float()

    def gemm(x, linear):
        return rb(rb(x) @ rb(linear.weight).T + rb(linear.bias))

    def ln(x, norm):
        return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, 1e-5)

    c, t = model.config, model.transformer
    B, T = idx.shape
    hs = c.width // c.heads
    with torch.no_grad():
        x = t.wte.weight[idx] + t.wpe.weight[:T]
        for block in t.h:
            q, k, v = (a.view(B, T, c.heads, hs).transpose(1, 2)
                       for a in gemm(ln(x, block.ln_1), block.attn.c_attn).split(c.width, dim=2))
            scores = rb(rb(q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs)))
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
            y = rb(rb(torch.softmax(scores, dim=-1)) @ v).transpose(1, 2).reshape(B, T, c.width)
            x = x + gemm(y, block.attn.c_proj)
            h = rb(F.gelu(gemm(ln(x, block.ln_2), block.mlp.c_fc), approximate="tanh"))
            x = x + gemm(h, block.mlp.c_proj)
        return rb(rb(ln(x, t.ln_f)) @ rb(t.wte.weight).T)


def test_bf16_flow():
    # hs = 8: the scale 1/sqrt(8) is not a bf16 number, so its rounding point matters.
    config = ref.GptConfig(vocab_size=64, padded_vocab_size=80, context_length=16, layers=2,
                           heads=4, width=32)
    model = ref.Gpt(config)
    ref.init_gpt2(model, 5)
    idx = torch.from_numpy(np.random.default_rng(2).integers(0, 64, (4, 16)))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx).float()
    emulated = emulated_bf16_logits(model, idx)
    differ = (logits != emulated).float().mean().item()
    ulps = ((logits - emulated).abs() / emulated.abs().clamp(min=1e-3)).max().item() * 256
    # Backward: a Linear's weight and bias gradients are bf16 GEMM / reduction outputs widened
    # to fp32; LayerNorm's, wpe's and wte's (embedding + head) are fp32 sums.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model.loss(model(idx), torch.roll(idx, -1, 1)).backward()
    representable = {n: bool(torch.equal(p.grad.bfloat16().float(), p.grad))
                     for n, p in model.named_parameters()}
    linear = [n for n in representable if ".attn.c_" in n or ".mlp.c_" in n]
    check("(e) bf16 backward: Linear gradients bf16-representable, the others not",
          all(representable[n] for n in linear) and
          not any(v for n, v in representable.items() if n not in linear),
          f"{len(linear)} Linear tensors yes, {len(representable) - len(linear)} others no")
    # The attention alone on scores of size ~1, where the scale's rounding point shows.
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g).bfloat16() for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        att = ref.causal_attention(q, k, v).float()
    scores = (q.float() @ k.float().transpose(-2, -1)).bfloat16().float()
    scores = (scores * (1.0 / math.sqrt(8))).bfloat16().float()
    scores = scores.masked_fill(~torch.ones(16, 16, dtype=torch.bool).tril(), float("-inf"))
    expected = (torch.softmax(scores, -1).bfloat16().float() @ v.float()).bfloat16().float()
    att_differ = (att != expected).float().mean().item()
    check("(e) bf16 attention == its dtype flow emulated in fp32", att_differ < 0.005,
          f"{att_differ:.2%} of {att.numel()} outputs differ")
    check("(e) bf16 autocast forward == the docstring's dtype flow emulated in fp32",
          differ < 0.005,
          f"{differ:.2%} of {logits.numel()} logits differ (GEMM summation order), worst "
          f"{ulps:.2g} bf16 ulps")


def per_step_rounded_gemm(a, b, bias=None):
    """a @ b (+ bias) adding each product into the low-precision output, rounding at every
    step, as PyTorch 1.13's CPU fallback GEMM does (the probe must refuse it)."""
    out = torch.zeros(*a.shape[:-1], b.size(-1), dtype=a.dtype)
    for l in range(a.size(-1)):
        out = (out.float() + a[..., l:l + 1].float() * b[..., l:l + 1, :].float()).to(a.dtype)
    return out if bias is None else (out.float() + bias.float()).to(a.dtype)


def test_recipe_gemm():
    bf16 = torch.bfloat16
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 5, 96, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(40, 96, generator=g, dtype=torch.float64).requires_grad_()
    b = torch.randn(40, generator=g, dtype=torch.float64).requires_grad_()
    dy = torch.randn(3, 5, 40, generator=g, dtype=torch.float64).to(bf16)
    x32, w32, b32 = (t.detach().float().requires_grad_() for t in (x, w, b))
    y = autocast_gemm.recipe_linear(x32, w32, b32, bf16)
    y.backward(dy)
    # Truth: float64 arithmetic on the bf16-rounded operands, rounded once to bf16.
    xb, wb, bb, g64 = (t.detach().to(bf16).double() for t in (x, w, b, dy))
    truth = {"y": (xb @ wb.T + bb), "dx": g64 @ wb,
             "dw": g64.reshape(-1, 40).T @ xb.reshape(-1, 96), "db": g64.reshape(-1, 40).sum(0)}
    got = {"y": y, "dx": x32.grad, "dw": w32.grad, "db": b32.grad}
    worst, representable, dtypes = 0.0, True, [y.dtype, x32.grad.dtype, w32.grad.dtype]
    for name, want in truth.items():
        value = got[name].detach().double()
        representable &= bool(torch.equal(value.to(bf16).double(), value))
        # bf16's ulp at the rounded value: 2^(e - 8) for a value m * 2^e, m in [0.5, 1).
        ulp = torch.ldexp(torch.ones_like(want), torch.frexp(want.to(bf16).double())[1] - 8)
        worst = max(worst, ((value - want.to(bf16).double()).abs() / ulp).max().item())
    check("(i) recipe GEMM forward and backward == float64 arithmetic rounded once to bf16",
          worst <= 1.0 and representable and dtypes == [bf16, torch.float32, torch.float32],
          f"worst {worst:.2g} bf16 ulps over y, dx, dw, db; bf16-representable {representable}; "
          f"dtypes {dtypes}")
    recipe = autocast_gemm.matches_recipe(
        lambda a, w_, b_: autocast_gemm.recipe_linear(a, w_, b_, bf16),
        lambda a, b_: autocast_gemm.recipe_matmul(a, b_, bf16), bf16)
    rounded = autocast_gemm.matches_recipe(
        lambda a, w_, b_: per_step_rounded_gemm(a, w_.t(), b_), per_step_rounded_gemm, bf16)
    native = autocast_gemm.platform_gemm_is_recipe(bf16)
    check("(i) the probe takes the recipe and refuses a GEMM that rounds at every step",
          recipe and not rounded,
          f"recipe {recipe}, per-step rounding {rounded}; this PyTorch's own CPU bf16 GEMMs: "
          f"{'the recipe (used as they are)' if native else 'not the recipe (substituted)'}")


def test_hf_layout(tmp):
    config = ref.GptConfig(vocab_size=50, padded_vocab_size=64, context_length=12, layers=2,
                           heads=2, width=32)
    model = ref.Gpt(config)
    ref.init_gpt2(model, 3)
    path = ref.write_hf_checkpoint(model, config, os.path.join(tmp, "hf"))
    tensors, metadata = ref.load_safetensors(path)
    hf = json.load(open(os.path.join(tmp, "hf", "config.json")))
    expected = ref.hf_tensors(model)
    exact = sorted(tensors) == sorted(expected) and all(
        np.array_equal(tensors[n], expected[n]) for n in expected)
    linear = model.transformer.h[1].attn.c_attn.weight.detach().numpy()  # [3C, C]
    c_attn = tensors["transformer.h.1.attn.c_attn.weight"]
    c_fc = tensors["transformer.h.0.mlp.c_fc.weight"]
    check("(d) HF round trip", exact and metadata == {"format": "pt"} and
          "lm_head.weight" not in tensors and len(tensors) == 4 + 12 * config.layers,
          f"{len(tensors)} tensors bit-exact, metadata {metadata}")
    check("(d) Conv1D transposes", c_attn.shape == (32, 96) and np.array_equal(c_attn, linear.T)
          and c_fc.shape == (32, 128) and
          tensors["transformer.h.0.mlp.c_proj.weight"].shape == (128, 32),
          f"c_attn {c_attn.shape} == Linear.weight{linear.shape}^T, c_fc {c_fc.shape}")
    check("(d) padded vocabulary stripped", tensors["transformer.wte.weight"].shape == (50, 32)
          and hf["vocab_size"] == 50 and hf["mptrain_padded_vocab_size"] == 64 and
          hf["activation_function"] == "gelu_new",
          f"wte {tensors['transformer.wte.weight'].shape}, config vocab_size {hf['vocab_size']}")
    # The model (float64) against transformers' arithmetic on the stored tensors.
    idx = np.random.default_rng(1).integers(0, 50, (2, 12))
    numpy_logits = hf_forward_numpy({n: a.astype(np.float64) for n, a in tensors.items()},
                                    config, idx)
    model64 = copy.deepcopy(model).double()
    with torch.no_grad():
        torch_logits = model64(torch.from_numpy(idx))[..., :50].numpy()
    err = np.abs(torch_logits - numpy_logits).max()
    check("(d) model == HF GPT-2 arithmetic on the stored tensors (float64)", err < 1e-10,
          f"max abs logit diff {err:.3g}")
    # Reloaded: padded rows 0; the real vocabulary's logits unchanged.
    reloaded = ref.Gpt(config)
    ref.load_hf_tensors(reloaded, ref.read_hf_checkpoint(os.path.join(tmp, "hf")))
    pad = reloaded.transformer.wte.weight[50:].abs().max().item()
    a, b = ref.last_logits(model, idx[0]), ref.last_logits(reloaded, idx[0])
    check("(d) reload: zero padded rows, same logits", pad == 0 and torch.equal(a, b),
          f"padded rows max |w| {pad}, logits equal {torch.equal(a, b)}")
    greedy = ref.generate(reloaded, [1, 2, 3], 5, top_k=1)
    chain, tokens = [], [1, 2, 3]
    for _ in range(5):
        chain.append(int(torch.argmax(ref.last_logits(reloaded, tokens))))
        tokens.append(chain[-1])
    check("(d) greedy generate == argmax chain", greedy == chain, f"{greedy}")
    # Malformed files are refused with the file's name.
    data = open(path, "rb").read()
    refused = 0
    for bad in (data[:-4], data[:6], b"\xff" * 8 + data[8:]):
        with open(os.path.join(tmp, "bad.safetensors"), "wb") as f:
            f.write(bad)
        try:
            ref.load_safetensors(os.path.join(tmp, "bad.safetensors"))
        except ValueError as e:
            refused += "bad.safetensors" in str(e)
    check("(d) malformed safetensors refused", refused == 3, f"{refused}/3 refused")


def test_loader(tmp):
    tokens = np.arange(1000) % 251
    files = [os.path.join(tmp, "s0.bin"), os.path.join(tmp, "s1.bin")]
    ref.write_token_file(files[0], tokens[:500])
    ref.write_token_file(files[1], tokens[500:], raw=True)
    B, T = 2, 8
    one = ref._own_batches(files, 2 * B, T, 0, 1, 20)
    two = [ref._own_batches(files, B, T, r, 2, 20) for r in range(2)]
    concat = all(np.array_equal(one[i][0], np.concatenate([two[0][i][0], two[1][i][0]]))
                 for i in range(20))
    shifted = all(np.array_equal(x[1:], y[:-1]) for x, y in one)
    # 499 // 32 = 15 windows of the first shard, then the second (raw) shard from its start.
    wraps = np.array_equal(one[15][0][:4], tokens[500:504])
    check("(g) loader: world 2 == world 1 concatenated; y = x shifted; next shard",
          concat and shifted and wraps, f"{len(one)} batches")
    if ref.token_batches is not ref._own_batches:
        same = all(np.array_equal(np.ravel(a[0]), b[0]) and np.array_equal(np.ravel(a[1]), b[1])
                   for r in range(2) for a, b in zip(ref.token_batches(files, B, T, r, 2, 40),
                                                     ref._own_batches(files, B, T, r, 2, 40)))
        check("(g) token_batches.py == gpt_reference's own cut", same, "40 batches x 2 ranks")
    else:
        print("note: parity/token_batches.py absent; gpt_reference uses its own loader")


def test_compare():
    steps = [{"step": s, "loss": 4.0 - 0.1 * s, "grad_norm": 1.5, "lr": 0.01, "loss_scale": 1.0,
              "skipped": False} for s in range(1, 5)]
    steps[-1]["eval_loss"] = 3.5
    init = {"w": np.zeros(10), "b": np.ones(3)}
    final = {"w": np.linspace(1, 2, 10), "b": np.full(3, 1.5)}
    same, _ = gpt_parity.compare_gpt(copy.deepcopy(steps), steps, final, final, init, "fp32")

    def problems(mutate_steps=None, tensors=None):
        ours = copy.deepcopy(steps)
        if mutate_steps:
            mutate_steps(ours)
        return gpt_parity.compare_gpt(ours, steps, tensors or final, final, init, "fp32")[0]
    cases = {
        "loss": problems(lambda s: s[1].update(loss=s[1]["loss"] * (1 + 3e-5))),
        "grad norm": problems(lambda s: s[2].update(grad_norm=1.5 * (1 + 3e-4))),
        "eval loss": problems(lambda s: s[3].update(eval_loss=3.5 * (1 + 3e-5))),
        "lr": problems(lambda s: s[0].update(lr=0.0100001)),
        "missing last step": problems(lambda s: s.pop()),
        "parameters": problems(tensors={"w": final["w"] * (1 + 1e-4), "b": final["b"]}),
        "names": problems(tensors={"w": final["w"]}),
    }
    within = problems(lambda s: s[1].update(loss=s[1]["loss"] * (1 + 3e-6)))
    ok = not same and not within and all(cases.values())
    check("(h) compare_gpt", ok, "identical: no problems; flagged: " + ", ".join(
        f"{k} ({len(v)})" for k, v in cases.items()))


# SGD for the exact-arithmetic checks (b), (c): AdamW divides each gradient element by its own
# magnitude, so elements near 0 turn ulp-sized differences of summation order into lr-sized
# steps (its run is checked against the measured floor instead).
SGD = {"kind": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}


def spec_for(tmp, world, B, accumulation, precision, steps=10, eval_batches=2, optimizer=None):
    return gpt_parity.write_case("selftest", dict(
        world_size=world, micro_batch_size=B, accumulation_steps=accumulation, steps=steps,
        precision=precision, eval_batches=eval_batches,
        optimizer=optimizer or gpt_parity.OPTIMIZER), os.path.join(tmp, "data"))


def run_world(tmp, name, spec):
    case_dir = os.path.join(tmp, name)
    os.makedirs(case_dir, exist_ok=True)
    spec = gpt_parity.prepare(spec, case_dir)
    steps = ref.run_ranks(os.path.join(case_dir, "case.json"), case_dir, spec["world_size"])
    return steps, ref.read_hf_checkpoint(os.path.join(case_dir, "torch_final"))


def run_here(spec, init_dir, perturb=0.0):
    """World 1 in this process (its gloo group is already up)."""
    spec = dict(spec, init_checkpoint=os.path.join(init_dir, "model.safetensors"))
    steps, model = ref.train(spec, perturb=perturb)
    return steps, ref.hf_tensors(model)


def worst(a, b):
    return max(max_rel(a[0], b[0], "loss"), max_rel(a[0], b[0], "grad_norm"),
               param_rel(a[1], b[1]))


def summary(a, b):
    evals = [[s for s in run[0] if "eval_loss" in s] for run in (a, b)]
    return (f"loss {max_rel(a[0], b[0], 'loss'):.3g}, grad norm "
            f"{max_rel(a[0], b[0], 'grad_norm'):.3g}, eval {max_rel(*evals, 'eval_loss'):.3g}, "
            f"params {param_rel(a[1], b[1]):.3g}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    tmp = args.out or tempfile.mkdtemp(prefix="gpt_reference_test.")
    os.makedirs(tmp, exist_ok=True)
    started = time.time()
    torch.set_num_threads(1)
    test_attention()
    test_hf_layout(tmp)
    test_bf16_flow()
    test_loader(tmp)
    test_compare()
    test_recipe_gemm()

    # Every run starts from the same initial weights (the seed's, written once).
    base = spec_for(tmp, 1, 4, 1, "fp32")
    gpt_parity.prepare(base, tmp)
    init_dir = os.path.join(tmp, "init")
    init_path = os.path.join(init_dir, "model.safetensors")
    # One rank needs no rendezvous over TCP (a port probed free could be taken meanwhile).
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    # (b), (c): the same 4 (6) sequences per step, cut across ranks and micro-batches.
    sgd1 = run_here(spec_for(tmp, 1, 4, 1, "fp32", optimizer=SGD), init_dir)
    sgd2 = run_world(tmp, "w2_sgd", dict(spec_for(tmp, 2, 2, 1, "fp32", optimizer=SGD),
                                         init_checkpoint=init_path))
    check("(b) world 2 (B=2) == world 1 (B=4), fp32, SGD", worst(sgd2, sgd1) < 1e-6,
          summary(sgd2, sgd1))
    sgd3 = run_world(tmp, "w3_sgd", dict(spec_for(tmp, 3, 2, 1, "fp32", optimizer=SGD),
                                         init_checkpoint=init_path))
    sgd1_6 = run_here(spec_for(tmp, 1, 6, 1, "fp32", optimizer=SGD), init_dir)
    check("(b) world 3 (B=2) == world 1 (B=6), fp32, SGD", worst(sgd3, sgd1_6) < 1e-6,
          summary(sgd3, sgd1_6))
    accum = run_world(tmp, "w2_accum_sgd", dict(
        spec_for(tmp, 2, 1, 2, "fp32", eval_batches=4, optimizer=SGD), init_checkpoint=init_path))
    check("(c) world 2: 2 micro-batches of 1 (no_sync) == 1 of 2, fp32, SGD",
          worst(accum, sgd2) < 1e-6, summary(accum, sgd2))

    # AdamW (the cases' optimizer) from here on.
    fp32 = run_here(base, init_dir)
    losses = [s["loss"] for s in fp32[0]]
    check("training learns", losses[-1] < losses[0] - 0.15,
          f"fp32 loss {losses[0]:.4f} -> {losses[-1]:.4f}, eval {fp32[0][-1]['eval_loss']:.4f}, "
          f"parameters moved {param_rel(fp32[1], ref.read_hf_checkpoint(init_dir)):.3g}")
    bf16_spec = dict(base, precision="bf16")
    model = ref.build_model(dict(base, init_checkpoint=init_path))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits_dtype = model(torch.zeros(1, 4, dtype=torch.long)).dtype
    bf16 = run_here(bf16_spec, init_dir)
    loss_gap = max_rel(bf16[0], fp32[0], "loss")
    check("(e) bf16 autocast: bf16 logits, losses near fp32", logits_dtype == torch.bfloat16 and
          1e-6 < loss_gap < 3e-2, f"logits {logits_dtype}; bf16 vs fp32: {summary(bf16, fp32)}")

    floors = {}
    for precision, spec, reference in (("fp32", base, fp32), ("bf16", bf16_spec, bf16)):
        nudged = run_here(spec, init_dir, perturb=1e-7)
        moved = (max_rel(nudged[0], reference[0], "loss"),
                 max_rel(nudged[0], reference[0], "grad_norm"), param_rel(nudged[1], reference[1]))
        floors[precision] = moved
        tolerances = (gpt_parity.LOSS_TOL[precision], gpt_parity.GRAD_NORM_TOL[precision],
                      gpt_parity.PARAM_TOL[precision])
        check(f"(f) {precision}: init nudged by 1e-7 moves the run by less than a tenth of "
              f"gpt_parity's tolerances {tolerances}",
              all(m < t / 10 for m, t in zip(moved, tolerances)), summary(nudged, reference))
    adam2 = run_world(tmp, "w2_accum_adamw", dict(
        spec_for(tmp, 2, 1, 2, "fp32", eval_batches=4), init_checkpoint=init_path))
    steps_err = max(max_rel(adam2[0], fp32[0], k) for k in ("loss", "grad_norm"))
    check("(b, c) AdamW: world 2 x 2 micro-batches of 1 == world 1 (B=4): steps to 1e-6, "
          "parameters within 3x the fp32 floor (f)", steps_err < 1e-6 and
          param_rel(adam2[1], fp32[1]) < 3 * floors["fp32"][2], summary(adam2, fp32))
    print(f"{len(failures)} failed; {time.time() - started:.1f} s; outputs in {tmp}")
    sys.stdout.flush()
    os._exit(1 if failures else 0)  # As the reference: no destroy_process_group() under 1.13.


if __name__ == "__main__":
    main()
