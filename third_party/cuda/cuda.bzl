"""cuda_library: compiles .cu files with the local nvcc and wraps the objects in a cc_library.

There are no CUDA rules offline, so each .cu file becomes one genrule running nvcc. Headers
the .cu files include are listed in `cu_hdrs` so that a change to them recompiles.
"""

load("@local_cuda//:defs.bzl", "NVCC")

# sm_90 (Hopper, the H200) as machine code, plus PTX so that other GPUs can JIT it.
_NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O3",
    "-Xcompiler -fPIC",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=compute_90",
    "--expt-relaxed-constexpr",
    "-I.",
])

def cuda_library(name, srcs, hdrs = [], cu_hdrs = [], deps = [], **kwargs):
    objects = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".pic.o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + cu_hdrs + hdrs,
            outs = [obj],
            cmd = "{nvcc} {flags} -c $(location {src}) -o $@".format(
                nvcc = NVCC,
                flags = _NVCC_FLAGS,
                src = src,
            ),
        )
        objects.append(obj)
    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda"],
        **kwargs
    )
