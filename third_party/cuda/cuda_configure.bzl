"""Repository rule that finds a local CUDA toolkit (nvcc, cuBLAS, NCCL, cuDNN) without any download.

It makes @local_cuda with:
  //:defs.bzl  CUDA_ENABLED, NVCC, if_cuda(yes, no)
  //:cuda      a cc_library with the CUDA headers and link flags (empty when CUDA is absent)
  //:cudnn     cuDNN's link flags (empty likewise)

CUDA is looked for in $CUDA_PATH, then /usr/local/cuda. Setting MPTRAIN_DISABLE_CUDA=1
(`--config=nocuda`) builds the CPU-only product even where CUDA is installed.
"""

def _cuda_configure_impl(ctx):
    cuda_path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    disabled = ctx.os.environ.get("MPTRAIN_DISABLE_CUDA", "0") not in ["", "0"]
    nvcc = ctx.path(cuda_path + "/bin/nvcc")
    nccl_header = ctx.path(cuda_path + "/include/nccl.h")
    # cuDNN 9 drives the GPT's fused attention (backends/cuda/cudnn_attention.cc).
    cudnn_header = ctx.path(cuda_path + "/include/cudnn.h")
    enabled = (not disabled) and nvcc.exists and nccl_header.exists and cudnn_header.exists

    if enabled:
        ctx.symlink(cuda_path + "/include", "include")
        lib_dir = cuda_path + "/lib64"
        build = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.inl", "include/**/*.cuh"]),
    includes = ["include"],
    linkopts = [
        "-L{lib}",
        "-Wl,-rpath,{lib}",
        "-lcublasLt",
        "-lcublas",
        "-lnccl",
        "{lib}/libcudart_static.a",
        "-ldl",
        "-lrt",
        "-lpthread",
    ],
)

# cuDNN, linked dynamically (libcudnn.so.9 loads its engine libraries at run time; on the GPU
# machine they come with PyTorch's nvidia-cudnn wheel: scripts/make_device_bundle.sh's env.sh),
# and NVRTC, which the frontend's optional open-source attention engines reference.
cc_library(
    name = "cudnn",
    linkopts = ["-L{lib}", "-lcudnn", "-lnvrtc"],
    deps = [":cuda"],
)
""".format(lib = lib_dir)
    else:
        build = """
package(default_visibility = ["//visibility:public"])

# CUDA was not found (or was disabled): nothing links against it.
cc_library(name = "cuda")

cc_library(name = "cudnn")
"""
    ctx.file("BUILD", build)
    ctx.file("WORKSPACE", "workspace(name = \"local_cuda\")\n")
    ctx.file("defs.bzl", """
CUDA_ENABLED = {enabled}
NVCC = "{nvcc}"

def if_cuda(if_true, if_false = []):
    return if_true if CUDA_ENABLED else if_false
""".format(enabled = "True" if enabled else "False", nvcc = str(nvcc)))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH", "MPTRAIN_DISABLE_CUDA"],
    local = True,
)
