#pragma once

// LayerNorm over the last dimension on the GPU (layer_norm_kernels.cu): rows of `cols`
// elements, fp32 weight and bias, per-row (mean, rstd) statistics kept for the backward pass.

#include <cuda_runtime.h>

#include <cstdint>

#include "trainer/backend_types.h"

namespace mptrain::cuda {

// The parameter gradients are summed in at most this many chunks of rows.
inline constexpr int64_t kLayerNormMaxChunks = 1024;

// y = (x − mean) · rstd · weight + bias; row_stats[2r] = mean, row_stats[2r + 1] = rstd.
cudaError_t LayerNormForward(const void* x, DType x_dtype, int64_t rows, int64_t cols,
                             const float* weight, const float* bias, float eps, float* row_stats,
                             void* y, DType y_dtype, cudaStream_t stream);

// sum = f32(a) + f32(b) (f32, as the residual Add), then LayerNormForward(sum): one pass fewer.
cudaError_t AddLayerNormForward(const void* a, DType a_dtype, const void* b, DType b_dtype,
                                float* sum, int64_t rows, int64_t cols, const float* weight,
                                const float* bias, float eps, float* row_stats, void* y,
                                DType y_dtype, cudaStream_t stream);

// The fp32 scratch LayerNormBackward needs for `rows` x `cols` (the per-chunk column sums).
int64_t LayerNormParamPartialsBytes(int64_t rows, int64_t cols);

// dx (written), and dweight / dbias added to (or, with overwrite, written). `partials` holds
// LayerNormParamPartialsBytes(rows, cols) bytes of scratch on the stream's device. With
// d_residual (f32), dx is not written: d_residual += dx, and d_low (d_low_dtype; may be null) =
// round(d_residual).
// With d_low_bias (f32, [cols]; only where LayerNormBackwardSumsLowCopy, else
// cudaErrorNotSupported), also d_low_bias += round(Σ_rows d_low) (or =, with overwrite): the
// gradient of the bias of the Linear whose output the residual's branch is, summed in the same
// pass as the parameter gradients.
cudaError_t LayerNormBackward(const void* dy, DType dy_dtype, const void* x, DType x_dtype,
                              int64_t rows, int64_t cols, const float* row_stats,
                              const float* weight, void* dx, DType dx_dtype, float* dweight,
                              float* dbias, bool overwrite, float* partials,
                              cudaStream_t stream, float* d_residual = nullptr,
                              void* d_low = nullptr, DType d_low_dtype = DType::kF32,
                              float* d_low_bias = nullptr);
// Whether LayerNormBackward can sum d_low's columns in its pass (the fused kernel: an f32 x,
// rows of at most 1024 columns, a multiple of 8, 16-byte aligned pointers, into a residual).
bool LayerNormBackwardSumsLowCopy(const void* dy, const void* x, DType x_dtype, int64_t cols,
                                  const float* weight, const float* d_residual,
                                  const void* d_low);

}  // namespace mptrain::cuda
