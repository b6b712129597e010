#pragma once

// The fused softmax cross-entropy (Backend::SoftmaxCrossEntropy) on the GPU: a row's loss, its
// first maximum and, in place or not, its gradient, reading the logits once. Conventions as
// kernels.h: raw device pointers, element counts as int64_t, the stream last, the launch's
// cudaError_t returned.

#include <cuda_runtime.h>

#include <cstdint>

#include "trainer/backend_types.h"
#include "trainer/step_math.h"

namespace mptrain::cuda {

// Backend::SoftmaxCrossEntropy over the rows of x [rows, cols] (x_dtype, rows ld_x
// elements apart), with row_losses[rows] doubles of scratch; d_logits (d_dtype, rows ld_d apart)
// may be null (evaluation) or alias x. metrics[0] += f32(Σ_rows row_loss / divide_by) /
// then_divide (rows added in a fixed order), metrics[1] += the rows whose first maximum is ids[r].
cudaError_t SoftmaxCrossEntropy(const void* x, DType x_dtype, int64_t ld_x, const float* ids,
                                int64_t rows, int64_t cols, float on, float off, double divide_by,
                                float then_divide, float* metrics, float coef,
                                const StepState* state, float seed_divisor, void* d_logits,
                                DType d_dtype, int64_t ld_d, double* row_losses,
                                cudaStream_t stream);

}  // namespace mptrain::cuda
