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
cudaError_t LayerNormBackward(const void* dy, DType dy_dtype, const void* x, DType x_dtype,
                              int64_t rows, int64_t cols, const float* row_stats,
                              const float* weight, void* dx, DType dx_dtype, float* dweight,
                              float* dbias, bool overwrite, float* partials,
                              cudaStream_t stream, float* d_residual = nullptr,
                              void* d_low = nullptr, DType d_low_dtype = DType::kF32);

}  // namespace mptrain::cuda
