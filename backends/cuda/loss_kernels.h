#pragma once

// Host launchers of the CUDA backend's loss and metric kernels (loss_kernels.cu).

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels.h"  // kReductionBlocks
#include "trainer/backend_types.h"
#include "trainer/step_math.h"

namespace mptrain::cuda {

// out = round(coef * (f32(a) - b) * (state->scale / seed_divisor)), n elements; a and out of
// `dtype`, b f32.
cudaError_t ScaledDifference(const void* a, DType dtype, const float* b, int64_t n, float coef,
                             const StepState* state, float seed_divisor, void* out,
                             cudaStream_t stream);
// acc[0] += f32(Σ (f32(a) - b)² / divide_by) / then_divide over n elements, the sum in double
// (per-block partials in `partials`, kReductionBlocks doubles, added in order: deterministic).
cudaError_t SumSquaredDifference(const void* a, DType dtype, const float* b, int64_t n,
                                 double divide_by, float then_divide, float* acc,
                                 double* partials, cudaStream_t stream);
// SumSquaredDifference(a, b, ...) and ScaledDifference(a, b, coef, state, seed_divisor, out)
// in one pass over a and b, with the same bits; only for a 16-bit dtype, 16-byte aligned a, b
// and out, and n % 8 == 0: otherwise it does nothing and sets *fused = false.
cudaError_t SquaredErrorAndGradient(const void* a, DType dtype, const float* b, int64_t n,
                                   double divide_by, float then_divide, float* acc, float coef,
                                   const StepState* state, float seed_divisor, void* out,
                                   double* partials, cudaStream_t stream, bool* fused);
// acc[0] += f32(Σ a·b / divide_by) / then_divide over n f32 elements, the sum in double
// (deterministic, as SumSquaredDifference).
cudaError_t SumProduct(const float* a, const float* b, int64_t n, double divide_by,
                       float then_divide, float* acc, double* partials, cudaStream_t stream);
// Row-wise log-softmax of x [rows, cols] (dtype) into out f32, one thread per row.
cudaError_t LogSoftmaxRows(const void* x, DType dtype, int64_t rows, int64_t cols, float* out,
                           cudaStream_t stream);
// out = exp(x), n f32 elements.
cudaError_t Exp(const float* x, float* out, int64_t n, cudaStream_t stream);
// out[r, c] = (c == ids[r] ? on : 0) + off over [rows, cols] f32.
cudaError_t SmoothedOneHot(const float* ids, float on, float off, int64_t rows, int64_t cols,
                           float* out, cudaStream_t stream);
// acc[0] += rows of x [rows, cols] (dtype) whose first maximum is at column ids[r].
cudaError_t CountArgmaxMatches(const void* x, DType dtype, int64_t rows, int64_t cols,
                               const float* ids, float* acc, cudaStream_t stream);

}  // namespace mptrain::cuda
