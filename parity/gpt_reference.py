"""The GPT-2 language model (model.gpt) in PyTorch, independent of our C++: the reference that
the service's GPT is proven against (issue 28), as nanoGPT's model.py and llm.c's
train_gpt2.py build it, trained by the original example's loop (DDP + autocast + GradScaler +
no_sync on accumulation micro-batches, as parity/pytorch_reference.py does for the MLP).

Model. wte [Vp, C] (Vp = padded_vocab_size >= V), wpe [T, C]; x = wte[idx] + wpe[pos];
`layers` blocks x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)); ln_f; logits = x @ wte^T (the LM
head tied to wte, no bias), [B, T, Vp]; loss = mean cross-entropy over the B*T positions on
logits[..., :V] in fp32. Attention, written out (PyTorch 1.13 has no
scaled_dot_product_attention): qkv = c_attn(x) split into q, k, v [C each, in that order], each
viewed [B, T, H, hs] -> [B, H, T, hs] (hs = C/H, head h = columns h*hs..(h+1)*hs-1);
att = (q @ k^T) * (1/sqrt(hs)); att = masked_fill(key > query, -inf); att = softmax(att, -1);
y = att @ v -> [B, T, C] (heads side by side); c_proj. MLP: c_fc, GELU(approximate='tanh')
(HF's gelu_new), c_proj. LayerNorm eps 1e-5. No dropout.

The padded vocabulary, as llm.c (train_gpt2.cu's fused_classifier and its export_hf.py): the
logits of ids V..Vp-1 are computed (the GEMM is over Vp rows) but excluded from the softmax, so
they carry no loss and get a gradient of exactly 0; those rows of wte get no gradient from the
embedding either (token ids are < V), so their gradient is exactly 0: AdamW's moments stay 0 and
its update is 0; only the decoupled weight decay shrinks them (p *= 1 - lr*wd). They are never
observable: not in a loss, a grad norm or a checkpoint (below).

Checkpoints: Hugging Face GPT-2 layout (GPT2LMHeadModel.from_pretrained(dir) loads them):
<dir>/model.safetensors (F32; header metadata {"format": "pt"}, which transformers requires) and
<dir>/config.json. Names: transformer.wte.weight [V, C] (the padding stripped, as llm.c's
export_hf.py does: config.json's vocab_size is V, and "mptrain_padded_vocab_size" says Vp),
transformer.wpe.weight [T, C], transformer.h.{i}.ln_1.weight/.bias [C],
transformer.h.{i}.attn.c_attn.weight [C, 3C] and .bias [3C], transformer.h.{i}.attn.c_proj.weight
[C, C] and .bias, transformer.h.{i}.ln_2.*, transformer.h.{i}.mlp.c_fc.weight [C, 4C] and .bias
[4C], transformer.h.{i}.mlp.c_proj.weight [4C, C] and .bias [C], transformer.ln_f.*; the tied
lm_head.weight is not stored. HF's Conv1D computes x @ W + b, so every HF matrix is the
transpose of nn.Linear's weight ([out, in]). Loading a checkpoint with V rows into a model with
Vp > V gives zero padded rows (llm.c pads with zeros), which then stay exactly 0 (the
paragraph above): a run that starts from a checkpoint is fully described by its V rows. A
checkpoint with Vp rows is taken as it is.

Precision. fp32: every op in fp32, no autocast. bf16: torch.autocast(device, bfloat16), and the
dtype of every op is pinned here explicitly where PyTorch's autocast lists differ between
versions and devices (1.13's CPU list runs softmax in bf16 and refuses layer_norm on bf16
input; CUDA's runs both in fp32), so the same flow holds on Debian's CPU 1.13 and on the GPU.
The forward, op by op (B = bf16, F = fp32; "GEMM" = bf16 inputs and output, fp32 accumulation,
pinned by autocast_gemm.py where a CPU's PyTorch 1.13 rounds at every step instead):
  wte[idx] + wpe[pos]            F (embeddings are on no autocast list; the sum is F)
  ln_1, ln_2, ln_f               F in, F out (run on x.float() with autocast disabled: autocast's
                                 fp32-list semantics); mean and variance in F
  c_attn, c_proj, c_fc, mlp.c_proj  GEMM: x and the fp32 master weight and bias each rounded to
                                 B (autocast's cast, once per forward); output = B rounding of
                                 the F sum x.W^T + b (the bias added before the one rounding)
  q @ k^T                        GEMM (batched), output B
  * (1/sqrt(hs))                 F product of the B score and the F scale, rounded to B (pinned:
                                 1.13 would round the scale to B first; exact for hs = 4^n)
  masked_fill(-inf)              B
  softmax                        F: the B scores widened to F, softmax in F, output F
  att @ v                        GEMM: att rounded to B (autocast), v B, output B
  GELU (tanh)                    B in, B out: computed in F from the B input, rounded once to B
                                 (pinned: 1.13's bf16 kernel rounds intermediates)
  x + attn(...), x + mlp(...)    F + B -> F (type promotion: the B value widened exactly)
  x @ wte^T (logits)             GEMM: wte rounded to B, logits [B, T, Vp] in B
  cross-entropy                  F, on logits[..., :V] widened to F (autocast's fp32 list)
Backward: autograd's mirror of that flow: a gradient enters each op in that op's output dtype
and leaves in its input's. So the gradient into each GEMM's output is B, and dX, dW (GEMMs)
and db (the sum over rows, accumulated in F inside the kernel) are each rounded to B; dW and db
are widened to F at autocast's cast of the master weight and accumulated in F into .grad
(micro-batches add in F, DDP averages in F): every Linear's weight and bias gradient of one
micro-batch is bf16-representable, while LayerNorm's, wpe's and wte's are not;
the residual stream's gradient is F and is rounded to B where it enters a branch's B output;
softmax's backward runs in F on its F output with the F-widened B gradient, its input gradient
rounded to B; the scale's and GELU's backward run in F on the widened B gradient (GELU's
derivative at the widened B input), the result rounded to B; LayerNorm's backward is F; wte's
gradient is the F embedding gradient plus the (B-rounded, widened) logits GEMM's weight
gradient. Parameters, gradients, AdamW's moments and
the update are F. GradScaler: disabled for bf16 and fp32 (CUDA fp16 runs use it).

Training, per rank, as pytorch_reference.py: every optimizer step takes accumulation_steps
micro-batches of micro_batch_size sequences from the token loader (token_batches.py, llm.c's
DataLoader); each micro-batch's loss is divided by accumulation_steps before backward; all but
the last run under DDP's no_sync (gloo on the CPU, gradients averaged over ranks: measured on
1.13, DDP multiplies each rank's fp32 gradient by fp32(1/W) and then gloo's ring sums the ranks'
values in an order that depends on the element's chunk; exact for W = 2); then the
gradients are unscaled, their global L2 norm taken (torch.nn.utils.clip_grad_norm_'s: the norm of
the per-tensor norms) and, with max_grad_norm > 0, clipped; the optimizer (AdamW, Adam or SGD
from pytorch_reference.make_optimizer, fused/foreach off) steps with nanoGPT's two parameter
groups (weight decay on tensors of dim >= 2: wte, wpe and the four matrices of each block;
none on biases and LayerNorms); the LR schedule steps once per step.
Per step it records (rank 0, torch_steps.json): loss = the sum over micro-batches of loss /
accumulation_steps, averaged over ranks (what our telemetry reports); grad_norm (before
clipping); lr (the rate the step used); loss_scale 1.0 and skipped false (bf16/fp32); and on
evaluation steps (every eval_every steps and after the last) eval_loss = the mean loss over
eval_batches micro-batches of every rank cut from the start of eval_tokens (never shuffled),
reduced over ranks.

Usage (one process per rank, env:// rendezvous; run_ranks() starts them):
  python3 gpt_reference.py init --case CASE --out DIR     initial weights (spec.seed) -> DIR
  RANK=r WORLD_SIZE=w MASTER_ADDR=127.0.0.1 MASTER_PORT=p \\
  python3 gpt_reference.py train --case CASE --out DIR    -> DIR/torch_steps.json, DIR/torch_final/
  python3 gpt_reference.py logits --checkpoint DIR --tokens 1,2,3 [--precision bf16]
CASE is {"spec": JobSpec as JSON (snake_case names)}: model.gpt, data.tokens, eval_tokens, ...;
spec.init_checkpoint (a model.safetensors in HF layout) overrides the seed's initialisation.
"""
import argparse
import contextlib
import datetime
import glob
import json
import math
import os
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from autocast_gemm import Linear, linear, matmul  # noqa: E402
from pytorch_reference import make_optimizer, make_scaler, make_scheduler  # noqa: E402

LAYER_NORM_EPS = 1e-5
INIT_STD = 0.02

# ---------------------------------------------------------------------------------------------
# The model.


class GptConfig:
    def __init__(self, vocab_size, context_length, layers, heads, width, padded_vocab_size=0):
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.vocab_size = int(vocab_size)
        self.padded_vocab_size = int(padded_vocab_size) or self.vocab_size
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(f"padded_vocab_size {padded_vocab_size} < vocab_size {vocab_size}")
        self.context_length, self.layers = int(context_length), int(layers)
        self.heads, self.width = int(heads), int(width)

    @classmethod
    def from_spec(cls, gpt):
        return cls(gpt["vocab_size"], gpt["context_length"], gpt["layers"], gpt["heads"],
                   gpt["width"], gpt.get("padded_vocab_size", 0))


def at_least_fp32(t):
    """bf16/fp16 widened to fp32; fp32 and float64 as they are (the float64 self-tests)."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def in_fp32_rounded(op, t):
    """op on a bf16/fp16 tensor computed in fp32 and rounded back to its dtype once (fp32 and
    float64 as they are): PyTorch 1.13's own bf16 kernels round a python scalar to bf16 before
    a multiply and round GELU's intermediates (40% of outputs differ by an ulp, measured), so
    the reference pins llm.c's semantics: load as fp32, compute, store rounded."""
    if t.dtype in (torch.bfloat16, torch.float16):
        return op(t.float()).to(t.dtype)
    return op(t)


# train --sdpa (the GPU proof, gpt_parity.py --device cuda): attention through PyTorch's fused
# F.scaled_dot_product_attention(is_causal=True) (flash / cuDNN / memory-efficient, as PyTorch
# picks; PyTorch >= 2.0), as nanoGPT's flash path and as our CUDA backend's cuDNN attention:
# scores and probabilities stay in fp32 on chip, only the output is rounded.
USE_SDPA = False


def causal_attention(q, k, v):
    """q, k, v [B, H, T, hs] -> [B, H, T, hs]: softmax((q k^T) / sqrt(hs), causal) v, written
    out as nanoGPT's non-flash path; the softmax in (at least) fp32 (module docstring)."""
    if USE_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.size(-2)
    att = in_fp32_rounded(lambda s: s * (1.0 / math.sqrt(k.size(-1))),
                          matmul(q, k.transpose(-2, -1)))
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = att.masked_fill(causal.logical_not(), float("-inf"))
    att = F.softmax(at_least_fp32(att), dim=-1)
    return matmul(att, v)  # Under autocast: att rounded to the low dtype, as v.


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (eps 1e-5) on its input widened to fp32, autocast disabled: autocast's
    fp32-list semantics, which PyTorch 1.13's CPU autocast lacks for layer_norm."""

    def __init__(self, width):
        super().__init__(width, eps=LAYER_NORM_EPS)

    def forward(self, x):
        with torch.autocast(device_type=x.device.type, enabled=False):
            return F.layer_norm(at_least_fp32(x), self.normalized_shape, self.weight, self.bias,
                                self.eps)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.heads
        self.c_attn = Linear(config.width, 3 * config.width)
        self.c_proj = Linear(config.width, config.width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = Linear(config.width, 4 * config.width)
        self.c_proj = Linear(4 * config.width, config.width)

    def forward(self, x):
        return self.c_proj(in_fp32_rounded(lambda h: F.gelu(h, approximate="tanh"), self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.width)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.width)
        self.mlp = Mlp(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    """Parameter names are nanoGPT's, which are Hugging Face's (hf_tensors transposes)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.padded_vocab_size, config.width),
            wpe=nn.Embedding(config.context_length, config.width),
            h=nn.ModuleList([Block(config) for _ in range(config.layers)]),
            ln_f=LayerNorm(config.width)))

    def forward(self, idx):
        """idx [B, T] int64 -> logits [B, T, Vp] (the autocast dtype under autocast)."""
        T = idx.size(1)
        if T > self.config.context_length:
            raise ValueError(f"{T} tokens > context_length {self.config.context_length}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return linear(self.transformer.ln_f(x), self.transformer.wte.weight)

    def loss(self, logits, targets):
        """Mean cross-entropy over every position, on the real vocabulary's logits in fp32."""
        V = self.config.vocab_size
        return F.cross_entropy(logits[..., :V].float().reshape(-1, V), targets.reshape(-1))


def init_gpt2(model, seed):
    """GPT-2's initialisation (nanoGPT's _init_weights): normal(0, 0.02) for every Linear weight
    and both embeddings, 0.02/sqrt(2*layers) for attn.c_proj and mlp.c_proj weights, zero
    biases, LayerNorm 1 / 0. Drawn from torch.Generator().manual_seed(seed), tensor after tensor
    in named_parameters order (wte, wpe, then each block's). Our C++ draws with its own RNG:
    parity runs start both sides from the checkpoint this writes (write_hf_checkpoint)."""
    generator = torch.Generator().manual_seed(int(seed))
    residual_std = INIT_STD / math.sqrt(2 * model.config.layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or name.startswith("transformer.ln_f."):
                p.fill_(1.0 if name.endswith(".weight") else 0.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                std = residual_std if name.endswith("c_proj.weight") else INIT_STD
                p.normal_(0.0, std, generator=generator)


def parameter_groups(model, weight_decay):
    """nanoGPT's configure_optimizers: decay on tensors of dim >= 2, none on the rest."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


# ---------------------------------------------------------------------------------------------
# Hugging Face layout and safetensors (Debian has no python3-safetensors).

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
SAFETENSORS_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2), "F64": ("<f8", 8)}
MAX_HEADER_BYTES = 100 << 20


def save_safetensors(tensors, path, metadata=None):
    """name -> float32 array, as safetensors: an 8-byte little-endian header length, the JSON
    header (padded with spaces to 8 bytes), then the tensors' bytes back to back in name order."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        blob = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(np.shape(tensors[name])),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def load_safetensors(path):
    """(name -> float32 array, metadata dict). F32, F16, BF16 and F64 tensors; a malformed file
    is a ValueError naming the file and what is wrong (never its bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes, shorter than the 8-byte header length")
    length = struct.unpack("<Q", data[:8])[0]
    if length > min(MAX_HEADER_BYTES, len(data) - 8):
        raise ValueError(f"{path}: header length {length} exceeds the file or {MAX_HEADER_BYTES}")
    try:
        header = json.loads(data[8:8 + length])
    except ValueError:
        raise ValueError(f"{path}: the header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header is not a JSON object")
    body = memoryview(data)[8 + length:]
    metadata = header.pop("__metadata__", None) or {}
    tensors = {}
    for index, (name, info) in enumerate(header.items()):
        try:
            kind, size = SAFETENSORS_DTYPES[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: tensor #{index}: bad or unsupported dtype/shape/offsets") \
                from None
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= len(body) or \
                end - begin != int(np.prod(shape, dtype=np.int64)) * size:
            raise ValueError(f"{path}: tensor #{index}: shape and offsets do not fit the file")
        raw = np.frombuffer(body[begin:end], dtype=kind)
        if info["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = raw.astype(np.float32).reshape(shape)
    return tensors, metadata


def hf_tensors(model):
    """The model's parameters under Hugging Face GPT-2 names and shapes (float32 numpy): Conv1D
    matrices transposed, wte cut to the real vocabulary, the tied head not stored."""
    out = {}
    for name, p in model.named_parameters():
        value = p.detach().float().cpu().numpy()
        if name.endswith(CONV1D):
            value = value.T
        if name == "transformer.wte.weight":
            value = value[:model.config.vocab_size]
        out[name] = np.ascontiguousarray(value)
    return out


def load_hf_tensors(model, tensors):
    """Copies HF-layout tensors into the model (transposing Conv1D matrices); wte may have V or
    Vp rows (V: the padded rows become 0). Every parameter must be there with its shape."""
    params = dict(model.named_parameters())
    if sorted(params) != sorted(tensors):
        raise ValueError(f"checkpoint names differ: {sorted(set(params) ^ set(tensors))[:8]}")
    with torch.no_grad():
        for name, p in params.items():
            value = torch.from_numpy(np.asarray(tensors[name], dtype=np.float32))
            if name.endswith(CONV1D):
                value = value.t()
            if name == "transformer.wte.weight" and value.shape[0] == model.config.vocab_size:
                value = torch.cat([value, value.new_zeros(p.shape[0] - value.shape[0], p.shape[1])])
            if tuple(value.shape) != tuple(p.shape):
                raise ValueError(
                    f"{name}: shape {tuple(value.shape)}, the model has {tuple(p.shape)}")
            p.copy_(value)


def hf_config(config):
    """config.json for GPT2LMHeadModel (transformers' GPT2Config fields)."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": config.vocab_size, "n_positions": config.context_length,
        "n_ctx": config.context_length, "n_embd": config.width, "n_layer": config.layers,
        "n_head": config.heads, "n_inner": None, "activation_function": "gelu_new",
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "layer_norm_epsilon": LAYER_NORM_EPS, "initializer_range": INIT_STD,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "tie_word_embeddings": True, "use_cache": True,
        "bos_token_id": None, "eos_token_id": None, "torch_dtype": "float32",
        "mptrain_padded_vocab_size": config.padded_vocab_size,
    }


def write_hf_checkpoint(model_or_tensors, config, directory):
    """<directory>/model.safetensors and config.json; returns the safetensors path."""
    os.makedirs(directory, exist_ok=True)
    tensors = (hf_tensors(model_or_tensors) if isinstance(model_or_tensors, nn.Module)
               else model_or_tensors)
    path = os.path.join(directory, "model.safetensors")
    save_safetensors(tensors, path, metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config(config), f, indent=2)
    return path


def read_hf_checkpoint(path):
    """A model.safetensors (or the directory holding it) -> name -> float32 array."""
    if os.path.isdir(path):
        path = os.path.join(path, "model.safetensors")
    return load_safetensors(path)[0]


# ---------------------------------------------------------------------------------------------
# Token batches: token_batches.py (llm.c's DataLoader) when present, else a minimal unshuffled
# copy of its cut.

LLMC_MAGIC, LLMC_VERSION, LLMC_HEADER_INTS = 20240520, 1, 256


def write_token_file(path, tokens, raw=False):
    """An llm.c shard (256 int32 header: magic, version, count; uint16 tokens) or a raw uint16
    file (nanoGPT's train.bin)."""
    tokens = np.asarray(tokens, dtype="<u2")
    with open(path, "wb") as f:
        if not raw:
            header = np.zeros(LLMC_HEADER_INTS, dtype="<i4")
            header[:3] = (LLMC_MAGIC, LLMC_VERSION, tokens.size)
            f.write(header.tobytes())
        f.write(tokens.tobytes())


def _read_token_file(path):
    data = np.fromfile(path, dtype="<u2")
    header = data[:2 * LLMC_HEADER_INTS].view("<i4") if data.size >= 2 * LLMC_HEADER_INTS else None
    if header is not None and header[0] == LLMC_MAGIC:
        count = int(header[2])
        if header[1] != LLMC_VERSION or data.size - 2 * LLMC_HEADER_INTS != count:
            raise ValueError(f"{path}: bad llm.c shard header")
        return data[2 * LLMC_HEADER_INTS:]
    return data


def _own_batches(files, B, T, rank, world, count, shuffle=False, seed=0):
    """llm.c's DataLoader without shuffling: sample s of a shard is the window starting at
    s*W*B*T + r*B*T (B*T+1 tokens: x the first B*T, y shifted by one); a shard holds
    (tokens - 1) // (W*B*T) samples; after its last, the next shard (the first after the last)."""
    if shuffle:
        raise NotImplementedError("shuffled token batches need parity/token_batches.py")
    shards = [_read_token_file(f) for f in files]
    stride = world * B * T
    for f, tokens in zip(files, shards):
        if tokens.size < stride + 1:
            raise ValueError(f"{f}: {tokens.size} tokens < W*B*T+1 = {stride + 1}")
    out, shard, sample = [], 0, 0
    while len(out) < count:
        if sample >= (shards[shard].size - 1) // stride:
            shard, sample = (shard + 1) % len(shards), 0
            continue
        begin = sample * stride + rank * B * T
        window = shards[shard][begin:begin + B * T + 1].astype(np.int64)
        out.append((window[:-1], window[1:]))
        sample += 1
    return out


try:
    from token_batches import batches as token_batches  # noqa: E402
except ImportError:
    token_batches = _own_batches


def expand_files(patterns):
    """TokenData.files: a path whose last component holds * or ? is a sorted glob."""
    files = []
    for pattern in patterns:
        if any(c in os.path.basename(pattern) for c in "*?"):
            files.extend(sorted(glob.glob(pattern)))
        else:
            files.append(pattern)
    return files


def micro_batches(tokens_spec, B, T, rank, world, count, vocab_size):
    """count (x, y) pairs of int64 tensors [B, T] for this rank; an id >= vocab_size is an error
    (one in [V, Vp) would otherwise select a padded row of wte)."""
    pairs = token_batches(expand_files(tokens_spec["files"]), B, T, rank, world, count,
                          shuffle=tokens_spec.get("shuffle", False),
                          seed=tokens_spec.get("shuffle_seed", 0))
    out = []
    for x, y in pairs:
        x, y = (torch.as_tensor(np.asarray(a, dtype=np.int64)).view(B, T) for a in (x, y))
        if int(max(x.max(), y.max())) >= vocab_size:
            raise ValueError(f"a token id >= vocab_size {vocab_size} in {tokens_spec['files']}")
        out.append((x, y))
    return out


# ---------------------------------------------------------------------------------------------
# Training.


def autocast_for(precision, device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if dtype is None:
        return contextlib.nullcontext
    if device.type == "cpu" and dtype != torch.bfloat16:
        raise SystemExit("CPU autocast is bf16 only")
    return lambda: torch.autocast(device.type, dtype=dtype)


def grad_norm(parameters):
    """clip_grad_norm_'s total norm: the L2 norm of the per-tensor L2 norms."""
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    return torch.norm(torch.stack([torch.norm(g, 2.0) for g in grads]), 2.0)


def build_model(spec, device=torch.device("cpu")):
    """The model of spec.model.gpt, from spec.init_checkpoint (HF layout) or else spec.seed."""
    config = GptConfig.from_spec(spec["model"]["gpt"])
    model = Gpt(config)
    if spec.get("init_checkpoint"):
        load_hf_tensors(model, read_hf_checkpoint(spec["init_checkpoint"]))
    else:
        init_gpt2(model, spec.get("seed", 0))
    return model.to(device)


def train(spec, device=torch.device("cpu"), perturb=0.0):
    """The job on this rank (the process group already initialised). Returns (steps, model):
    the per-step records (module docstring; on every rank) and the trained module.
    perturb: each initial parameter multiplied by (1 + perturb * N(0, 1)) (seed 1234), for the
    self-test that measures how far a run moves from rounding-sized changes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = device.type == "cuda"
    model = build_model(spec, device)
    if perturb:
        generator = torch.Generator().manual_seed(1234)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.0 + perturb * torch.randn(p.shape, generator=generator).to(device))
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if cuda else None)
    precision = spec.get("precision", "fp16").lower()
    autocast = autocast_for(precision, device)
    B, T = spec["micro_batch_size"], model.config.context_length
    accumulation, total = spec.get("accumulation_steps", 1), spec["steps"]
    V = model.config.vocab_size
    data = micro_batches(spec["data"]["tokens"], B, T, rank, world, total * accumulation, V)
    evaluation = None
    if spec.get("eval_tokens"):
        evaluation = micro_batches(spec["eval_tokens"], B, T, rank, world,
                                   spec.get("eval_batches", 20), V)

    def evaluate():
        total_loss = torch.zeros((), dtype=torch.float64, device=device)
        with torch.no_grad():
            for x, y in evaluation:
                with autocast():
                    total_loss += model.loss(model(x.to(device)), y.to(device)).double()
        dist.all_reduce(total_loss)
        return total_loss.item() / (world * len(evaluation))

    scaler, scaler_enabled = make_scaler(cuda, spec)
    weight_decay = spec["optimizer"].get("weight_decay", 0.0)
    optimizer = make_optimizer(parameter_groups(model, weight_decay), spec)
    scheduler = make_scheduler(optimizer, spec)
    max_grad_norm = spec.get("max_grad_norm", 0.0)
    eval_every = spec.get("eval_every", 0)
    steps = []
    for step in range(1, total + 1):
        step_loss = torch.zeros((), device=device)
        lr = optimizer.param_groups[0]["lr"]
        for micro in range(accumulation):
            x, y = data[(step - 1) * accumulation + micro]
            stepping = micro == accumulation - 1
            with contextlib.nullcontext() if stepping else ddp.no_sync():
                with autocast():
                    loss = model.loss(ddp(x.to(device)), y.to(device)) / accumulation
                scaler.scale(loss).backward()
            step_loss += loss.detach()
        scale_used = scaler.get_scale() if scaler_enabled else 1.0
        scaler.unscale_(optimizer)
        norm = grad_norm(model.parameters())
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        if scheduler is not None:
            scheduler.step()
        skipped = scaler_enabled and scaler.get_scale() < scale_used
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(step_loss)  # Telemetry only (SUM: gloo has no AVG).
        record = {"step": step, "loss": step_loss.item() / world, "grad_norm": norm.item(),
                  "loss_scale": scale_used, "skipped": bool(skipped), "lr": lr}
        if evaluation is not None and ((eval_every > 0 and step % eval_every == 0)
                                       or step == total):
            record["eval_loss"] = evaluate()
        steps.append(record)
    return steps, model


# ---------------------------------------------------------------------------------------------
# Sampling: the logits our sampler is compared on, and nanoGPT's generate.


def last_logits(model, tokens, precision="fp32"):
    """The fp32 logits [V] of the position after `tokens` (the context cut to its last
    context_length tokens), under the precision's autocast."""
    device = next(model.parameters()).device
    idx = torch.as_tensor(list(tokens)[-model.config.context_length:], dtype=torch.long,
                          device=device).view(1, -1)
    with torch.no_grad(), autocast_for(precision, device)():
        logits = model(idx)
    return logits[0, -1, :model.config.vocab_size].float()


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=0, seed=0, precision="fp32"):
    """nanoGPT's generate: logits / temperature, the top_k largest kept (0: all), softmax,
    torch.multinomial from torch.Generator().manual_seed(seed). top_k=1 is greedy decoding
    (argmax, the lowest id on a tie): the case our sampler is compared on token for token."""
    generator = torch.Generator().manual_seed(int(seed))
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        logits = last_logits(model, tokens, precision)
        if top_k == 1:
            tokens.append(int(torch.argmax(logits)))
            continue
        logits = logits / temperature
        if top_k:
            kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = F.softmax(logits, dim=-1).cpu()
        tokens.append(int(torch.multinomial(probs, 1, generator=generator)))
    return tokens[len(prompt):]


# ---------------------------------------------------------------------------------------------
# Processes.


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(case_path, out_dir, world, timeout=600, extra=()):
    """`world` processes of this file's `train` (gloo, env:// on a free loopback port); raises
    with the ranks' logs when one fails. Their outputs land in out_dir. Once more on another
    port when the one chosen was taken before PyTorch bound it (other tests pick ports too)."""
    for attempt in range(3):
        try:
            return _run_ranks_once(case_path, out_dir, world, timeout, extra)
        except RuntimeError as error:
            # PyTorch 1.13 says "Address already in use", 2.x "address already in use" /
            # EADDRINUSE.
            taken = "address already in use" in str(error).lower() or "EADDRINUSE" in str(error)
            if not taken or attempt == 2:
                raise


def _run_ranks_once(case_path, out_dir, world, timeout, extra):
    os.makedirs(out_dir, exist_ok=True)
    port, processes = str(free_port()), []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, OMP_NUM_THREADS="1")
        log = open(os.path.join(out_dir, f"torch_rank{rank}.log"), "w")
        processes.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "train", "--case", case_path, "--out",
             out_dir, *extra], stdout=log, stderr=subprocess.STDOUT, env=env))
        log.close()
    deadline = time.time() + timeout
    while any(p.poll() is None for p in processes) and time.time() < deadline:
        if any(p.poll() not in (None, 0) for p in processes):
            break  # One failed: the others would wait for it.
        time.sleep(0.05)
    for p in processes:
        if p.poll() is None:
            p.kill()
    codes = [p.wait() for p in processes]
    if any(codes):
        logs = "".join(open(os.path.join(out_dir, f"torch_rank{r}.log")).read()[-3000:]
                       for r in range(world))
        raise RuntimeError(f"GPT reference failed ({codes}):\n{logs}")
    with open(os.path.join(out_dir, "torch_steps.json")) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="write the initial weights (spec.seed) in HF layout")
    init.add_argument("--case", required=True)
    init.add_argument("--out", required=True)
    run = sub.add_parser("train", help="one rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
    run.add_argument("--case", required=True)
    run.add_argument("--out", required=True)
    run.add_argument("--perturb", type=float, default=0.0)
    run.add_argument("--sdpa", action="store_true",
                     help="attention through F.scaled_dot_product_attention (PyTorch >= 2.0)")
    logits = sub.add_parser("logits", help="the last position's logits, as JSON")
    logits.add_argument("--checkpoint", required=True, help="an HF-layout directory")
    logits.add_argument("--tokens", required=True, help="comma-separated token ids")
    logits.add_argument("--precision", default="fp32")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.command == "logits":
        with open(os.path.join(args.checkpoint, "config.json")) as f:
            hf = json.load(f)
        config = GptConfig(hf["vocab_size"], hf["n_positions"], hf["n_layer"], hf["n_head"],
                           hf["n_embd"], hf.get("mptrain_padded_vocab_size", 0))
        model = Gpt(config)
        load_hf_tensors(model, read_hf_checkpoint(args.checkpoint))
        tokens = [int(t) for t in args.tokens.split(",")]
        print(json.dumps(last_logits(model, tokens, args.precision).tolist()))
        return 0
    with open(args.case) as f:
        spec = json.load(f)["spec"]
    if args.command == "init":
        model = Gpt(GptConfig.from_spec(spec["model"]["gpt"]))
        init_gpt2(model, spec.get("seed", 0))
        print(write_hf_checkpoint(model, model.config, args.out))
        return 0
    if args.sdpa:
        if not hasattr(F, "scaled_dot_product_attention"):
            raise SystemExit("--sdpa needs PyTorch >= 2.0 (F.scaled_dot_product_attention)")
        global USE_SDPA
        USE_SDPA = True
    cuda = spec.get("device", "cpu").lower() == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=300))
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        device = torch.device("cpu")
    steps, model = train(spec, device, perturb=args.perturb)
    if dist.get_rank() == 0:
        write_hf_checkpoint(model, model.config, os.path.join(args.out, "torch_final"))
        with open(os.path.join(args.out, "torch_steps.json"), "w") as f:
            json.dump(steps, f)
    dist.barrier()
    # As pytorch_reference.py: no destroy_process_group() (1.13 + gloo was seen to hang there).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
