// LayerNorm's kernels (torch.nn.functional.layer_norm over the last dimension), forward and
// backward. A row is one warp's: the sums are warp shuffles, no block barrier, and a row's
// elements are read 8 at a time (16-byte loads of bf16/fp16, two of fp32) where the width
// allows. The parameter gradients are column sums over every row: each block sums a chunk of
// rows for a tile of columns (consecutive threads, consecutive columns: coalesced), and a second
// pass adds the chunks in chunk order, so the result does not depend on scheduling.
//
// Statistics as the CPU backend computes them (cpu_backend.cc): sums in double, the variance
// biased, 1/sqrt in double (norm_math.h InverseStd); the output and input gradient in fp32.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/kernel_support.cuh"
#include "backends/cuda/layer_norm_kernels.h"

#include <algorithm>
#include "trainer/norm_math.h"

namespace mptrain::cuda {
namespace {

constexpr int kWarpsPerBlock = kThreads / 32;

__device__ __forceinline__ double WarpSum(double value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffff, value, offset);
  return value;
}

// N consecutive elements as floats: one 16-byte load per 8 two-byte values.
template <int N, typename T>
__device__ __forceinline__ void LoadN(const T* p, float* out) {
  if constexpr (N == 8 && sizeof(T) == 2) {
    const uint4 packed = *reinterpret_cast<const uint4*>(p);
    const T* values = reinterpret_cast<const T*>(&packed);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = ToFloat<T>(values[j]);
  } else if constexpr (N == 8) {
    const float4 lo = reinterpret_cast<const float4*>(p)[0];
    const float4 hi = reinterpret_cast<const float4*>(p)[1];
    out[0] = ToFloat<T>(lo.x), out[1] = ToFloat<T>(lo.y), out[2] = ToFloat<T>(lo.z);
    out[3] = ToFloat<T>(lo.w), out[4] = ToFloat<T>(hi.x), out[5] = ToFloat<T>(hi.y);
    out[6] = ToFloat<T>(hi.z), out[7] = ToFloat<T>(hi.w);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = ToFloat<T>(p[j]);
  }
}

template <int N, typename T>
__device__ __forceinline__ void StoreN(T* p, const float* values) {
  if constexpr (N == 8 && sizeof(T) == 2) {
    uint4 packed;
    T* out = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = FromFloat<T>(values[j]);
    *reinterpret_cast<uint4*>(p) = packed;
  } else if constexpr (N == 8) {
    reinterpret_cast<float4*>(p)[0] = make_float4(values[0], values[1], values[2], values[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(values[4], values[5], values[6], values[7]);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) p[j] = FromFloat<T>(values[j]);
  }
}

// One warp per row; N elements per lane per iteration (N = 8 needs cols % 8 == 0 and 16-byte
// aligned rows).
template <int N, typename X, typename Y>
__global__ void layer_norm_forward_kernel(const X* x, int64_t rows, int64_t cols,
                                          const float* weight, const float* bias, float eps,
                                          float* row_stats, Y* y) {
  const int lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const X* in = x + r * cols;
  float v[N];
  double sum = 0;
  for (int64_t c = lane * N; c < cols; c += 32 * N) {
    LoadN<N>(in + c, v);
#pragma unroll
    for (int j = 0; j < N; ++j) sum += v[j];
  }
  const double mean = WarpSum(sum) / cols;
  double squares = 0;
  for (int64_t c = lane * N; c < cols; c += 32 * N) {
    LoadN<N>(in + c, v);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const double d = v[j] - mean;
      squares += d * d;
    }
  }
  const float rstd = InverseStd(WarpSum(squares) / cols, eps);
  const float mean_f = static_cast<float>(mean);
  if (lane == 0) {
    row_stats[2 * r] = mean_f;
    row_stats[2 * r + 1] = rstd;
  }
  float w[N], b[N];
  for (int64_t c = lane * N; c < cols; c += 32 * N) {
    LoadN<N>(in + c, v);
    LoadN<N>(weight + c, w);
    LoadN<N>(bias + c, b);
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = (v[j] - mean_f) * rstd * w[j] + b[j];
    StoreN<N>(y + r * cols + c, v);
  }
}

// dx of one row per warp: rstd · (g − mean(g) − x̂ · mean(g · x̂)), g = dy · weight.
template <int N, typename G, typename X, typename D>
__global__ void layer_norm_backward_input_kernel(const G* dy, const X* x, int64_t rows,
                                                 int64_t cols, const float* row_stats,
                                                 const float* weight, D* dx) {
  const int lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const int64_t base = r * cols;
  const float mean = row_stats[2 * r], rstd = row_stats[2 * r + 1];
  float xv[N], gv[N], w[N];
  double sum_g = 0, sum_gx = 0;
  for (int64_t c = lane * N; c < cols; c += 32 * N) {
    LoadN<N>(x + base + c, xv);
    LoadN<N>(dy + base + c, gv);
    LoadN<N>(weight + c, w);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float xhat = (xv[j] - mean) * rstd;
      const double g = static_cast<double>(gv[j]) * w[j];
      sum_g += g;
      sum_gx += g * xhat;
    }
  }
  const float mean_g = static_cast<float>(WarpSum(sum_g) / cols);
  const float mean_gx = static_cast<float>(WarpSum(sum_gx) / cols);
  for (int64_t c = lane * N; c < cols; c += 32 * N) {
    LoadN<N>(x + base + c, xv);
    LoadN<N>(dy + base + c, gv);
    LoadN<N>(weight + c, w);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float xhat = (xv[j] - mean) * rstd;
      xv[j] = rstd * (gv[j] * w[j] - mean_g - xhat * mean_gx);
    }
    StoreN<N>(dx + base + c, xv);
  }
}

// partials[chunk][0 or 1][c]: Σ dy · x̂ and Σ dy over the chunk's rows, in row order. One thread
// per column of a tile of kThreads columns; blockIdx.y is the chunk.
template <typename G, typename X>
__global__ void layer_norm_param_partials_kernel(const G* dy, const X* x, int64_t rows,
                                                 int64_t cols, int64_t rows_per_chunk,
                                                 const float* row_stats, float* partials) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= cols) return;
  const int64_t first = blockIdx.y * rows_per_chunk;
  const int64_t last = min(rows, first + rows_per_chunk);
  float dw = 0, db = 0;
#pragma unroll 8
  for (int64_t r = first; r < last; ++r) {
    const float xhat = (ToFloat<X>(x[r * cols + c]) - row_stats[2 * r]) * row_stats[2 * r + 1];
    const float g = ToFloat<G>(dy[r * cols + c]);
    dw += g * xhat;
    db += g;
  }
  partials[(2 * blockIdx.y) * cols + c] = dw;
  partials[(2 * blockIdx.y + 1) * cols + c] = db;
}

// The chunks added in chunk order (double), then into (or over) the fp32 gradients.
__global__ void layer_norm_param_finish_kernel(const float* partials, int64_t chunks,
                                               int64_t cols, float* dweight, float* dbias,
                                               bool overwrite) {
  GRID_STRIDE(c, cols) {
    double dw = 0, db = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      dw += partials[(2 * k) * cols + c];
      db += partials[(2 * k + 1) * cols + c];
    }
    dweight[c] = (overwrite ? 0.0f : dweight[c]) + static_cast<float>(dw);
    dbias[c] = (overwrite ? 0.0f : dbias[c]) + static_cast<float>(db);
  }
}

bool Vectorizable(int64_t cols, std::initializer_list<const void*> pointers) {
  return cols % 8 == 0 && Aligned16(pointers);
}

unsigned RowBlocks(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// Rows per chunk of the parameter gradients: enough chunks to fill the GPU with a few column
// tiles, at least 16 rows each, and the partials bounded (LayerNormParamPartialsBytes).
int64_t RowsPerChunk(int64_t rows) {
  return std::max<int64_t>(16, (rows + kLayerNormMaxChunks - 1) / kLayerNormMaxChunks);
}

}  // namespace

int64_t LayerNormParamPartialsBytes(int64_t rows, int64_t cols) {
  const int64_t chunks = (rows + RowsPerChunk(rows) - 1) / RowsPerChunk(rows);
  return std::max<int64_t>(1, chunks) * 2 * cols * static_cast<int64_t>(sizeof(float));
}

cudaError_t LayerNormForward(const void* x, DType x_dtype, int64_t rows, int64_t cols,
                             const float* weight, const float* bias, float eps, float* row_stats,
                             void* y, DType y_dtype, cudaStream_t stream) {
  if (rows < 1 || cols < 1 || RowBlocks(rows) > 2147483647u) return cudaErrorInvalidConfiguration;
  const bool vec = Vectorizable(cols, {x, weight, bias, y});
  return Dispatch(x_dtype, [&](auto x_tag) {
    using X = decltype(x_tag);
    return Dispatch(y_dtype, [&](auto y_tag) {
      using Y = decltype(y_tag);
      if (vec) {
        layer_norm_forward_kernel<8, X, Y><<<RowBlocks(rows), kThreads, 0, stream>>>(
            static_cast<const X*>(x), rows, cols, weight, bias, eps, row_stats,
            static_cast<Y*>(y));
      } else {
        layer_norm_forward_kernel<1, X, Y><<<RowBlocks(rows), kThreads, 0, stream>>>(
            static_cast<const X*>(x), rows, cols, weight, bias, eps, row_stats,
            static_cast<Y*>(y));
      }
      return cudaGetLastError();
    });
  });
}

cudaError_t LayerNormBackward(const void* dy, DType dy_dtype, const void* x, DType x_dtype,
                              int64_t rows, int64_t cols, const float* row_stats,
                              const float* weight, void* dx, DType dx_dtype, float* dweight,
                              float* dbias, bool overwrite, float* partials,
                              cudaStream_t stream) {
  if (rows < 1 || cols < 1) return cudaErrorInvalidConfiguration;
  const bool vec = Vectorizable(cols, {dy, x, weight, dx});
  const int64_t rows_per_chunk = RowsPerChunk(rows);
  const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  const dim3 partial_grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                          static_cast<unsigned>(chunks));
  return Dispatch(dy_dtype, [&](auto g_tag) {
    using G = decltype(g_tag);
    return Dispatch(x_dtype, [&](auto x_tag) {
      using X = decltype(x_tag);
      cudaError_t e = Dispatch(dx_dtype, [&](auto d_tag) {
        using D = decltype(d_tag);
        if (vec) {
          layer_norm_backward_input_kernel<8, G, X, D><<<RowBlocks(rows), kThreads, 0, stream>>>(
              static_cast<const G*>(dy), static_cast<const X*>(x), rows, cols, row_stats, weight,
              static_cast<D*>(dx));
        } else {
          layer_norm_backward_input_kernel<1, G, X, D><<<RowBlocks(rows), kThreads, 0, stream>>>(
              static_cast<const G*>(dy), static_cast<const X*>(x), rows, cols, row_stats, weight,
              static_cast<D*>(dx));
        }
        return cudaGetLastError();
      });
      if (e != cudaSuccess) return e;
      layer_norm_param_partials_kernel<G, X><<<partial_grid, kThreads, 0, stream>>>(
          static_cast<const G*>(dy), static_cast<const X*>(x), rows, cols, rows_per_chunk,
          row_stats, partials);
      if ((e = cudaGetLastError()) != cudaSuccess) return e;
      layer_norm_param_finish_kernel<<<Blocks(cols), kThreads, 0, stream>>>(
          partials, chunks, cols, dweight, dbias, overwrite);
      return cudaGetLastError();
    });
  });
}

}  // namespace mptrain::cuda
