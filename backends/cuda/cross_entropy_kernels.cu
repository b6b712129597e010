// The fused softmax cross-entropy (cross_entropy_kernels.h): one pass over a row's logits in
// memory for its loss, first maximum and gradient.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/cross_entropy_kernels.h"
#include "backends/cuda/kernel_support.cuh"

#include <algorithm>
#include <climits>

namespace mptrain::cuda {
namespace {

// Block-wide reductions for a block of kBlock threads; every thread gets the result. Fixed
// shapes (shuffle trees, then the warps in order): deterministic.
template <int kBlock, typename V, typename Op>
__device__ V BlockReduce(V value, Op op) {
  __shared__ V shared[kBlock / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    value = op(value, __shfl_down_sync(0xffffffff, value, offset));
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    V result = shared[0];
    for (int w = 1; w < kBlock / 32; ++w) result = op(result, shared[w]);
    shared[0] = result;
  }
  __syncthreads();
  const V result = shared[0];
  __syncthreads();
  return result;
}

// The largest value (fmaxf: NaNs ignored; -inf when every value is NaN).
template <int kBlock>
__device__ float BlockMax(float value) {
  return BlockReduce<kBlock>(value, [](float a, float b) { return fmaxf(a, b); });
}

template <int kBlock>
__device__ int BlockMin(int value) {
  return BlockReduce<kBlock>(value, [](int a, int b) { return min(a, b); });
}

template <int kBlock>
__device__ double BlockSumOf(double value) {
  __shared__ double shared[kBlock / 32];
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffff, value, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kBlock / 32; ++w) total += shared[w];
    shared[0] = total;
  }
  __syncthreads();
  const double total = shared[0];
  __syncthreads();
  return total;
}

// kVec consecutive elements as floats (kVec · sizeof(T) = 16 bytes: one load), and back.
template <int kVec, typename T>
__device__ __forceinline__ void LoadVec(const T* p, float* out) {
  if constexpr (kVec == 1) {
    out[0] = ToFloat<T>(p[0]);
  } else {
    static_assert(kVec * sizeof(T) == 16, "one 16-byte load");
    const uint4 packed = *reinterpret_cast<const uint4*>(p);
    const T* values = reinterpret_cast<const T*>(&packed);
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] = ToFloat<T>(values[j]);
  }
}

template <int kVec, typename D>
__device__ __forceinline__ void StoreVec(D* p, const float* values) {
  if constexpr (kVec * sizeof(D) == 16) {
    uint4 packed;
    D* out = reinterpret_cast<D*>(&packed);
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] = FromFloat<D>(values[j]);
    *reinterpret_cast<uint4*>(p) = packed;
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) p[j] = FromFloat<D>(values[j]);
  }
}

// f(c, value) for every column this thread owns: kVec-wide loads up to the last whole vector,
// then the tail one element at a time.
template <int kBlock, int kVec, typename T, typename F>
__device__ __forceinline__ void ForRow(const T* row, int cols, F f) {
  const int vec_end = (cols / kVec) * kVec;
  for (int c0 = static_cast<int>(threadIdx.x) * kVec; c0 < vec_end; c0 += kBlock * kVec) {
    float v[kVec];
    LoadVec<kVec>(row + c0, v);
#pragma unroll
    for (int j = 0; j < kVec; ++j) f(c0 + j, v[j]);
  }
  for (int c = vec_end + static_cast<int>(threadIdx.x); c < cols; c += kBlock) {
    f(c, ToFloat<T>(row[c]));
  }
}

// The largest row the cross-entropy stages in shared memory (H100/H200: 227 KB per block; a
// bf16 row of up to 100k logits, two blocks per SM).
constexpr size_t kMaxStagedRowBytes = 200 << 10;

// One block per row; three passes over the row (its maximum; Σ exp added in double, with the
// first column holding the maximum; the loss term and gradient), each element's formulas those
// of log_softmax_rows_kernel, smoothed_one_hot, exp_kernel and scaled_difference_kernel
// (loss_kernels.cu), each term's exp in fp32 as there. x's rows are ld_x apart, d_logits' ld_d
// (the first `cols` of a padded row). Blocks of 1024 threads with 16-byte loads and stores
// (kVec) where rows are aligned. kStaged: the first pass copies the row into shared memory (a
// GPT-2 row: 50257 logits, 100 KB in bf16) and the other two read it there, so the logits
// (1.6 GB per micro-batch) are read from memory once; without it (a row too large) they re-read
// it, mostly from L2.
//
// The kernel is bound by its instructions per logit (ncu), so each pass does only what it must:
// the first a fmaxf (the argmax's column is found in the second, from the maximum), and without
// label smoothing (off == 0) the target q is 0 in every column but one, so the third computes
// coef · p · seed (bit for bit coef · (p - 0) · seed) except in the vector holding the target,
// and a loss alone (no gradient) is the target's term alone.
template <int kBlock, int kVec, bool kStaged, typename T, typename D>
__global__ void __launch_bounds__(kBlock, kStaged ? 2 : 1)
    softmax_cross_entropy_kernel(const T* x, int64_t ld_x, const float* ids, int cols, float on,
                                 float off, float coef, const StepState* state,
                                 float seed_divisor, D* d_logits, int64_t ld_d,
                                 double* row_losses, float* metrics) {
  extern __shared__ uint4 staged_row[];
  const int64_t r = blockIdx.x;
  const T* global_row = x + r * ld_x;
  const T* row = kStaged ? reinterpret_cast<const T*>(staged_row) : global_row;
  const float id = ids[r];
  // The target's column as an integer, compared with each column's (an int64 -> float
  // conversion per element cost more than the exp). -1 where no column's float equals id (a
  // non-integral id: no column is the target, as the float comparison found).
  const int target = (id >= 0.0f && id < static_cast<float>(cols) && id == floorf(id))
                         ? static_cast<int>(id)
                         : -1;
  // fmaxf over the row, as log_softmax_rows_kernel (NaNs ignored; all NaN: -inf, and the loss
  // is NaN).
  float local_max = -INFINITY;
  if constexpr (kStaged) {
    static_assert(kVec * sizeof(T) == 16, "the staged row is copied in 16-byte words");
    T* cache = reinterpret_cast<T*>(staged_row);
    const int vecs = cols / kVec, vec_end = vecs * kVec;
    // kBatch 16-byte loads in flight per thread before the first is used (a row is ~100 KB:
    // one load at a time left the kernel waiting on memory latency), then each is staged and
    // scanned. Thread t owns the vectors t, t + kBlock, ... as in the passes below.
    constexpr int kBatch = 8;
    for (int first = threadIdx.x; first < vecs; first += kBlock * kBatch) {
      uint4 packed[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int v = first + i * kBlock;
        if (v < vecs) packed[i] = *reinterpret_cast<const uint4*>(global_row + int64_t{v} * kVec);
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int v = first + i * kBlock;
        if (v < vecs) {
          *reinterpret_cast<uint4*>(cache + v * kVec) = packed[i];
          const T* values = reinterpret_cast<const T*>(&packed[i]);
#pragma unroll
          for (int j = 0; j < kVec; ++j) local_max = fmaxf(local_max, ToFloat<T>(values[j]));
        }
      }
    }
    for (int c = vec_end + static_cast<int>(threadIdx.x); c < cols; c += kBlock) {
      cache[c] = global_row[c];
      local_max = fmaxf(local_max, ToFloat<T>(cache[c]));
    }
    // BlockMax's barrier: row[0] (the NaN check below) and every staged word are in place.
  } else {
    ForRow<kBlock, kVec>(row, cols, [&](int, float v) { local_max = fmaxf(local_max, v); });
  }
  const float max = BlockMax<kBlock>(local_max);
  // The argmax as CountArgmaxMatches finds it: its scan starts at column 0 and takes a later
  // value only when it is greater, so it ends on the first column holding the maximum (NaNs
  // never win; none when every value is NaN: `cols`, no target's), or on column 0 when that is
  // a NaN (never displaced). Each thread's columns come in increasing order.
  double local_sum = 0;
  int first_max = cols;
  ForRow<kBlock, kVec>(row, cols, [&](int c, float v) {
    local_sum += static_cast<double>(expf(v - max));
    if (v == max) first_max = min(first_max, c);
  });
  const float log_sum = static_cast<float>(log(BlockSumOf<kBlock>(local_sum)));
  const int argmax = isnan(ToFloat<T>(row[0])) ? 0 : BlockMin<kBlock>(first_max);
  const float seed = d_logits != nullptr ? state->scale / seed_divisor : 0.0f;
  double local_loss = 0;
  auto term = [&](int c, float v) {
    const float log_p = v - max - log_sum;
    const float q = (c == target ? on : 0.0f) + off;
    if (q != 0.0f) local_loss += static_cast<double>(q) * log_p;
    return coef * (expf(log_p) - q) * seed;
  };
  // A column whose q is 0 (any but the target's, without smoothing): term's gradient without
  // the loss (0 · log_p is not added) or the subtraction (p - 0 is p).
  auto untargeted_term = [&](float v) {
    const float log_p = v - max - log_sum;
    return coef * expf(log_p) * seed;
  };
  const bool smoothed = off != 0.0f;
  if (d_logits == nullptr) {
    if (smoothed) {
      ForRow<kBlock, kVec>(row, cols, [&](int c, float v) { term(c, v); });
    } else if (threadIdx.x == 0 && target >= 0) {
      term(target, ToFloat<T>(row[target]));
    }
  } else {
    D* out = d_logits + r * ld_d;
    const int vec_end = (cols / kVec) * kVec;
    for (int c0 = static_cast<int>(threadIdx.x) * kVec; c0 < vec_end; c0 += kBlock * kVec) {
      float v[kVec];
      LoadVec<kVec>(row + c0, v);
      if (smoothed || static_cast<unsigned>(target - c0) < static_cast<unsigned>(kVec)) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = term(c0 + j, v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = untargeted_term(v[j]);
      }
      StoreVec<kVec>(out + c0, v);
    }
    for (int c = vec_end + static_cast<int>(threadIdx.x); c < cols; c += kBlock) {
      out[c] = FromFloat<D>(term(c, ToFloat<T>(row[c])));
    }
  }
  const double loss = BlockSumOf<kBlock>(local_loss);
  if (threadIdx.x == 0) {
    row_losses[r] = loss;
    if (argmax == target) atomicAdd(metrics + 1, 1.0f);
  }
}

// The rows' losses summed by one block in a fixed order (thread t adds rows t, t + kThreads, ...,
// then BlockSum's fixed tree: deterministic), then into metrics[0].
__global__ void row_losses_finalize_kernel(const double* row_losses, int64_t rows,
                                           double divide_by, float then_divide, float* metrics) {
  double sum = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) sum += row_losses[r];
  sum = BlockSum(sum);
  if (threadIdx.x == 0) metrics[0] += static_cast<float>(sum / divide_by) / then_divide;
}


// The largest row staged in shared memory on this device: kMaxStagedRowBytes, or less where
// a block may not opt in to that much (about 163 KiB on an A100; 227 KiB on Hopper).
size_t StagedRowBytesLimit() {
  // Unknown (0): the unstaged kernels, which need no dynamic shared memory.
  return std::min(kMaxStagedRowBytes, MaxDynamicSharedBytesPerBlock() / 16 * 16);
}

}  // namespace

cudaError_t SoftmaxCrossEntropy(const void* x, DType x_dtype, int64_t ld_x, const float* ids,
                                int64_t rows, int64_t cols, float on, float off, double divide_by,
                                float then_divide, float* metrics, float coef,
                                const StepState* state, float seed_divisor, void* d_logits,
                                DType d_dtype, int64_t ld_d, double* row_losses,
                                cudaStream_t stream) {
  if (cols > INT_MAX / 2) return cudaErrorInvalidValue;  // Columns are indexed with int.
  cudaError_t launched = Dispatch(x_dtype, [&](auto x_tag) {
    using T = decltype(x_tag);
    return Dispatch(d_dtype, [&](auto d_tag) {
      using D = decltype(d_tag);
      constexpr int kBlock = 1024, kVec = 16 / sizeof(T);
      // 16-byte accesses need aligned rows (the padded vocabulary's: 50304 · 2 bytes apart).
      const bool vectorized =
          Aligned16({x, d_logits}) && (ld_x * sizeof(T)) % 16 == 0 &&
          (d_logits == nullptr || (ld_d * sizeof(D)) % 16 == 0);
      const unsigned blocks = static_cast<unsigned>(rows);
      // A row in shared memory where it fits (rounded up to whole 16-byte words).
      const size_t row_bytes = (static_cast<size_t>(cols) * sizeof(T) + 15) / 16 * 16;
      if (vectorized && row_bytes <= StagedRowBytesLimit()) {
        // Blocks of 512 (at most 64 registers a thread): two rows per SM where two fit in its
        // shared memory, so that one block's loads overlap the other's reductions.
        constexpr int kStagedBlock = 512;
        auto kernel = softmax_cross_entropy_kernel<kStagedBlock, kVec, true, T, D>;
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(StagedRowBytesLimit()));
        if (e != cudaSuccess) return e;
        kernel<<<blocks, kStagedBlock, row_bytes, stream>>>(
            static_cast<const T*>(x), ld_x, ids, cols, on, off, coef, state, seed_divisor,
            static_cast<D*>(d_logits), ld_d, row_losses, metrics);
      } else if (vectorized) {
        softmax_cross_entropy_kernel<kBlock, kVec, false, T, D><<<blocks, kBlock, 0, stream>>>(
            static_cast<const T*>(x), ld_x, ids, cols, on, off, coef, state, seed_divisor,
            static_cast<D*>(d_logits), ld_d, row_losses, metrics);
      } else {
        softmax_cross_entropy_kernel<kBlock, 1, false, T, D><<<blocks, kBlock, 0, stream>>>(
            static_cast<const T*>(x), ld_x, ids, cols, on, off, coef, state, seed_divisor,
            static_cast<D*>(d_logits), ld_d, row_losses, metrics);
      }
      return cudaGetLastError();
    });
  });
  if (launched != cudaSuccess) return launched;
  row_losses_finalize_kernel<<<1, kThreads, 0, stream>>>(row_losses, rows, divide_by,
                                                         then_divide, metrics);
  return cudaGetLastError();
}

}  // namespace mptrain::cuda
