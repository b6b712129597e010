#pragma once

// Host launchers of the CUDA backend's kernels (kernels.cu). Plain C++ signatures: raw device
// pointers, element counts as int64_t, the stream last; each returns the launch's cudaError_t.
// Low-precision buffers are fp16 (__half) or bf16 (__nv_bfloat16), chosen by `dtype`.

#include <cuda_runtime.h>

#include <cstdint>

#include "trainer/backend_types.h"
#include "trainer/optim/update_math.h"
#include "trainer/step_math.h"

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
inline constexpr int kReductionBlocks = 264;
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
// Phase 1 of step_math.h over n gradients: state->found_inf and state->sum_squares.
// `partials` and `inf_flags` hold kReductionBlocks entries of scratch.
cudaError_t GradientStatistics(const float* grads, int64_t n, StepState* state, double* partials,
                               int* inf_flags, cudaStream_t stream);
// Phase 2: FinalizeStep(config, metrics[0], state) and state->last_correct = metrics[1] on
// one thread.
cudaError_t FinalizeStep(const StepConfig& config, const float* metrics, StepState* state,
                         cudaStream_t stream);
// Phase 3: the optimizer update of trainer/optim/update_math.h over n parameters unless the
// step is skipped; slot_a / slot_b may be null when the rule does not use them. `params_low`
// (may be null) receives the updated parameters rounded to `low_dtype`. `lr_on_device`, when
// not null, replaces rule.lr (a recorded step's learning rate, set before each replay).
cudaError_t UpdateParameters(const UpdateRule& rule, float* params, const float* grads,
                             float* slot_a, float* slot_b, int64_t n, const StepState* state,
                             void* params_low, DType low_dtype, const double* lr_on_device,
                             cudaStream_t stream);
// dst rows = src rows [first, first + dst_rows) mod src_rows, f32 with `cols` columns.
cudaError_t CopyRowsWrapping(const float* src, int64_t src_rows, int64_t cols, int64_t first,
                             float* dst, int64_t dst_rows, cudaStream_t stream);

// dst row i = src row indices[i] (f32 row numbers, clamped to [0, src_rows)), f32 with `cols`
// columns.
cudaError_t GatherRows(const float* src, int64_t src_rows, int64_t cols, const float* indices,
                       float* dst, int64_t dst_rows, cudaStream_t stream);

}  // namespace mptrain::cuda

// ---- Normalization layers (trainer/backend.h says what each computes; norm_math.h has the
// shared formulas). x [rows, cols] row-major; each buffer's dtype is given where it may vary.
namespace mptrain::cuda {

// y = round(act(f32(x))), n elements, any dtypes.
cudaError_t ActivationForwardMixed(ActivationKind act, const void* x, DType x_dtype, void* y,
                                   DType y_dtype, int64_t n, cudaStream_t stream);
// d_pre = round(dy * act'(pre)), n elements, any dtypes.
cudaError_t ActivationBackwardMixed(ActivationKind act, const void* pre, DType pre_dtype,
                                    const void* dy, DType dy_dtype, void* d_pre,
                                    DType d_pre_dtype, int64_t n, cudaStream_t stream);
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
