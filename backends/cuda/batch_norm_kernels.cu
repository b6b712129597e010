// The CUDA backend's batch-norm kernels; the formulas are norm_math.h's, shared with the CPU
// backend.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/batch_norm_kernels.h"
#include "backends/cuda/kernel_support.cuh"
#include "trainer/norm_math.h"


namespace mptrain::cuda {
namespace {

// Loads and stores by a dtype known at run time (kernel_support.cuh's Load and Store: the norms
// mix f32 with the compute dtype); BlockSum: every thread's value summed over the block.

// One block per feature column c.
__global__ void batch_norm_statistics_kernel(const void* x, DType xd, int64_t rows, int64_t cols,
                                             float eps, float* stats) {
  const int64_t c = blockIdx.x;
  double sum = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) sum += Load(x, xd, r * cols + c);
  const double mean = BlockSum(sum) / rows;
  double squares = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const double d = Load(x, xd, r * cols + c) - mean;
    squares += d * d;
  }
  const double variance = BlockSum(squares) / rows;
  if (threadIdx.x == 0) {
    stats[c] = static_cast<float>(mean);
    stats[cols + c] = InverseStd(variance, eps);
    if (c == 0) stats[2 * cols] = static_cast<float>(rows);
  }
}

__global__ void batch_norm_combine_kernel(const float* gathered, int64_t ranks, int64_t cols,
                                          float eps, float momentum, float* running,
                                          float* mean_invstd) {
  GRID_STRIDE(c, cols) {
    const int64_t width = 2 * cols + 1;
    BatchStatisticsCombination combined;
    for (int64_t w = 0; w < ranks; ++w) {
      combined.Add(gathered[w * width + c], gathered[w * width + cols + c],
                   gathered[w * width + 2 * cols], eps);
    }
    mean_invstd[c] = static_cast<float>(combined.avg);
    mean_invstd[cols + c] = InverseStd(combined.BiasedVariance(), eps);
    running[c] = RunningUpdate(running[c], combined.avg, momentum);
    running[cols + c] = RunningUpdate(running[cols + c], combined.UnbiasedVariance(), momentum);
  }
}

__global__ void batch_norm_running_kernel(const float* running, int64_t cols, float eps,
                                          float* mean_invstd) {
  GRID_STRIDE(c, cols) {
    mean_invstd[c] = running[c];
    mean_invstd[cols + c] = InverseStd(running[cols + c], eps);
  }
}

__global__ void batch_norm_apply_kernel(const void* x, DType xd, int64_t rows, int64_t cols,
                                        const float* mean_invstd, const float* weight,
                                        const float* bias, void* y, DType yd) {
  GRID_STRIDE(i, rows * cols) {
    const int64_t c = i % cols;
    const float a = mean_invstd[cols + c] * weight[c];
    const float shift = bias[c] - mean_invstd[c] * a;
    Store(y, yd, i, Load(x, xd, i) * a + shift);
  }
}

// One block per feature column c.
__global__ void batch_norm_backward_reduce_kernel(const void* dy, DType gd, const void* x,
                                                  DType xd, int64_t rows, int64_t cols,
                                                  const float* mean_invstd, float* sums,
                                                  float* dweight, float* dbias, bool overwrite) {
  const int64_t c = blockIdx.x;
  const double mean = mean_invstd[c];
  double sum_dy = 0, sum_dy_xmu = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const double g = Load(dy, gd, r * cols + c);
    sum_dy += g;
    sum_dy_xmu += g * (Load(x, xd, r * cols + c) - mean);
  }
  sum_dy = BlockSum(sum_dy);
  sum_dy_xmu = BlockSum(sum_dy_xmu);
  if (threadIdx.x == 0) {
    sums[c] = static_cast<float>(sum_dy);
    sums[cols + c] = static_cast<float>(sum_dy_xmu);
    const float grad_weight = static_cast<float>(sum_dy_xmu * mean_invstd[cols + c]);
    dweight[c] = (overwrite ? 0.0f : dweight[c]) + grad_weight;
    dbias[c] = (overwrite ? 0.0f : dbias[c]) + static_cast<float>(sum_dy);
  }
}

__global__ void batch_norm_backward_input_kernel(const void* dy, DType gd, const void* x, DType xd,
                                                 int64_t rows, int64_t cols,
                                                 const float* mean_invstd, const float* weight,
                                                 const float* sums, double count, void* dx,
                                                 DType dxd) {
  GRID_STRIDE(i, rows * cols) {
    const int64_t c = i % cols;
    const float mean = mean_invstd[c], invstd = mean_invstd[cols + c];
    const float mean_dy = static_cast<float>(sums[c] / count);
    const float k = static_cast<float>(sums[cols + c] / count) * invstd * invstd;
    const float value =
        (Load(dy, gd, i) - mean_dy - (Load(x, xd, i) - mean) * k) * (invstd * weight[c]);
    Store(dx, dxd, i, value);
  }
}

// Grids of one block per row or feature: at most 2^31 - 1 blocks in x.
cudaError_t CheckBlocks(int64_t blocks) {
  return blocks < 1 || blocks > 2147483647 ? cudaErrorInvalidConfiguration : cudaSuccess;
}

}  // namespace

cudaError_t BatchNormStatistics(const void* x, DType dtype, int64_t rows, int64_t cols, float eps,
                                float* stats, cudaStream_t stream) {
  if (cudaError_t e = CheckBlocks(cols); e != cudaSuccess) return e;
  batch_norm_statistics_kernel<<<static_cast<unsigned>(cols), kThreads, 0, stream>>>(
      x, dtype, rows, cols, eps, stats);
  return cudaGetLastError();
}

cudaError_t BatchNormCombineStatistics(const float* gathered, int64_t ranks, int64_t cols,
                                       float eps, float momentum, float* running,
                                       float* mean_invstd, cudaStream_t stream) {
  batch_norm_combine_kernel<<<Blocks(cols), kThreads, 0, stream>>>(gathered, ranks, cols, eps,
                                                                    momentum, running,
                                                                    mean_invstd);
  return cudaGetLastError();
}

cudaError_t BatchNormRunningStatistics(const float* running, int64_t cols, float eps,
                                       float* mean_invstd, cudaStream_t stream) {
  batch_norm_running_kernel<<<Blocks(cols), kThreads, 0, stream>>>(running, cols, eps,
                                                                    mean_invstd);
  return cudaGetLastError();
}

cudaError_t BatchNormApply(const void* x, DType x_dtype, int64_t rows, int64_t cols,
                           const float* mean_invstd, const float* weight, const float* bias,
                           void* y, DType y_dtype, cudaStream_t stream) {
  batch_norm_apply_kernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(
      x, x_dtype, rows, cols, mean_invstd, weight, bias, y, y_dtype);
  return cudaGetLastError();
}

cudaError_t BatchNormBackwardReduce(const void* dy, DType dy_dtype, const void* x, DType x_dtype,
                                    int64_t rows, int64_t cols, const float* mean_invstd,
                                    float* sums, float* dweight, float* dbias, bool overwrite,
                                    cudaStream_t stream) {
  if (cudaError_t e = CheckBlocks(cols); e != cudaSuccess) return e;
  batch_norm_backward_reduce_kernel<<<static_cast<unsigned>(cols), kThreads, 0, stream>>>(
      dy, dy_dtype, x, x_dtype, rows, cols, mean_invstd, sums, dweight, dbias, overwrite);
  return cudaGetLastError();
}

cudaError_t BatchNormBackwardInput(const void* dy, DType dy_dtype, const void* x, DType x_dtype,
                                   int64_t rows, int64_t cols, const float* mean_invstd,
                                   const float* weight, const float* sums, double count, void* dx,
                                   DType dx_dtype, cudaStream_t stream) {
  batch_norm_backward_input_kernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(
      dy, dy_dtype, x, x_dtype, rows, cols, mean_invstd, weight, sums, count, dx, dx_dtype);
  return cudaGetLastError();
}

}  // namespace mptrain::cuda
