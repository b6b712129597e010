// The CUDA backend's element-wise kernels: casts, bias, activations, gradient accumulation,
// row sums, row copies. Each kernel `foo_kernel` has a host launcher `Foo(...)` that picks the
// grid with a ceil-div and returns the launch error. Numerics come from the shared headers
// (activation_math.h) so the CPU and CUDA backends compute the same function. The losses are
// in loss_kernels.cu, the optimizer step in step_kernels.cu, batch norm in
// batch_norm_kernels.cu.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <initializer_list>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernel_support.cuh"
#include "trainer/activation_math.h"

namespace mptrain::cuda {
namespace {

template <typename T>
__global__ void cast_from_f32_kernel(const float* src, T* dst, int64_t n) {
  GRID_STRIDE(i, n) { dst[i] = FromFloat<T>(src[i]); }
}

template <typename T>
__global__ void cast_to_f32_kernel(const T* src, float* dst, int64_t n) {
  GRID_STRIDE(i, n) { dst[i] = ToFloat<T>(src[i]); }
}

template <typename T>
__global__ void broadcast_bias_kernel(const T* bias, T* out, int64_t rows, int64_t cols) {
  GRID_STRIDE(i, rows * cols) { out[i] = bias[i % cols]; }
}

template <typename T>
__global__ void activation_forward_kernel(ActivationKind act, const T* pre, T* y, int64_t n) {
  GRID_STRIDE(i, n) { y[i] = FromFloat<T>(mptrain::ActivationForward(act, ToFloat<T>(pre[i]))); }
}

// Eight 2-byte elements per thread (16-byte loads and store), the same arithmetic per element
// (GPT-2's GELU over [B·T, 4C]: 100 MB each way per layer per micro-batch).
template <typename T>
__global__ void activation_forward_vec8_kernel(ActivationKind act, const T* pre, T* y,
                                               int64_t n8) {
  GRID_STRIDE(i, n8) {
    const uint4 packed = reinterpret_cast<const uint4*>(pre)[i];
    const T* p = reinterpret_cast<const T*>(&packed);
    uint4 out_packed;
    T* out = reinterpret_cast<T*>(&out_packed);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = FromFloat<T>(mptrain::ActivationForward(act, ToFloat<T>(p[j])));
    reinterpret_cast<uint4*>(y)[i] = out_packed;
  }
}

template <typename T>
__global__ void activation_backward_kernel(ActivationKind act, const T* pre, const T* dy, T* d_pre,
                                           int64_t n) {
  GRID_STRIDE(i, n) {
    d_pre[i] = FromFloat<T>(ActivationGradient(act, ToFloat<T>(pre[i]), ToFloat<T>(dy[i])));
  }
}

// Eight 2-byte elements per thread (16-byte loads and store): the same arithmetic per element
// as activation_backward_kernel, at the memory's speed (mlp8k: 192 MB per layer per micro-batch).
template <typename T>
__global__ void activation_backward_vec8_kernel(ActivationKind act, const T* pre, const T* dy,
                                                T* d_pre, int64_t n8) {
  GRID_STRIDE(i, n8) {
    const uint4 pre_packed = reinterpret_cast<const uint4*>(pre)[i];
    const uint4 dy_packed = reinterpret_cast<const uint4*>(dy)[i];
    const T* p = reinterpret_cast<const T*>(&pre_packed);
    const T* g = reinterpret_cast<const T*>(&dy_packed);
    uint4 out_packed;
    T* out = reinterpret_cast<T*>(&out_packed);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      out[j] = FromFloat<T>(ActivationGradient(act, ToFloat<T>(p[j]), ToFloat<T>(g[j])));
    }
    reinterpret_cast<uint4*>(d_pre)[i] = out_packed;
  }
}

template <typename T>
__global__ void accumulate_f32_kernel(const T* src, float* acc, int64_t n, float keep) {
  GRID_STRIDE(i, n) { acc[i] = (keep != 0.0f ? acc[i] : 0.0f) + ToFloat<T>(src[i]); }
}

// Eight 2-byte elements per thread: 16-byte loads of src, two float4 loads and stores of acc.
template <typename T>
__global__ void accumulate_f32_vec8_kernel(const T* src, float* acc, int64_t n8, bool overwrite) {
  GRID_STRIDE(i, n8) {
    const uint4 packed = reinterpret_cast<const uint4*>(src)[i];
    const T* values = reinterpret_cast<const T*>(&packed);
    float4* out = reinterpret_cast<float4*>(acc) + 2 * i;
    float4 lo = make_float4(0, 0, 0, 0), hi = lo;
    if (!overwrite) {
      lo = out[0];
      hi = out[1];
    }
    lo.x += ToFloat<T>(values[0]);
    lo.y += ToFloat<T>(values[1]);
    lo.z += ToFloat<T>(values[2]);
    lo.w += ToFloat<T>(values[3]);
    hi.x += ToFloat<T>(values[4]);
    hi.y += ToFloat<T>(values[5]);
    hi.z += ToFloat<T>(values[6]);
    hi.w += ToFloat<T>(values[7]);
    out[0] = lo;
    out[1] = hi;
  }
}

template <typename T>
__global__ void sum_rows_kernel(const T* rows, int64_t row_count, int64_t cols, int64_t ld,
                                float* out) {
  GRID_STRIDE(c, cols) {
    float sum = 0.0f;
    for (int64_t r = 0; r < row_count; ++r) sum += ToFloat<T>(rows[r * ld + c]);
    out[c] = sum;
  }
}

// Eight columns per thread: 16-byte loads of each row, two float4 stores.
template <typename T>
__global__ void sum_rows_vec8_kernel(const T* rows, int64_t row_count, int64_t cols8, int64_t ld,
                                     float* out) {
  GRID_STRIDE(c8, cols8) {
    float sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t r = 0; r < row_count; ++r) {
      const uint4 packed = *reinterpret_cast<const uint4*>(rows + r * ld + c8 * 8);
      const T* values = reinterpret_cast<const T*>(&packed);
#pragma unroll
      for (int j = 0; j < 8; ++j) sums[j] += ToFloat<T>(values[j]);
    }
    float4* dst = reinterpret_cast<float4*>(out + c8 * 8);
    dst[0] = make_float4(sums[0], sums[1], sums[2], sums[3]);
    dst[1] = make_float4(sums[4], sums[5], sums[6], sums[7]);
  }
}

// One thread per column: consecutive threads read consecutive columns (coalesced).
template <typename T>
__global__ void bias_gradient_kernel(const T* dy, int64_t rows, int64_t cols, float* db_acc) {
  GRID_STRIDE(col, cols) {
    float sum = 0.0f;
    for (int64_t row = 0; row < rows; ++row) sum += ToFloat<T>(dy[row * cols + col]);
    db_acc[col] += ToFloat<T>(FromFloat<T>(sum));
  }
}

template <typename T>
__global__ void compress_kernel(const float* src, float divisor, T* dst, int64_t n) {
  GRID_STRIDE(i, n) dst[i] = FromFloat<T>(ToFloat<T>(FromFloat<T>(src[i])) / divisor);
}

__global__ void copy_rows_wrapping_kernel(const float* src, int64_t src_rows, int64_t cols,
                                          int64_t first, float* dst, int64_t dst_rows) {
  GRID_STRIDE(i, dst_rows * cols) {
    const int64_t row = i / cols, col = i % cols;
    dst[i] = src[((first + row) % src_rows) * cols + col];
  }
}

__global__ void gather_rows_kernel(const float* src, int64_t src_rows, int64_t cols,
                                   const float* indices, float* dst, int64_t dst_rows) {
  GRID_STRIDE(i, dst_rows * cols) {
    const int64_t row = i / cols, col = i % cols;
    int64_t from = static_cast<int64_t>(indices[row]);
    from = from < 0 ? 0 : (from >= src_rows ? src_rows - 1 : from);
    dst[i] = src[from * cols + col];
  }
}

// The normalization layers' activations: loads and stores by a dtype known at run time (the
// norms mix f32 with the compute dtype).
__global__ void activation_forward_mixed_kernel(ActivationKind act, const void* x, DType xd,
                                                void* y, DType yd, int64_t n) {
  GRID_STRIDE(i, n) { Store(y, yd, i, mptrain::ActivationForward(act, Load(x, xd, i))); }
}

__global__ void activation_backward_mixed_kernel(ActivationKind act, const void* pre, DType pd,
                                                 const void* dy, DType gd, void* d_pre, DType od,
                                                 int64_t n) {
  GRID_STRIDE(i, n) {
    Store(d_pre, od, i, ActivationGradient(act, Load(pre, pd, i), Load(dy, gd, i)));
  }
}

}  // namespace

cudaError_t CastFromF32(const float* src, void* dst, DType dtype, int64_t n, cudaStream_t stream) {
  return Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    cast_from_f32_kernel<T><<<Blocks(n), kThreads, 0, stream>>>(src, static_cast<T*>(dst), n);
    return cudaGetLastError();
  });
}

cudaError_t CompressF32(const float* src, float divisor, void* dst, DType dtype, int64_t n,
                        cudaStream_t stream) {
  return Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    compress_kernel<T><<<Blocks(n), kThreads, 0, stream>>>(src, divisor, static_cast<T*>(dst), n);
    return cudaGetLastError();
  });
}

cudaError_t CastToF32(const void* src, DType dtype, float* dst, int64_t n, cudaStream_t stream) {
  return Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    cast_to_f32_kernel<T><<<Blocks(n), kThreads, 0, stream>>>(static_cast<const T*>(src), dst, n);
    return cudaGetLastError();
  });
}

cudaError_t BroadcastBias(const void* bias, void* out, DType dtype, int64_t rows, int64_t cols,
                          cudaStream_t stream) {
  return Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    broadcast_bias_kernel<T><<<Blocks(rows * cols), kThreads, 0, stream>>>(
        static_cast<const T*>(bias), static_cast<T*>(out), rows, cols);
    return cudaGetLastError();
  });
}

cudaError_t ActivationForward(ActivationKind act, const void* pre, void* y, DType dtype, int64_t n,
                              cudaStream_t stream) {
  const bool vectorized = Aligned16({pre, y}) && n % 8 == 0;
  return Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 2) {
      if (vectorized) {
        activation_forward_vec8_kernel<T><<<Blocks(n / 8), kThreads, 0, stream>>>(
            act, static_cast<const T*>(pre), static_cast<T*>(y), n / 8);
        return cudaGetLastError();
      }
    }
    activation_forward_kernel<T><<<Blocks(n), kThreads, 0, stream>>>(
        act, static_cast<const T*>(pre), static_cast<T*>(y), n);
    return cudaGetLastError();
  });
}

cudaError_t ActivationBackward(ActivationKind act, const void* pre, const void* dy, void* d_pre,
                               DType dtype, int64_t n, cudaStream_t stream) {
  const bool vectorized = Aligned16({pre, dy, d_pre}) && n % 8 == 0;
  return Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 2) {
      if (vectorized) {
        activation_backward_vec8_kernel<T><<<Blocks(n / 8), kThreads, 0, stream>>>(
            act, static_cast<const T*>(pre), static_cast<const T*>(dy), static_cast<T*>(d_pre),
            n / 8);
        return cudaGetLastError();
      }
    }
    activation_backward_kernel<T><<<Blocks(n), kThreads, 0, stream>>>(
        act, static_cast<const T*>(pre), static_cast<const T*>(dy), static_cast<T*>(d_pre), n);
    return cudaGetLastError();
  });
}

cudaError_t AccumulateF32(const void* src, DType dtype, float* acc, int64_t n, bool overwrite,
                          cudaStream_t stream) {
  const bool aligned = reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(acc) % 16 == 0 && n % 8 == 0;
  if (dtype != DType::kF32 && aligned) {
    return Dispatch(dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (sizeof(T) == 2) {
        accumulate_f32_vec8_kernel<T><<<Blocks(n / 8), kThreads, 0, stream>>>(
            static_cast<const T*>(src), acc, n / 8, overwrite);
      }
      return cudaGetLastError();
    });
  }
  return Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    accumulate_f32_kernel<T><<<Blocks(n), kThreads, 0, stream>>>(static_cast<const T*>(src), acc,
                                                                  n, overwrite ? 0.0f : 1.0f);
    return cudaGetLastError();
  });
}

cudaError_t SumRowsToF32(const void* rows, DType dtype, int64_t row_count, int64_t cols,
                         int64_t ld, float* out, cudaStream_t stream) {
  const bool aligned = reinterpret_cast<uintptr_t>(rows) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 16 == 0 && cols % 8 == 0 && ld % 8 == 0;
  return Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 2) {
      if (aligned) {
        sum_rows_vec8_kernel<T><<<Blocks(cols / 8), kThreads, 0, stream>>>(
            static_cast<const T*>(rows), row_count, cols / 8, ld, out);
        return cudaGetLastError();
      }
    }
    sum_rows_kernel<T><<<Blocks(cols), kThreads, 0, stream>>>(static_cast<const T*>(rows),
                                                              row_count, cols, ld, out);
    return cudaGetLastError();
  });
}

cudaError_t BiasGradient(const void* dy, DType dtype, int64_t rows, int64_t cols, float* db_acc,
                         cudaStream_t stream) {
  return Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    bias_gradient_kernel<T><<<Blocks(cols), kThreads, 0, stream>>>(static_cast<const T*>(dy), rows,
                                                                   cols, db_acc);
    return cudaGetLastError();
  });
}

cudaError_t CopyRowsWrapping(const float* src, int64_t src_rows, int64_t cols, int64_t first,
                             float* dst, int64_t dst_rows, cudaStream_t stream) {
  copy_rows_wrapping_kernel<<<Blocks(dst_rows * cols), kThreads, 0, stream>>>(
      src, src_rows, cols, first % src_rows, dst, dst_rows);
  return cudaGetLastError();
}

cudaError_t GatherRows(const float* src, int64_t src_rows, int64_t cols, const float* indices,
                       float* dst, int64_t dst_rows, cudaStream_t stream) {
  gather_rows_kernel<<<Blocks(dst_rows * cols), kThreads, 0, stream>>>(src, src_rows, cols,
                                                                       indices, dst, dst_rows);
  return cudaGetLastError();
}

cudaError_t ActivationForwardMixed(ActivationKind act, const void* x, DType x_dtype, void* y,
                                   DType y_dtype, int64_t n, cudaStream_t stream) {
  activation_forward_mixed_kernel<<<Blocks(n), kThreads, 0, stream>>>(act, x, x_dtype, y,
                                                                       y_dtype, n);
  return cudaGetLastError();
}

cudaError_t ActivationBackwardMixed(ActivationKind act, const void* pre, DType pre_dtype,
                                    const void* dy, DType dy_dtype, void* d_pre,
                                    DType d_pre_dtype, int64_t n, cudaStream_t stream) {
  activation_backward_mixed_kernel<<<Blocks(n), kThreads, 0, stream>>>(
      act, pre, pre_dtype, dy, dy_dtype, d_pre, d_pre_dtype, n);
  return cudaGetLastError();
}

}  // namespace mptrain::cuda
