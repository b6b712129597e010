#pragma once

// Host launchers of the CUDA backend's element-wise kernels (kernels.cu). Plain C++ signatures,
// as in every *_kernels.h here: raw device pointers, element counts as int64_t, the stream
// last; each returns the launch's cudaError_t. Low-precision buffers are fp16 (__half) or bf16
// (__nv_bfloat16), chosen by `dtype`.

#include <cuda_runtime.h>

#include <cstdint>

#include "trainer/backend_types.h"

namespace mptrain::cuda {

// dst (dtype) = round(src f32), n elements.
cudaError_t CastFromF32(const float* src, void* dst, DType dtype, int64_t n, cudaStream_t stream);
// dst (dtype) = round(round(src) / divisor), n elements (DDP's compress hooks).
cudaError_t CompressF32(const float* src, float divisor, void* dst, DType dtype, int64_t n,
                        cudaStream_t stream);
// dst f32 = src (dtype), n elements.
cudaError_t CastToF32(const void* src, DType dtype, float* dst, int64_t n, cudaStream_t stream);
// out[r, c] = bias[c] for a [rows, cols] buffer of dtype (the GEMM then adds x · wᵀ with beta 1).
cudaError_t BroadcastBias(const void* bias, void* out, DType dtype, int64_t rows, int64_t cols,
                          cudaStream_t stream);
// y = round(act(pre)), n elements of dtype.
cudaError_t ActivationForward(ActivationKind act, const void* pre, void* y, DType dtype, int64_t n,
                              cudaStream_t stream);
// d_pre = round(dy * act'(pre)).
cudaError_t ActivationBackward(ActivationKind act, const void* pre, const void* dy, void* d_pre,
                               DType dtype, int64_t n, cudaStream_t stream);
// acc f32 += f32(src dtype), n elements; with `overwrite`, acc = f32(src) (acc not read).
cudaError_t AccumulateF32(const void* src, DType dtype, float* acc, int64_t n, bool overwrite,
                          cudaStream_t stream);
// out[c] = Σ_r f32(rows[r * ld + c]) in row order, for r < row_count and c < cols.
cudaError_t SumRowsToF32(const void* rows, DType dtype, int64_t row_count, int64_t cols,
                         int64_t ld, float* out, cudaStream_t stream);
// db_acc[c] += f32(round(Σ_r dy[r, c])) for dy [rows, cols] of dtype.
cudaError_t BiasGradient(const void* dy, DType dtype, int64_t rows, int64_t cols, float* db_acc,
                         cudaStream_t stream);
// Per-block partial sums of the deterministic reductions (loss_kernels.h, step_kernels.h).
inline constexpr int kReductionBlocks = 264;
// dst rows = src rows [first, first + dst_rows) mod src_rows, f32 with `cols` columns.
cudaError_t CopyRowsWrapping(const float* src, int64_t src_rows, int64_t cols, int64_t first,
                             float* dst, int64_t dst_rows, cudaStream_t stream);

// dst row i = src row indices[i] (f32 row numbers, clamped to [0, src_rows)), f32 with `cols`
// columns.
cudaError_t GatherRows(const float* src, int64_t src_rows, int64_t cols, const float* indices,
                       float* dst, int64_t dst_rows, cudaStream_t stream);

// y = round(act(f32(x))), n elements, any dtypes.
cudaError_t ActivationForwardMixed(ActivationKind act, const void* x, DType x_dtype, void* y,
                                   DType y_dtype, int64_t n, cudaStream_t stream);
// d_pre = round(dy * act'(pre)), n elements, any dtypes.
cudaError_t ActivationBackwardMixed(ActivationKind act, const void* pre, DType pre_dtype,
                                    const void* dy, DType dy_dtype, void* d_pre,
                                    DType d_pre_dtype, int64_t n, cudaStream_t stream);

}  // namespace mptrain::cuda
