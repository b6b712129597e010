// A Linear's bias gradient (bias_gradient_kernels.h). Stage one: block (tile, chunk) sums the
// chunk's rows for 256 columns: lane l of warp w adds columns 8l..8l+7 of the tile over rows
// w, w + 8, ... of the chunk (16-byte loads, coalesced across the warp), and the 8 warps' sums
// are added in warp order. Stage two: one thread per column adds the chunks in chunk order.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "backends/cuda/bias_gradient_kernels.h"
#include "backends/cuda/kernel_support.cuh"

namespace mptrain::cuda {
namespace {

constexpr int kWarps = kThreads / 32;
constexpr int kTileCols = 32 * 8;
// About 2 blocks per SM of a 132-SM GPU over all tiles, at least 64 rows a chunk.
constexpr int64_t kTargetBlocks = 264;
constexpr int64_t kMinChunkRows = 64;

int64_t Tiles(int64_t cols) { return (cols + kTileCols - 1) / kTileCols; }

int64_t ChunkRows(int64_t rows, int64_t cols) {
  const int64_t chunks = std::max<int64_t>(1, kTargetBlocks / Tiles(cols));
  return std::max(kMinChunkRows, (rows + chunks - 1) / chunks);
}

int64_t Chunks(int64_t rows, int64_t cols) {
  const int64_t per_chunk = ChunkRows(rows, cols);
  return (rows + per_chunk - 1) / per_chunk;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    bias_gradient_partials_kernel(const T* dy, int64_t rows, int64_t cols, int64_t ld,
                                  int64_t chunk_rows, float* partials) {
  __shared__ float sums[kWarps][kTileCols];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTileCols + lane * 8;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t last = min(rows, first + chunk_rows);
  float acc[8] = {};
  if (c0 < cols) {
    // Four rows in flight per iteration.
    constexpr int kInFlight = 4;
    int64_t r = first + warp;
    for (; r + (kInFlight - 1) * kWarps < last; r += kInFlight * kWarps) {
      uint4 v[kInFlight];
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        v[i] = *reinterpret_cast<const uint4*>(dy + (r + i * kWarps) * ld + c0);
      }
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        const T* values = reinterpret_cast<const T*>(&v[i]);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += ToFloat<T>(values[j]);
      }
    }
    for (; r < last; r += kWarps) {
      const uint4 a = *reinterpret_cast<const uint4*>(dy + r * ld + c0);
      const T* values = reinterpret_cast<const T*>(&a);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += ToFloat<T>(values[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) sums[warp][lane * 8 + j] = acc[j];
  __syncthreads();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTileCols + threadIdx.x;
  if (threadIdx.x < kTileCols && c < cols) {
    float total = 0;
    for (int w = 0; w < kWarps; ++w) total += sums[w][threadIdx.x];
    partials[blockIdx.y * cols + c] = total;
  }
}

// A block per 32 columns: lane l takes column 32·blockIdx.x + l (coalesced), warp w adds chunks
// w, w + 8, ... in order, and the 8 warps' sums are added in warp order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    bias_gradient_finish_kernel(const float* partials, int64_t chunks, int64_t cols,
                                float* out_f32, T* out_low, bool overwrite) {
  __shared__ float sums[kWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  float sum = 0;
  if (c < cols) {
    for (int64_t k = warp; k < chunks; k += kWarps) sum += partials[k * cols + c];
  }
  sums[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && c < cols) {
    float total = 0;
    for (int w = 0; w < kWarps; ++w) total += sums[w][lane];
    const T rounded = FromFloat<T>(total);
    if (out_f32 != nullptr) {
      out_f32[c] = (overwrite ? 0.0f : out_f32[c]) + ToFloat<T>(rounded);
    } else {
      out_low[c] = rounded;
    }
  }
}

}  // namespace

int64_t BiasGradientPartialsBytes(int64_t rows, int64_t cols) {
  return std::max<int64_t>(1, Chunks(rows, cols)) * cols * static_cast<int64_t>(sizeof(float));
}

bool BiasGradientSupports(const void* dy, DType dtype, int64_t cols, int64_t ld) {
  return dtype != DType::kF32 && cols % 8 == 0 && ld % 8 == 0 && Aligned16({dy});
}

cudaError_t BiasGradient(const void* dy, DType dtype, int64_t rows, int64_t cols, int64_t ld,
                         float* partials, float* out_f32, void* out_low, bool overwrite,
                         cudaStream_t stream) {
  if (rows < 1 || cols < 1 || !BiasGradientSupports(dy, dtype, cols, ld)) {
    return cudaErrorInvalidValue;
  }
  const int64_t chunk_rows = ChunkRows(rows, cols), chunks = Chunks(rows, cols);
  if (chunks > 65535) return cudaErrorInvalidConfiguration;
  return Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 2) {
      const dim3 grid(static_cast<unsigned>(Tiles(cols)), static_cast<unsigned>(chunks));
      bias_gradient_partials_kernel<T><<<grid, kThreads, 0, stream>>>(
          static_cast<const T*>(dy), rows, cols, ld, chunk_rows, partials);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      bias_gradient_finish_kernel<T><<<static_cast<unsigned>((cols + 31) / 32), kThreads, 0,
                                        stream>>>(
          partials, chunks, cols, out_f32, static_cast<T*>(out_low), overwrite);
      return cudaGetLastError();
    }
    return cudaErrorInvalidValue;
  });
}

}  // namespace mptrain::cuda
