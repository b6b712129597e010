#pragma once

// Host launchers of the CUDA backend's batch-norm kernels (batch_norm_kernels.cu).

#include <cuda_runtime.h>

#include <cstdint>

#include "trainer/backend_types.h"

// ---- Normalization layers (trainer/backend.h says what each computes; norm_math.h has the
// shared formulas). x [rows, cols] row-major; each buffer's dtype is given where it may vary.
namespace mptrain::cuda {

// stats [2·cols + 1] = mean, invstd, rows (one block per feature; sums in double).
cudaError_t BatchNormStatistics(const void* x, DType dtype, int64_t rows, int64_t cols, float eps,
                                float* stats, cudaStream_t stream);
// Chan's combination of `ranks` rows of [2·cols + 1]; running [2·cols] updated, mean_invstd
// [2·cols] written (one thread per feature).
cudaError_t BatchNormCombineStatistics(const float* gathered, int64_t ranks, int64_t cols,
                                       float eps, float momentum, float* running,
                                       float* mean_invstd, cudaStream_t stream);
cudaError_t BatchNormRunningStatistics(const float* running, int64_t cols, float eps,
                                       float* mean_invstd, cudaStream_t stream);
cudaError_t BatchNormApply(const void* x, DType x_dtype, int64_t rows, int64_t cols,
                           const float* mean_invstd, const float* weight, const float* bias,
                           void* y, DType y_dtype, cudaStream_t stream);
cudaError_t BatchNormBackwardReduce(const void* dy, DType dy_dtype, const void* x, DType x_dtype,
                                    int64_t rows, int64_t cols, const float* mean_invstd,
                                    float* sums, float* dweight, float* dbias, bool overwrite,
                                    cudaStream_t stream);
cudaError_t BatchNormBackwardInput(const void* dy, DType dy_dtype, const void* x, DType x_dtype,
                                   int64_t rows, int64_t cols, const float* mean_invstd,
                                   const float* weight, const float* sums, double count, void* dx,
                                   DType dx_dtype, cudaStream_t stream);
}  // namespace mptrain::cuda
