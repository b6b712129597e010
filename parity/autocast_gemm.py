"""Autocast's low-precision GEMM on every CPU: bf16 operands, fp32 accumulation, one rounding.

Autocast's recipe, and what every GPU, oneDNN and PyTorch >= 2.0's CPU fallback compute (and
our backends): a bf16 GEMM reads bf16 operands, accumulates their products in fp32 and rounds
the output once (a Linear's bias added in fp32 before that rounding). Debian's PyTorch 1.13
does so on the CPU only through oneDNN, which it takes for bf16 only where the CPU has AVX-512
(BW, VL, DQ). Elsewhere (an AMD EPYC with AVX2, measured) its fallback GEMM adds each product
into the bf16 output, rounding at every step: 54-85% of the outputs of a K = 8..128 product
differ from the recipe and the error grows with K (K = 128: 6x the recipe's), so a reference
run on such a CPU is another computation than the one it documents, and the proofs against it
depend on the machine CI happens to get.

The references (gpt_reference.py, pytorch_reference.py) call linear() / matmul() / Linear
instead of F.linear / @ / nn.Linear. Where autocast is on for the CPU and a probe of this
PyTorch (platform_gemm_is_recipe) finds its low-precision GEMMs are not the recipe, they
compute it themselves, as an autograd Function whose backward is autograd's mirror of the
recipe: dA = dC B^T and dB = A^T dC from the widened operands, each accumulated in fp32 and
rounded once to the operand's dtype, and a Linear's bias gradient the fp32 sum of dC over its
rows rounded once (what PyTorch's addmm backward computes through oneDNN); the casts of the
fp32 master weights to bf16 and of their gradients back to fp32 are the same .to() that
autocast inserts. Everywhere else (no autocast, fp32, a CPU whose PyTorch computes the recipe,
and CUDA, whose cuBLAS accumulates bf16 in fp32 and whose fp16 settings stay PyTorch's own)
they are PyTorch's ops unchanged.
"""
import functools

import torch
import torch.nn.functional as F
from torch import nn

# The probe's product: K = 256 makes a per-step rounding differ in most outputs; with fp32
# accumulation only a different summation order differs, in well under 1% of them (bf16 keeps
# 8 of fp32's 24 bits, so an fp32-ulp difference crosses a bf16 rounding boundary rarely).
_PROBE_M, _PROBE_K, _PROBE_N = 32, 256, 48
_RECIPE_DIFFER_AT_MOST = 0.05

# False: PyTorch's own ops everywhere (a benchmark of PyTorch's speed, bench/gpt_cpu_torch.py).
PIN_RECIPE = True


def _recipe(a, b, bias=None):
    """a @ b (+ bias) from the operands widened to fp32, rounded once to a's dtype."""
    with torch.autocast(device_type=a.device.type, enabled=False):
        out = torch.matmul(a.float(), b.float())
        if bias is not None:
            out = out + bias.float()
        return out.to(a.dtype)


def matches_recipe(linear_op, matmul_op, dtype):
    """Whether linear_op(x, w, bias) (F.linear's contract) and matmul_op(a, b) (a batched @)
    in dtype compute the recipe: each against it on a K = 256 product, at most 5% of the
    outputs differing (summation order)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, _PROBE_M, _PROBE_K, generator=g).to(dtype)
    w = torch.randn(_PROBE_N, _PROBE_K, generator=g).to(dtype)
    bias = torch.randn(_PROBE_N, generator=g).to(dtype)
    b = torch.randn(2, _PROBE_K, _PROBE_N, generator=g).to(dtype)
    with torch.no_grad(), torch.autocast(device_type="cpu", enabled=False):
        pairs = [(linear_op(a, w, bias), _recipe(a, w.t(), bias)), (matmul_op(a, b), _recipe(a, b))]
    return all(got.dtype == dtype and
               (got != want).float().mean().item() <= _RECIPE_DIFFER_AT_MOST
               for got, want in pairs)


@functools.lru_cache(maxsize=None)
def platform_gemm_is_recipe(dtype):
    """Whether this PyTorch's own CPU GEMMs in dtype (bf16, fp16) compute the recipe."""
    return matches_recipe(F.linear, torch.matmul, dtype)


def _cpu_autocast_dtype():
    """The CPU autocast's dtype when it is on, else None (PyTorch 1.13's and 2.x's calls)."""
    try:
        enabled = torch.is_autocast_enabled("cpu")  # PyTorch >= 2.4
        return torch.get_autocast_dtype("cpu") if enabled else None
    except TypeError:
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None


def substituted_dtype(device_type):
    """The dtype whose GEMMs linear()/matmul() compute themselves here (module docstring), or
    None where PyTorch's ops are used as they are."""
    if not PIN_RECIPE or device_type != "cpu":
        return None
    dtype = _cpu_autocast_dtype()
    if dtype is None or platform_gemm_is_recipe(dtype):
        return None
    return dtype


class _RecipeGemm(torch.autograd.Function):
    """a [..., M, K] @ b [..., K, N] (+ bias [N]) of low-precision tensors of one dtype, a and
    b with the same leading dimensions (or none), as the recipe computes it forward and back."""

    @staticmethod
    def forward(ctx, a, b, bias):
        if a.dim() != b.dim() or a.shape[:-2] != b.shape[:-2]:
            raise ValueError(f"recipe GEMM of {tuple(a.shape)} and {tuple(b.shape)}: the "
                             "leading dimensions must match")
        ctx.save_for_backward(a, b)
        ctx.has_bias = bias is not None
        return _recipe(a, b, bias)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        da = db = dbias = None
        with torch.autocast(device_type=grad.device.type, enabled=False):
            g = grad.float()
            if ctx.needs_input_grad[0]:
                da = torch.matmul(g, b.float().transpose(-2, -1)).to(a.dtype)
            if ctx.needs_input_grad[1]:
                db = torch.matmul(a.float().transpose(-2, -1), g).to(b.dtype)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                dbias = g.reshape(-1, g.size(-1)).sum(0).to(a.dtype)
        return da, db, dbias


def recipe_linear(x, weight, bias, dtype):
    """F.linear(x, weight, bias) as the recipe computes it in dtype, forward and backward: the
    operands cast to dtype (autocast's cast), one GEMM over every row (F.linear's addmm)."""
    rows = x.reshape(-1, x.size(-1)).to(dtype)
    out = _RecipeGemm.apply(rows, weight.to(dtype).t(), None if bias is None else bias.to(dtype))
    return out.reshape(*x.shape[:-1], weight.size(0))


def recipe_matmul(a, b, dtype):
    """a @ b as the recipe computes it in dtype, forward and backward."""
    return _RecipeGemm.apply(a.to(dtype), b.to(dtype), None)


def linear(x, weight, bias=None):
    """F.linear(x, weight, bias), under autocast the recipe's (module docstring)."""
    low = substituted_dtype(x.device.type)
    return F.linear(x, weight, bias) if low is None else recipe_linear(x, weight, bias, low)


def matmul(a, b):
    """a @ b, under autocast the recipe's (module docstring)."""
    low = substituted_dtype(a.device.type)
    return a @ b if low is None else recipe_matmul(a, b, low)


class Linear(nn.Linear):
    """nn.Linear (same parameters and names) whose forward is linear() above."""

    def forward(self, x):
        return linear(x, self.weight, self.bias)
