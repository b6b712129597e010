// The CUDA backend's loss and metric kernels: MSE (and its fused gradient), log-softmax,
// one-hot targets, argmax matches. Sums are in double over kReductionBlocks per-block partials
// added in order: deterministic.

#include "backends/cuda/loss_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/kernel_support.cuh"

namespace mptrain::cuda {
namespace {

template <typename T>
__global__ void scaled_difference_kernel(const T* a, const float* b, int64_t n, float coef,
                                         const StepState* state, float seed_divisor, T* out) {
  const float seed = state->scale / seed_divisor;
  GRID_STRIDE(i, n) { out[i] = FromFloat<T>(coef * (ToFloat<T>(a[i]) - b[i]) * seed); }
}

// Eight elements per thread: a's 16 bytes, b's two float4, out's 16 bytes.
template <typename T>
__global__ void scaled_difference_vec8_kernel(const T* a, const float* b, int64_t n8, float coef,
                                              const StepState* state, float seed_divisor, T* out) {
  const float seed = state->scale / seed_divisor;
  GRID_STRIDE(i, n8) {
    const uint4 a_packed = reinterpret_cast<const uint4*>(a)[i];
    const float4 b_lo = reinterpret_cast<const float4*>(b)[2 * i];
    const float4 b_hi = reinterpret_cast<const float4*>(b)[2 * i + 1];
    const T* av = reinterpret_cast<const T*>(&a_packed);
    const float bv[8] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
    uint4 out_packed;
    T* o = reinterpret_cast<T*>(&out_packed);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = FromFloat<T>(coef * (ToFloat<T>(av[j]) - bv[j]) * seed);
    reinterpret_cast<uint4*>(out)[i] = out_packed;
  }
}

// MSE's gradient, written by the fused loss kernel below: out = round(coef · (f32(a) − b) ·
// seed), seed = state->scale / seed_divisor — scaled_difference's formula, element for element.
template <typename T>
struct GradientOutput {
  float coef = 0;
  const StepState* state = nullptr;
  float seed_divisor = 1;
  T* out = nullptr;
};

// Sixteen elements per thread and iteration (two independent groups of eight: enough loads in
// flight to keep the memory busy with kReductionBlocks blocks); each thread adds its values in a
// fixed order, the blocks' partials are added in order: deterministic. The order is not the
// scalar kernel's: the double sum (hence the loss) may differ from it in its last bits. With
// kGradient it also writes MSE's gradient from the same loads (one pass over a and b instead
// of two); the partials are the same code, hence the same bits.
template <typename T, bool kGradient>
__global__ void squared_difference_partials_vec8_kernel(const T* a, const float* b, int64_t n8,
                                                        double* partials,
                                                        GradientOutput<T> gradient) {
  float seed = 0;
  if constexpr (kGradient) seed = gradient.state->scale / gradient.seed_divisor;
  double local = 0;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n8;
       i += 2 * stride) {
    const bool second = i + stride < n8;
    uint4 a_packed[2];
    float4 b_values[4];
    a_packed[0] = reinterpret_cast<const uint4*>(a)[i];
    b_values[0] = reinterpret_cast<const float4*>(b)[2 * i];
    b_values[1] = reinterpret_cast<const float4*>(b)[2 * i + 1];
    if (second) {
      a_packed[1] = reinterpret_cast<const uint4*>(a)[i + stride];
      b_values[2] = reinterpret_cast<const float4*>(b)[2 * (i + stride)];
      b_values[3] = reinterpret_cast<const float4*>(b)[2 * (i + stride) + 1];
    }
#pragma unroll
    for (int group = 0; group < 2; ++group) {
      if (group == 1 && !second) break;
      const T* av = reinterpret_cast<const T*>(&a_packed[group]);
      const float* bv = reinterpret_cast<const float*>(&b_values[2 * group]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float diff = ToFloat<T>(av[j]) - bv[j];
        local += static_cast<double>(diff) * diff;
      }
      if constexpr (kGradient) {
        uint4 out_packed;
        T* o = reinterpret_cast<T*>(&out_packed);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          o[j] = FromFloat<T>(gradient.coef * (ToFloat<T>(av[j]) - bv[j]) * seed);
        }
        reinterpret_cast<uint4*>(gradient.out)[i + group * stride] = out_packed;
      }
    }
  }
  const double block_sum = BlockSum(local);
  if (threadIdx.x == 0) partials[blockIdx.x] = block_sum;
}

template <typename T>
__global__ void squared_difference_partials_kernel(const T* a, const float* b, int64_t n,
                                                   double* partials) {
  double local = 0;
  GRID_STRIDE(i, n) {
    const float diff = ToFloat<T>(a[i]) - b[i];
    local += static_cast<double>(diff) * diff;
  }
  const double block_sum = BlockSum(local);
  if (threadIdx.x == 0) partials[blockIdx.x] = block_sum;
}

// Deterministic: one thread adds the per-block partials in order.
__global__ void mean_finalize_kernel(const double* partials, int count, double divide_by,
                                     float then_divide, float* acc) {
  double sum = 0;
  for (int i = 0; i < count; ++i) sum += partials[i];
  acc[0] += static_cast<float>(sum / divide_by) / then_divide;
}

__global__ void product_partials_kernel(const float* a, const float* b, int64_t n,
                                        double* partials) {
  double local = 0;
  GRID_STRIDE(i, n) { local += static_cast<double>(a[i]) * b[i]; }
  const double block_sum = BlockSum(local);
  if (threadIdx.x == 0) partials[blockIdx.x] = block_sum;
}

template <typename T>
__global__ void log_softmax_rows_kernel(const T* x, int64_t rows, int64_t cols, float* out) {
  GRID_STRIDE(r, rows) {
    const T* in = x + r * cols;
    float max = ToFloat<T>(in[0]);
    for (int64_t c = 1; c < cols; ++c) max = fmaxf(max, ToFloat<T>(in[c]));
    double sum = 0;
    // Each term's exp in fp32, added in double (as the fused softmax_cross_entropy_kernel).
    for (int64_t c = 0; c < cols; ++c) sum += static_cast<double>(expf(ToFloat<T>(in[c]) - max));
    const float log_sum = static_cast<float>(log(sum));
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = ToFloat<T>(in[c]) - max - log_sum;
  }
}

__global__ void exp_kernel(const float* x, float* out, int64_t n) {
  GRID_STRIDE(i, n) { out[i] = expf(x[i]); }
}

__global__ void smoothed_one_hot_kernel(const float* ids, float on, float off, int64_t rows,
                                        int64_t cols, float* out) {
  GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    out[i] = (static_cast<float>(c) == ids[r] ? on : 0.0f) + off;
  }
}

// Counts are whole numbers below 2^24: float atomics add them exactly in any order.
template <typename T>
__global__ void count_argmax_matches_kernel(const T* x, int64_t rows, int64_t cols,
                                            const float* ids, float* acc) {
  GRID_STRIDE(r, rows) {
    const T* row = x + r * cols;
    int64_t best = 0;
    float best_value = ToFloat<T>(row[0]);
    for (int64_t c = 1; c < cols; ++c) {
      const float v = ToFloat<T>(row[c]);
      if (v > best_value) {
        best = c;
        best_value = v;
      }
    }
    if (static_cast<float>(best) == ids[r]) atomicAdd(acc, 1.0f);
  }
}

}  // namespace

cudaError_t ScaledDifference(const void* a, DType dtype, const float* b, int64_t n, float coef,
                             const StepState* state, float seed_divisor, void* out,
                             cudaStream_t stream) {
  const bool vectorized = Aligned16({a, b, out}) && n % 8 == 0;
  return Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 2) {
      if (vectorized) {
        scaled_difference_vec8_kernel<T><<<Blocks(n / 8), kThreads, 0, stream>>>(
            static_cast<const T*>(a), b, n / 8, coef, state, seed_divisor, static_cast<T*>(out));
        return cudaGetLastError();
      }
    }
    scaled_difference_kernel<T><<<Blocks(n), kThreads, 0, stream>>>(
        static_cast<const T*>(a), b, n, coef, state, seed_divisor, static_cast<T*>(out));
    return cudaGetLastError();
  });
}

cudaError_t SumSquaredDifference(const void* a, DType dtype, const float* b, int64_t n,
                                 double divide_by, float then_divide, float* acc,
                                 double* partials, cudaStream_t stream) {
  const bool vectorized = Aligned16({a, b}) && n % 8 == 0;
  cudaError_t error = Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 2) {
      if (vectorized) {
        squared_difference_partials_vec8_kernel<T, false>
            <<<kReductionBlocks, kThreads, 0, stream>>>(static_cast<const T*>(a), b, n / 8,
                                                        partials, GradientOutput<T>{});
        return cudaGetLastError();
      }
    }
    squared_difference_partials_kernel<T><<<kReductionBlocks, kThreads, 0, stream>>>(
        static_cast<const T*>(a), b, n, partials);
    return cudaGetLastError();
  });
  if (error != cudaSuccess) return error;
  mean_finalize_kernel<<<1, 1, 0, stream>>>(partials, kReductionBlocks, divide_by, then_divide,
                                            acc);
  return cudaGetLastError();
}

cudaError_t SquaredErrorAndGradient(const void* a, DType dtype, const float* b, int64_t n,
                                   double divide_by, float then_divide, float* acc, float coef,
                                   const StepState* state, float seed_divisor, void* out,
                                   double* partials, cudaStream_t stream, bool* fused) {
  *fused = false;
  if (!Aligned16({a, b, out}) || n % 8 != 0) return cudaSuccess;
  cudaError_t error = Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 2) {
      *fused = true;
      squared_difference_partials_vec8_kernel<T, true>
          <<<kReductionBlocks, kThreads, 0, stream>>>(
              static_cast<const T*>(a), b, n / 8, partials,
              GradientOutput<T>{coef, state, seed_divisor, static_cast<T*>(out)});
      return cudaGetLastError();
    }
    return cudaSuccess;
  });
  if (error != cudaSuccess || !*fused) return error;
  mean_finalize_kernel<<<1, 1, 0, stream>>>(partials, kReductionBlocks, divide_by, then_divide,
                                            acc);
  return cudaGetLastError();
}

cudaError_t SumProduct(const float* a, const float* b, int64_t n, double divide_by,
                       float then_divide, float* acc, double* partials, cudaStream_t stream) {
  product_partials_kernel<<<kReductionBlocks, kThreads, 0, stream>>>(a, b, n, partials);
  if (cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  mean_finalize_kernel<<<1, 1, 0, stream>>>(partials, kReductionBlocks, divide_by, then_divide,
                                            acc);
  return cudaGetLastError();
}

cudaError_t LogSoftmaxRows(const void* x, DType dtype, int64_t rows, int64_t cols, float* out,
                           cudaStream_t stream) {
  return Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    log_softmax_rows_kernel<T><<<Blocks(rows), kThreads, 0, stream>>>(static_cast<const T*>(x),
                                                                      rows, cols, out);
    return cudaGetLastError();
  });
}

cudaError_t Exp(const float* x, float* out, int64_t n, cudaStream_t stream) {
  exp_kernel<<<Blocks(n), kThreads, 0, stream>>>(x, out, n);
  return cudaGetLastError();
}

cudaError_t SmoothedOneHot(const float* ids, float on, float off, int64_t rows, int64_t cols,
                           float* out, cudaStream_t stream) {
  smoothed_one_hot_kernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(ids, on, off, rows, cols,
                                                                         out);
  return cudaGetLastError();
}

cudaError_t CountArgmaxMatches(const void* x, DType dtype, int64_t rows, int64_t cols,
                               const float* ids, float* acc, cudaStream_t stream) {
  return Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    count_argmax_matches_kernel<T><<<Blocks(rows), kThreads, 0, stream>>>(
        static_cast<const T*>(x), rows, cols, ids, acc);
    return cudaGetLastError();
  });
}

}  // namespace mptrain::cuda
