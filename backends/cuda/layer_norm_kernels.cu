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
#include <type_traits>
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
// aligned rows). With a residual (AddLayerNormForward), x is written first as f32(a) + f32(b)
// (the Add kernel's sum) and then read back: X is float.
template <int N, typename X, typename Y, typename A = float, typename B = float>
__global__ void layer_norm_forward_kernel(const X* x, int64_t rows, int64_t cols,
                                          const float* weight, const float* bias, float eps,
                                          float* row_stats, Y* y, const A* a = nullptr,
                                          const B* b_in = nullptr, float* sum_out = nullptr) {
  const int lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const X* in = x + r * cols;
  float v[N];
  double sum = 0;
  if (a != nullptr) {
    float w[N];
    for (int64_t c = lane * N; c < cols; c += 32 * N) {
      LoadN<N>(a + r * cols + c, v);
      LoadN<N>(b_in + r * cols + c, w);
#pragma unroll
      for (int j = 0; j < N; ++j) v[j] += w[j];
      StoreN<N>(sum_out + r * cols + c, v);
#pragma unroll
      for (int j = 0; j < N; ++j) sum += v[j];
    }
  } else {
    for (int64_t c = lane * N; c < cols; c += 32 * N) {
      LoadN<N>(in + c, v);
#pragma unroll
      for (int j = 0; j < N; ++j) sum += v[j];
    }
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

// layer_norm_forward_kernel<8, ...> for rows of at most 32 · 8 · kIters columns with the row
// held in registers: every load of a row is issued before the first sum (one pass over memory
// instead of three), the same arithmetic in the same order (bit for bit the same output).
template <int kIters, typename X, typename Y, typename A = float, typename B = float>
__global__ void layer_norm_forward_cached_kernel(const X* x, int64_t rows, int64_t cols,
                                                 const float* weight, const float* bias,
                                                 float eps, float* row_stats, Y* y,
                                                 const A* a = nullptr, const B* b_in = nullptr,
                                                 float* sum_out = nullptr) {
  constexpr int N = 8;
  const int lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const int64_t base = r * cols;
  float v[kIters][N];
  if (a != nullptr) {
    float w[kIters][N];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t c = (lane + 32 * it) * N;
      if (c < cols) {
        LoadN<N>(a + base + c, v[it]);
        LoadN<N>(b_in + base + c, w[it]);
      }
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t c = (lane + 32 * it) * N;
      if (c < cols) {
#pragma unroll
        for (int j = 0; j < N; ++j) v[it][j] += w[it][j];
        StoreN<N>(sum_out + base + c, v[it]);
      }
    }
  } else {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t c = (lane + 32 * it) * N;
      if (c < cols) LoadN<N>(x + base + c, v[it]);
    }
  }
  double sum = 0;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    if ((lane + 32 * it) * N < cols) {
#pragma unroll
      for (int j = 0; j < N; ++j) sum += v[it][j];
    }
  }
  const double mean = WarpSum(sum) / cols;
  double squares = 0;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    if ((lane + 32 * it) * N < cols) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const double d = v[it][j] - mean;
        squares += d * d;
      }
    }
  }
  const float rstd = InverseStd(WarpSum(squares) / cols, eps);
  const float mean_f = static_cast<float>(mean);
  if (lane == 0) {
    row_stats[2 * r] = mean_f;
    row_stats[2 * r + 1] = rstd;
  }
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int64_t c = (lane + 32 * it) * N;
    if (c < cols) {
      float w[N], b[N];
      LoadN<N>(weight + c, w);
      LoadN<N>(bias + c, b);
#pragma unroll
      for (int j = 0; j < N; ++j) v[it][j] = (v[it][j] - mean_f) * rstd * w[j] + b[j];
      StoreN<N>(y + base + c, v[it]);
    }
  }
}

// dx of one row per warp: rstd · (g − mean(g) − x̂ · mean(g · x̂)), g = dy · weight.
// Into a residual (LayerNormBackwardIntoResidual): d_residual += dx (f32) instead of writing
// dx, and d_low = round(d_residual) unless null.
template <int N, typename G, typename X, typename D, typename L = float>
__global__ void layer_norm_backward_input_kernel(const G* dy, const X* x, int64_t rows,
                                                 int64_t cols, const float* row_stats,
                                                 const float* weight, D* dx,
                                                 float* d_residual = nullptr,
                                                 L* d_low = nullptr) {
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
    if (d_residual != nullptr) {
      float resid[N];
      LoadN<N>(d_residual + base + c, resid);
#pragma unroll
      for (int j = 0; j < N; ++j) resid[j] = __fadd_rn(resid[j], xv[j]);  // No FMA: as Add.
      StoreN<N>(d_residual + base + c, resid);
      if (d_low != nullptr) StoreN<N>(d_low + base + c, resid);
    } else {
      StoreN<N>(dx + base + c, xv);
    }
  }
}

// layer_norm_backward_input_kernel<8, ...> and the parameter gradients' partial sums in one
// pass over dy and x, for rows of at most 32 · 8 · kIters columns held in registers: block k
// takes rows [k·rows_per_block, (k+1)·rows_per_block), warp w of it every 8th of those from
// the w-th; each lane adds dy · x̂ and dy of its own columns into its warp's rows of shared
// memory ([warp][Σ dy·x̂ | Σ dy][cols]: no two lanes touch one address, no atomics), and the
// block writes partials[k] = the warps' sums in warp order. The input gradient is the other
// kernel's arithmetic in its order (the same bits); the partials are summed by the same
// finish kernel, in chunk order: deterministic.
template <int kIters, typename G, typename X, typename D, typename L>
__global__ void __launch_bounds__(kThreads)
    layer_norm_backward_fused_kernel(const G* dy, const X* x, int64_t rows, int64_t cols,
                                     int64_t rows_per_block, const float* row_stats,
                                     const float* weight, D* dx, float* d_residual, L* d_low,
                                     float* partials, bool sum_low) {
  constexpr int N = 8;
  extern __shared__ float4 shared_sums[];
  float* sums = reinterpret_cast<float*>(shared_sums);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // [warp][Σ dy·x̂ | Σ dy | Σ d_low (sum_low only)][cols]
  const int planes = sum_low ? 3 : 2;
  float* warp_dw = sums + static_cast<int64_t>(warp) * planes * cols;
  float* warp_db = warp_dw + cols;
  float* warp_dlow = warp_db + cols;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int64_t c = (lane + 32 * it) * N;
    if (c < cols) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        warp_dw[c + j] = 0.0f, warp_db[c + j] = 0.0f;
        if (sum_low) warp_dlow[c + j] = 0.0f;
      }
    }
  }
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t last = min(rows, first + rows_per_block);
  for (int64_t r = first + warp; r < last; r += kWarpsPerBlock) {
    const int64_t base = r * cols;
    const float mean = row_stats[2 * r], rstd = row_stats[2 * r + 1];
    float xhat[kIters][N], g[kIters][N];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t c = (lane + 32 * it) * N;
      if (c < cols) {
        LoadN<N>(x + base + c, xhat[it]);
        LoadN<N>(dy + base + c, g[it]);
      }
    }
    double sum_g = 0, sum_gx = 0;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t c = (lane + 32 * it) * N;
      if (c < cols) {
        float w[N];
        LoadN<N>(weight + c, w);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          xhat[it][j] = (xhat[it][j] - mean) * rstd;
          const double gw = static_cast<double>(g[it][j]) * w[j];
          sum_g += gw;
          sum_gx += gw * xhat[it][j];
        }
      }
    }
    const float mean_g = static_cast<float>(WarpSum(sum_g) / cols);
    const float mean_gx = static_cast<float>(WarpSum(sum_gx) / cols);
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t c = (lane + 32 * it) * N;
      if (c < cols) {
        float w[N], out[N];
        LoadN<N>(weight + c, w);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          out[j] = rstd * (g[it][j] * w[j] - mean_g - xhat[it][j] * mean_gx);
        }
        if (d_residual != nullptr) {
          float resid[N];
          LoadN<N>(d_residual + base + c, resid);
#pragma unroll
          for (int j = 0; j < N; ++j) resid[j] = __fadd_rn(resid[j], out[j]);  // As Add.
          StoreN<N>(d_residual + base + c, resid);
          if (d_low != nullptr) StoreN<N>(d_low + base + c, resid);
          if (sum_low) {
            // The branch's bias gradient: Σ over rows of the rounded copy, as the Linear's.
            float low[N];
            LoadN<N>(warp_dlow + c, low);
#pragma unroll
            for (int j = 0; j < N; ++j) low[j] += ToFloat<L>(FromFloat<L>(resid[j]));
            StoreN<N>(warp_dlow + c, low);
          }
        } else {
          StoreN<N>(dx + base + c, out);
        }
        float dw[N], db[N];
        LoadN<N>(warp_dw + c, dw);
        LoadN<N>(warp_db + c, db);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          dw[j] += g[it][j] * xhat[it][j];
          db[j] += g[it][j];
        }
        StoreN<N>(warp_dw + c, dw);
        StoreN<N>(warp_db + c, db);
      }
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    float dw = 0, db = 0, dlow = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      const float* warp_sums = sums + static_cast<int64_t>(w) * planes * cols;
      dw += warp_sums[c];
      db += warp_sums[cols + c];
      if (sum_low) dlow += warp_sums[2 * cols + c];
    }
    float* block_partials = partials + static_cast<int64_t>(blockIdx.x) * planes * cols;
    block_partials[c] = dw;
    block_partials[cols + c] = db;
    if (sum_low) block_partials[2 * cols + c] = dlow;
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

// The chunks added in a fixed order (double), then into (or over) the fp32 gradients. A block
// per 32 columns: lane l reads column 32·blockIdx.x + l (coalesced), warp w adds chunks w, w + 8,
// ... in order, and the 8 warps' sums are added in warp order.
// With d_low_bias (planes 3), the third plane likewise, rounded to L (the branch's compute dtype,
// as its Linear's bias gradient) before it is added.
template <typename L>
__global__ void layer_norm_param_finish_kernel(const float* partials, int64_t chunks,
                                               int64_t cols, int planes, float* dweight,
                                               float* dbias, float* d_low_bias, bool overwrite) {
  __shared__ double sums[3][kWarpsPerBlock][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  double dw = 0, db = 0, dlow = 0;
  if (c < cols) {
    for (int64_t k = warp; k < chunks; k += kWarpsPerBlock) {
      const float* chunk = partials + k * planes * cols;
      dw += chunk[c];
      db += chunk[cols + c];
      if (planes == 3) dlow += chunk[2 * cols + c];
    }
  }
  sums[0][warp][lane] = dw;
  sums[1][warp][lane] = db;
  sums[2][warp][lane] = dlow;
  __syncthreads();
  if (warp == 0 && c < cols) {
    dw = 0, db = 0, dlow = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      dw += sums[0][w][lane], db += sums[1][w][lane], dlow += sums[2][w][lane];
    }
    dweight[c] = (overwrite ? 0.0f : dweight[c]) + static_cast<float>(dw);
    dbias[c] = (overwrite ? 0.0f : dbias[c]) + static_cast<float>(db);
    if (d_low_bias != nullptr) {
      const float rounded = ToFloat<L>(FromFloat<L>(static_cast<float>(dlow)));
      d_low_bias[c] = (overwrite ? 0.0f : d_low_bias[c]) + rounded;
    }
  }
}

// Rows the forward holds in registers (GPT-2 up to 1024 wide: 124M's 768, 350M's 1024).
constexpr int64_t kMaxCachedCols = 32 * 8 * 4;

bool Vectorizable(int64_t cols, std::initializer_list<const void*> pointers) {
  return cols % 8 == 0 && Aligned16(pointers);
}

unsigned RowBlocks(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// The parameter gradients' chunks of rows: about 512 blocks of (column tile, chunk) to fill the
// GPU, at least 16 rows per chunk, at most kLayerNormMaxChunks chunks (the partials' bound:
// LayerNormParamPartialsBytes). GPT-2 124M at 16 x 1024 rows: 128 chunks of 128 rows, 3 tiles.
int64_t RowsPerChunk(int64_t rows, int64_t cols) {
  const int64_t tiles = (cols + kThreads - 1) / kThreads;
  int64_t chunks = std::max<int64_t>(1, 512 / tiles);
  chunks = std::min({chunks, (rows + 15) / 16, kLayerNormMaxChunks});
  chunks = std::max<int64_t>(1, chunks);
  return (rows + chunks - 1) / chunks;
}

int64_t Chunks(int64_t rows, int64_t cols) {
  const int64_t per_chunk = RowsPerChunk(rows, cols);
  return (rows + per_chunk - 1) / per_chunk;
}

// The fused backward's blocks: 64 rows each (8 per warp; GPT-2 at 16 x 1024 rows: 256 blocks,
// two per SM as its registers allow, and 256 partial sums for the finish to add), at most
// kLayerNormMaxChunks.
int64_t FusedRowsPerBlock(int64_t rows) {
  return std::max<int64_t>(64, (rows + kLayerNormMaxChunks - 1) / kLayerNormMaxChunks);
}

int64_t FusedBlocks(int64_t rows) {
  const int64_t per_block = FusedRowsPerBlock(rows);
  return (rows + per_block - 1) / per_block;
}

size_t FusedSharedBytes(int64_t cols, int planes) {
  return static_cast<size_t>(kWarpsPerBlock) * planes * cols * sizeof(float);
}

// Whether the fused backward takes these rows: an f32 input, rows held in registers, and its
// `planes` column sums per warp within the shared memory a block may have on this device
// (1024 columns: 64 KiB with two planes, 96 KiB with three).
bool FusedBackward(int64_t cols, DType x_dtype, bool into_residual, DType dx_dtype,
                   std::initializer_list<const void*> pointers, int planes) {
  return Vectorizable(cols, pointers) && cols <= kMaxCachedCols && x_dtype == DType::kF32 &&
         (into_residual || dx_dtype == DType::kF32) &&
         FusedSharedBytes(cols, planes) <= MaxDynamicSharedBytesPerBlock();
}

}  // namespace

int64_t LayerNormParamPartialsBytes(int64_t rows, int64_t cols) {
  const int64_t chunks = std::max({int64_t{1}, Chunks(rows, cols), FusedBlocks(rows)});
  return chunks * 3 * cols * static_cast<int64_t>(sizeof(float));
}

bool LayerNormBackwardSumsLowCopy(const void* dy, const void* x, DType x_dtype, int64_t cols,
                                  const float* weight, const float* d_residual,
                                  const void* d_low) {
  return d_residual != nullptr && d_low != nullptr &&
         FusedBackward(cols, x_dtype, true, DType::kF32, {dy, x, weight, d_residual, d_low}, 3);
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
      if (vec && cols <= kMaxCachedCols) {
        auto launch = [&](auto kernel) {
          kernel<<<RowBlocks(rows), kThreads, 0, stream>>>(
              static_cast<const X*>(x), rows, cols, weight, bias, eps, row_stats,
              static_cast<Y*>(y), nullptr, nullptr, nullptr);
        };
        if (cols <= 32 * 8 * 3) {
          launch(layer_norm_forward_cached_kernel<3, X, Y>);
        } else {
          launch(layer_norm_forward_cached_kernel<4, X, Y>);
        }
      } else if (vec) {
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

cudaError_t AddLayerNormForward(const void* a, DType a_dtype, const void* b, DType b_dtype,
                                float* sum, int64_t rows, int64_t cols, const float* weight,
                                const float* bias, float eps, float* row_stats, void* y,
                                DType y_dtype, cudaStream_t stream) {
  if (rows < 1 || cols < 1 || RowBlocks(rows) > 2147483647u) return cudaErrorInvalidConfiguration;
  const bool vec = Vectorizable(cols, {a, b, sum, weight, bias, y});
  return Dispatch(a_dtype, [&](auto a_tag) {
    using A = decltype(a_tag);
    return Dispatch(b_dtype, [&](auto b_tag) {
      using B = decltype(b_tag);
      return Dispatch(y_dtype, [&](auto y_tag) {
        using Y = decltype(y_tag);
        if (vec && cols <= kMaxCachedCols) {
          auto launch = [&](auto kernel) {
            kernel<<<RowBlocks(rows), kThreads, 0, stream>>>(
                sum, rows, cols, weight, bias, eps, row_stats, static_cast<Y*>(y),
                static_cast<const A*>(a), static_cast<const B*>(b), sum);
          };
          if (cols <= 32 * 8 * 3) {
            launch(layer_norm_forward_cached_kernel<3, float, Y, A, B>);
          } else {
            launch(layer_norm_forward_cached_kernel<4, float, Y, A, B>);
          }
        } else if (vec) {
          layer_norm_forward_kernel<8, float, Y, A, B><<<RowBlocks(rows), kThreads, 0, stream>>>(
              sum, rows, cols, weight, bias, eps, row_stats, static_cast<Y*>(y),
              static_cast<const A*>(a), static_cast<const B*>(b), sum);
        } else {
          layer_norm_forward_kernel<1, float, Y, A, B><<<RowBlocks(rows), kThreads, 0, stream>>>(
              sum, rows, cols, weight, bias, eps, row_stats, static_cast<Y*>(y),
              static_cast<const A*>(a), static_cast<const B*>(b), sum);
        }
        return cudaGetLastError();
      });
    });
  });
}

cudaError_t LayerNormBackward(const void* dy, DType dy_dtype, const void* x, DType x_dtype,
                              int64_t rows, int64_t cols, const float* row_stats,
                              const float* weight, void* dx, DType dx_dtype, float* dweight,
                              float* dbias, bool overwrite, float* partials,
                              cudaStream_t stream, float* d_residual, void* d_low,
                              DType d_low_dtype, float* d_low_bias) {
  if (rows < 1 || cols < 1) return cudaErrorInvalidConfiguration;
  const bool vec = Vectorizable(cols, {dy, x, weight, dx, d_residual, d_low});
  if (d_low_bias != nullptr &&
      !LayerNormBackwardSumsLowCopy(dy, x, x_dtype, cols, weight, d_residual, d_low)) {
    return cudaErrorNotSupported;
  }
  const int planes = d_low_bias != nullptr ? 3 : 2;
  const bool fused = FusedBackward(cols, x_dtype, d_residual != nullptr, dx_dtype,
                                   {dy, x, weight, dx, d_residual, d_low}, planes);
  const int64_t rows_per_chunk = fused ? FusedRowsPerBlock(rows) : RowsPerChunk(rows, cols);
  const int64_t chunks = fused ? FusedBlocks(rows) : Chunks(rows, cols);
  const dim3 partial_grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                          static_cast<unsigned>(chunks));
  return Dispatch(dy_dtype, [&](auto g_tag) {
    using G = decltype(g_tag);
    return Dispatch(x_dtype, [&](auto x_tag) {
      using X = decltype(x_tag);
      // Into a residual, dx's type is the residual's (f32) and d_low's the copy's.
      cudaError_t e = Dispatch(d_residual != nullptr ? DType::kF32 : dx_dtype, [&](auto d_tag) {
        using D = decltype(d_tag);
        return Dispatch(d_low != nullptr ? d_low_dtype : DType::kF32, [&](auto l_tag) {
          using L = decltype(l_tag);
          // The fused kernel for an f32 input and an f32 input gradient only (the GPT's residual
          // stream), which keeps its instantiations (and this file's compile time) in bounds.
          if constexpr (std::is_same_v<X, float> && std::is_same_v<D, float>) {
          if (fused) {
            auto launch = [&](auto kernel) {
              const size_t shared = FusedSharedBytes(cols, planes);
              cudaError_t attr = cudaFuncSetAttribute(
                  kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
              if (attr != cudaSuccess) return attr;
              kernel<<<static_cast<unsigned>(chunks), kThreads, shared, stream>>>(
                  static_cast<const G*>(dy), static_cast<const X*>(x), rows, cols,
                  rows_per_chunk, row_stats, weight, static_cast<D*>(dx), d_residual,
                  static_cast<L*>(d_low), partials, d_low_bias != nullptr);
              return cudaGetLastError();
            };
            return cols <= 32 * 8 * 3 ? launch(layer_norm_backward_fused_kernel<3, G, X, D, L>)
                                      : launch(layer_norm_backward_fused_kernel<4, G, X, D, L>);
          }
          }
          if (vec) {
            layer_norm_backward_input_kernel<8, G, X, D, L>
                <<<RowBlocks(rows), kThreads, 0, stream>>>(
                    static_cast<const G*>(dy), static_cast<const X*>(x), rows, cols, row_stats,
                    weight, static_cast<D*>(dx), d_residual, static_cast<L*>(d_low));
          } else {
            layer_norm_backward_input_kernel<1, G, X, D, L>
                <<<RowBlocks(rows), kThreads, 0, stream>>>(
                    static_cast<const G*>(dy), static_cast<const X*>(x), rows, cols, row_stats,
                    weight, static_cast<D*>(dx), d_residual, static_cast<L*>(d_low));
          }
          return cudaGetLastError();
        });
      });
      if (e != cudaSuccess) return e;
      if (!fused) {
        layer_norm_param_partials_kernel<G, X><<<partial_grid, kThreads, 0, stream>>>(
            static_cast<const G*>(dy), static_cast<const X*>(x), rows, cols, rows_per_chunk,
            row_stats, partials);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
      }
      return Dispatch(d_low != nullptr ? d_low_dtype : DType::kF32, [&](auto l_tag) {
        using L = decltype(l_tag);
        layer_norm_param_finish_kernel<L><<<static_cast<unsigned>((cols + 31) / 32), kThreads, 0,
                                             stream>>>(partials, chunks, cols, planes, dweight,
                                                       dbias, d_low_bias, overwrite);
        return cudaGetLastError();
      });
    });
  });
}

}  // namespace mptrain::cuda
