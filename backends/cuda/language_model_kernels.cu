// The language model's kernels (language_model_kernels.h). Formulas are the CPU reference's
// (backends/cpu/cpu_backend.cc), element for element where the order of a sum allows.

#include <cub/cub.cuh>

#include "backends/cuda/kernel_support.cuh"
#include "backends/cuda/language_model_kernels.h"

namespace mptrain::cuda {
namespace {

__global__ void add_mixed_kernel(const void* a, DType ad, const void* b, DType bd, void* out,
                                 DType od, int64_t n) {
  GRID_STRIDE(i, n) { Store(out, od, i, Load(a, ad, i) + Load(b, bd, i)); }
}

// f32 + f32 -> dtype T, four elements per thread (the residual stream's common case).
template <typename T>
__global__ void add_f32_vec4_kernel(const float4* a, const float4* b, T* out, int64_t n4) {
  GRID_STRIDE(i, n4) {
    const float4 x = a[i], y = b[i];
    out[4 * i] = FromFloat<T>(x.x + y.x);
    out[4 * i + 1] = FromFloat<T>(x.y + y.y);
    out[4 * i + 2] = FromFloat<T>(x.z + y.z);
    out[4 * i + 3] = FromFloat<T>(x.w + y.w);
  }
}

__device__ __forceinline__ bool ValidId(float id, int64_t vocab_rows) {
  return id >= 0.0f && id < static_cast<float>(vocab_rows) && id == floorf(id);
}

__global__ void embedding_forward_kernel(const float* ids, const float* wte, int64_t vocab_rows,
                                         const float* wpe, int64_t seq_len, int64_t rows,
                                         int64_t cols, float* out) {
  GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    const float id = ids[r];
    out[i] = ValidId(id, vocab_rows)
                 ? wte[static_cast<int64_t>(id) * cols + c] + wpe[(r % seq_len) * cols + c]
                 : __int_as_float(0x7fc00000);
  }
}

// Sort keys: the id, or vocab_rows for an invalid one (sorted last, then dropped).
__global__ void embedding_keys_kernel(const float* ids, int64_t rows, int64_t vocab_rows,
                                      int* keys, int* row_numbers) {
  GRID_STRIDE(r, rows) {
    const float id = ids[r];
    keys[r] = ValidId(id, vocab_rows) ? static_cast<int>(id) : static_cast<int>(vocab_rows);
    row_numbers[r] = static_cast<int>(r);
  }
}

// One block per run of equal sorted keys (a block whose key repeats its predecessor's exits):
// dwte[key, c] gets the run's rows added one after another in row order (the sort is stable),
// as the CPU reference's `token[c] += g[c]` does.
__global__ void embedding_scatter_kernel(const int* keys, const int* row_numbers, int64_t rows,
                                         const float* dout, int64_t cols, int64_t vocab_rows,
                                         float* dwte) {
  const int64_t first = blockIdx.x;
  const int key = keys[first];
  if (key >= vocab_rows || (first > 0 && keys[first - 1] == key)) return;
  int64_t end = first + 1;
  while (end < rows && keys[end] == key) ++end;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float acc = dwte[static_cast<int64_t>(key) * cols + c];
    for (int64_t j = first; j < end; ++j) acc += dout[static_cast<int64_t>(row_numbers[j]) * cols + c];
    dwte[static_cast<int64_t>(key) * cols + c] = acc;
  }
}

__global__ void position_gradient_kernel(const float* dout, int64_t seq_len, int64_t rows,
                                         int64_t cols, bool overwrite, float* dwpe) {
  GRID_STRIDE(i, seq_len * cols) {
    const int64_t t = i / cols, c = i % cols;
    float sum = 0.0f;
    for (int64_t r = t; r < rows; r += seq_len) sum += dout[r * cols + c];
    dwpe[i] = overwrite ? sum : dwpe[i] + sum;
  }
}

// ---- fp32 attention (probabilities kept) ----

struct AttentionDims {
  int64_t T, H, hs, C;
  // Rows of qkv / y for query or key t of sequence b.
  __device__ int64_t QkvRow(int64_t b, int64_t t) const { return (b * T + t) * 3 * C; }
  __device__ int64_t YRow(int64_t b, int64_t t) const { return (b * T + t) * C; }
};

__device__ float BlockMax(float value) {
  __shared__ float shared[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_down_sync(0xffffffff, value, offset));
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = shared[0];
    for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, shared[w]);
    shared[0] = m;
  }
  __syncthreads();
  const float result = shared[0];
  __syncthreads();
  return result;
}

// One block per (b, h, t): scores of keys 0..t in shared memory, softmax, y_t = Σ p · v.
__global__ void attention_forward_f32_kernel(const float* qkv, AttentionDims d, float* probs,
                                             float* y) {
  extern __shared__ float scores[];
  const int64_t row = blockIdx.x;  // (b·H + h)·T + t
  const int64_t t = row % d.T, h = (row / d.T) % d.H, b = row / (d.T * d.H);
  const float scale = 1.0f / sqrtf(static_cast<float>(d.hs));
  const float* q = qkv + d.QkvRow(b, t) + h * d.hs;
  float local_max = -INFINITY;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
    const float* k = qkv + d.QkvRow(b, s) + d.C + h * d.hs;
    float dot = 0.0f;
    for (int64_t e = 0; e < d.hs; ++e) dot += q[e] * k[e];
    scores[s] = dot * scale;
    local_max = fmaxf(local_max, scores[s]);
  }
  const float max = BlockMax(local_max);
  double local_sum = 0;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
    scores[s] = expf(scores[s] - max);
    local_sum += scores[s];
  }
  const float inverse = 1.0f / static_cast<float>(BlockSum(local_sum));
  float* p = probs + row * d.T;
  for (int64_t s = threadIdx.x; s < d.T; s += blockDim.x) {
    const float value = s <= t ? scores[s] * inverse : 0.0f;
    p[s] = value;
    if (s <= t) scores[s] = value;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < d.hs; e += blockDim.x) {
    float acc = 0.0f;
    for (int64_t s = 0; s <= t; ++s) acc += scores[s] * qkv[d.QkvRow(b, s) + 2 * d.C + h * d.hs + e];
    y[d.YRow(b, t) + h * d.hs + e] = acc;
  }
}

// dv_j = Σ_{t >= j} p[t, j] · dy_t (one block per (b, h, j)), before p is overwritten.
__global__ void attention_dv_f32_kernel(const float* probs, const float* dy, AttentionDims d,
                                        float* dqkv) {
  const int64_t row = blockIdx.x;
  const int64_t j = row % d.T, h = (row / d.T) % d.H, b = row / (d.T * d.H);
  const float* p = probs + (b * d.H + h) * d.T * d.T;
  for (int64_t e = threadIdx.x; e < d.hs; e += blockDim.x) {
    float acc = 0.0f;
    for (int64_t t = j; t < d.T; ++t) acc += p[t * d.T + j] * dy[d.YRow(b, t) + h * d.hs + e];
    dqkv[d.QkvRow(b, j) + 2 * d.C + h * d.hs + e] = acc;
  }
}

// One block per (b, h, t): da_s = dy_t · v_s, ds_s = p_s (da_s − Σ p · da) · scale written over
// p, and dq_t = Σ_s ds_s · k_s.
__global__ void attention_ds_dq_f32_kernel(const float* qkv, float* probs, const float* dy,
                                           AttentionDims d, float* dqkv) {
  extern __shared__ float ds[];
  const int64_t row = blockIdx.x;
  const int64_t t = row % d.T, h = (row / d.T) % d.H, b = row / (d.T * d.H);
  const float scale = 1.0f / sqrtf(static_cast<float>(d.hs));
  const float* g = dy + d.YRow(b, t) + h * d.hs;
  float* p = probs + row * d.T;
  double local = 0;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
    const float* v = qkv + d.QkvRow(b, s) + 2 * d.C + h * d.hs;
    float dot = 0.0f;
    for (int64_t e = 0; e < d.hs; ++e) dot += g[e] * v[e];
    ds[s] = dot;
    local += static_cast<double>(dot) * p[s];
  }
  const float weighted = static_cast<float>(BlockSum(local));
  for (int64_t s = threadIdx.x; s < d.T; s += blockDim.x) {
    const float value = s <= t ? p[s] * (ds[s] - weighted) * scale : 0.0f;
    if (s <= t) ds[s] = value;
    p[s] = value;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < d.hs; e += blockDim.x) {
    float acc = 0.0f;
    for (int64_t s = 0; s <= t; ++s) acc += ds[s] * qkv[d.QkvRow(b, s) + d.C + h * d.hs + e];
    dqkv[d.QkvRow(b, t) + h * d.hs + e] = acc;
  }
}

// dk_j = Σ_{t >= j} ds[t, j] · q_t (one block per (b, h, j)).
__global__ void attention_dk_f32_kernel(const float* qkv, const float* ds, AttentionDims d,
                                        float* dqkv) {
  const int64_t row = blockIdx.x;
  const int64_t j = row % d.T, h = (row / d.T) % d.H, b = row / (d.T * d.H);
  const float* s = ds + (b * d.H + h) * d.T * d.T;
  for (int64_t e = threadIdx.x; e < d.hs; e += blockDim.x) {
    float acc = 0.0f;
    for (int64_t t = j; t < d.T; ++t) acc += s[t * d.T + j] * qkv[d.QkvRow(b, t) + h * d.hs + e];
    dqkv[d.QkvRow(b, j) + d.C + h * d.hs + e] = acc;
  }
}

}  // namespace

cudaError_t AddMixed(const void* a, DType a_dtype, const void* b, DType b_dtype, void* out,
                     DType out_dtype, int64_t n, cudaStream_t stream) {
  if (a_dtype == DType::kF32 && b_dtype == DType::kF32 && n % 4 == 0 && Aligned16({a, b, out})) {
    return Dispatch(out_dtype, [&](auto tag) {
      using T = decltype(tag);
      add_f32_vec4_kernel<T><<<Blocks(n / 4), kThreads, 0, stream>>>(
          static_cast<const float4*>(a), static_cast<const float4*>(b), static_cast<T*>(out),
          n / 4);
      return cudaGetLastError();
    });
  }
  add_mixed_kernel<<<Blocks(n), kThreads, 0, stream>>>(a, a_dtype, b, b_dtype, out, out_dtype,
                                                       n);
  return cudaGetLastError();
}

cudaError_t EmbeddingForward(const float* ids, const float* wte, int64_t vocab_rows,
                             const float* wpe, int64_t seq_len, int64_t rows, int64_t cols,
                             float* out, cudaStream_t stream) {
  embedding_forward_kernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(
      ids, wte, vocab_rows, wpe, seq_len, rows, cols, out);
  return cudaGetLastError();
}

cudaError_t EmbeddingSortTempBytes(int64_t rows, size_t* bytes) {
  return cub::DeviceRadixSort::SortPairs(nullptr, *bytes, static_cast<const int*>(nullptr),
                                         static_cast<int*>(nullptr),
                                         static_cast<const int*>(nullptr),
                                         static_cast<int*>(nullptr), static_cast<int>(rows));
}

cudaError_t EmbeddingBackward(const float* ids, const float* dout, int64_t seq_len, int64_t rows,
                              int64_t cols, float* dwte, int64_t vocab_rows, float* dwpe,
                              bool overwrite_wte, bool overwrite_wpe,
                              const EmbeddingSortScratch& scratch, cudaStream_t stream) {
  if (overwrite_wte) {
    if (cudaError_t e = cudaMemsetAsync(dwte, 0, vocab_rows * cols * 4, stream); e != cudaSuccess)
      return e;
  }
  embedding_keys_kernel<<<Blocks(rows), kThreads, 0, stream>>>(ids, rows, vocab_rows,
                                                               scratch.keys_in, scratch.rows_in);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  size_t temp_bytes = scratch.sort_temp_bytes;
  // Keys below 2^(bits): sorting only those bits is the same order, fewer passes.
  int end_bit = 1;
  while ((int64_t{1} << end_bit) <= vocab_rows && end_bit < 31) ++end_bit;
  if (cudaError_t e = cub::DeviceRadixSort::SortPairs(
          scratch.sort_temp, temp_bytes, scratch.keys_in, scratch.keys_out, scratch.rows_in,
          scratch.rows_out, static_cast<int>(rows), 0, end_bit, stream);
      e != cudaSuccess) {
    return e;
  }
  embedding_scatter_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      scratch.keys_out, scratch.rows_out, rows, dout, cols, vocab_rows, dwte);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  position_gradient_kernel<<<Blocks(seq_len * cols), kThreads, 0, stream>>>(
      dout, seq_len, rows, cols, overwrite_wpe, dwpe);
  return cudaGetLastError();
}

cudaError_t CausalAttentionForwardF32(const float* qkv, int64_t batch, int64_t seq_len,
                                      int64_t heads, int64_t head_size, float* probs, float* y,
                                      cudaStream_t stream) {
  const AttentionDims d{seq_len, heads, head_size, heads * head_size};
  attention_forward_f32_kernel<<<static_cast<unsigned>(batch * heads * seq_len), kThreads,
                                 seq_len * sizeof(float), stream>>>(qkv, d, probs, y);
  return cudaGetLastError();
}

cudaError_t CausalAttentionBackwardF32(const float* qkv, float* probs, const float* dy,
                                       int64_t batch, int64_t seq_len, int64_t heads,
                                       int64_t head_size, float* dqkv, cudaStream_t stream) {
  const AttentionDims d{seq_len, heads, head_size, heads * head_size};
  const unsigned blocks = static_cast<unsigned>(batch * heads * seq_len);
  attention_dv_f32_kernel<<<blocks, kThreads, 0, stream>>>(probs, dy, d, dqkv);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  attention_ds_dq_f32_kernel<<<blocks, kThreads, seq_len * sizeof(float), stream>>>(qkv, probs,
                                                                                   dy, d, dqkv);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  attention_dk_f32_kernel<<<blocks, kThreads, 0, stream>>>(qkv, probs, d, dqkv);
  return cudaGetLastError();
}

}  // namespace mptrain::cuda
