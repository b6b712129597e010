// The CUDA backend's kernels. Each kernel `foo_kernel` has a host launcher `Foo(...)` that picks
// the grid with a ceil-div and returns the launch error. Numerics come from the shared headers
// (activation_math.h, step_math.h) so the CPU and CUDA backends compute the same function.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <initializer_list>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernel_support.cuh"
#include "trainer/activation_math.h"
#include "trainer/norm_math.h"

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

// One gradient's part in phase 1: its inf/NaN flag, its unscaled square added in double.
__device__ __forceinline__ void AddUnscaled(float g, float inv_scale, double* local, int* found) {
  if (!isfinite(g)) *found = 1;
  const float u = g * inv_scale;
  *local += static_cast<double>(u) * u;
}

// Phase 1: inf/NaN flag and squared norm of the unscaled gradients, per block. Read-only: phase
// 3 recomputes the same products, which saves a write and a read of every gradient.
__global__ void unscale_check_kernel(const float* grads, int64_t n, const StepState* state,
                                     double* partials, int* inf_flags) {
  const float inv_scale = InverseScale(state->scale);
  double local = 0;
  int found = 0;
  GRID_STRIDE(i, n) AddUnscaled(grads[i], inv_scale, &local, &found);
  const double block_sum = BlockSum(local);
  const int any = __syncthreads_or(found);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = block_sum;
    inf_flags[blockIdx.x] = any;
  }
}

// As unscale_check_kernel, sixteen gradients per thread and iteration (four float4 loads in
// flight); the same per-element arithmetic, a fixed order of the double additions (another than
// the scalar kernel's: the norm may differ from its in the last bits of the double sum).
__global__ void unscale_check_vec4_kernel(const float* grads, int64_t n4, const StepState* state,
                                          double* partials, int* inf_flags) {
  const float inv_scale = InverseScale(state->scale);
  double local = 0;
  int found = 0;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += 4 * stride) {
    float4 values[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (i + k * stride < n4) values[k] = reinterpret_cast<const float4*>(grads)[i + k * stride];
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (i + k * stride >= n4) break;
      AddUnscaled(values[k].x, inv_scale, &local, &found);
      AddUnscaled(values[k].y, inv_scale, &local, &found);
      AddUnscaled(values[k].z, inv_scale, &local, &found);
      AddUnscaled(values[k].w, inv_scale, &local, &found);
    }
  }
  const double block_sum = BlockSum(local);
  const int any = __syncthreads_or(found);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = block_sum;
    inf_flags[blockIdx.x] = any;
  }
}

// One thread combines the partials in order.
__global__ void gradient_statistics_finalize_kernel(const double* partials, const int* inf_flags,
                                                    int blocks, StepState* state) {
  double sum = 0;
  int found = 0;
  for (int i = 0; i < blocks; ++i) {
    sum += partials[i];
    found |= inf_flags[i];
  }
  state->sum_squares = sum;
  state->found_inf = found;
}

// Phase 2: the scaler state on one thread.
__global__ void finalize_step_kernel(StepConfig config, const float* metrics, StepState* state) {
  FinalizeStep(config, metrics[0], state);
  state->last_correct = metrics[1];
}

// The step's update coefficients, computed once per block by thread 0 and shared (ApplyUpdate
// reads the learning rate only through them). A replayed step's learning rate is set on the
// device before each replay.
__device__ __forceinline__ UpdateCoefficients BlockUpdateCoefficients(UpdateRule rule,
                                                                      const StepState* state,
                                                                      const double* lr_on_device) {
  __shared__ UpdateCoefficients shared;
  if (threadIdx.x == 0) {
    if (lr_on_device != nullptr) rule.lr = *lr_on_device;
    shared = PrepareUpdate(rule, *state);
  }
  __syncthreads();
  return shared;
}

// Phase 3: the optimizer's update on the unscaled, clipped gradients (inv_scale of the scale the
// step used) unless skipped, and the low-precision copy of each updated parameter. The step's
// scalars are computed once per block.
template <typename T>
__global__ void update_parameters_kernel(UpdateRule rule, float* params, const float* grads,
                                         float* slot_a, float* slot_b, T* params_low, int64_t n,
                                         const StepState* state, const double* lr_on_device) {
  if (state->skipped != 0) return;
  const UpdateCoefficients coefficients = BlockUpdateCoefficients(rule, state, lr_on_device);
  const float clip_coef = state->clip_coef;
  const float inv_scale = InverseScale(state->last_scale);
  GRID_STRIDE(i, n) {
    float p = params[i];
    float a = slot_a != nullptr ? slot_a[i] : 0.0f;
    float b = slot_b != nullptr ? slot_b[i] : 0.0f;
    ApplyUpdate(rule, coefficients, grads[i] * inv_scale * clip_coef, &p, &a, &b);
    params[i] = p;
    if (slot_a != nullptr) slot_a[i] = a;
    if (slot_b != nullptr) slot_b[i] = b;
    if (params_low != nullptr) params_low[i] = FromFloat<T>(p);
  }
}

// As update_parameters_kernel, four parameters per thread (float4 loads and stores of the fp32
// state, one 4-element store of the low-precision copy); the same arithmetic per parameter.
template <typename T>
__global__ void update_parameters_vec4_kernel(UpdateRule rule, float* params, const float* grads,
                                              float* slot_a, float* slot_b, T* params_low,
                                              int64_t n4, const StepState* state,
                                              const double* lr_on_device) {
  if (state->skipped != 0) return;
  const UpdateCoefficients coefficients = BlockUpdateCoefficients(rule, state, lr_on_device);
  const float scale = InverseScale(state->last_scale);
  const float clip_coef = state->clip_coef;
  GRID_STRIDE(i, n4) {
    float4 p = reinterpret_cast<float4*>(params)[i];
    const float4 g = reinterpret_cast<const float4*>(grads)[i];
    float4 a = slot_a != nullptr ? reinterpret_cast<float4*>(slot_a)[i] : make_float4(0, 0, 0, 0);
    float4 b = slot_b != nullptr ? reinterpret_cast<float4*>(slot_b)[i] : make_float4(0, 0, 0, 0);
    ApplyUpdate(rule, coefficients, g.x * scale * clip_coef, &p.x, &a.x, &b.x);
    ApplyUpdate(rule, coefficients, g.y * scale * clip_coef, &p.y, &a.y, &b.y);
    ApplyUpdate(rule, coefficients, g.z * scale * clip_coef, &p.z, &a.z, &b.z);
    ApplyUpdate(rule, coefficients, g.w * scale * clip_coef, &p.w, &a.w, &b.w);
    reinterpret_cast<float4*>(params)[i] = p;
    if (slot_a != nullptr) reinterpret_cast<float4*>(slot_a)[i] = a;
    if (slot_b != nullptr) reinterpret_cast<float4*>(slot_b)[i] = b;
    if (params_low != nullptr) {
      if constexpr (sizeof(T) == 2) {
        T low[4] = {FromFloat<T>(p.x), FromFloat<T>(p.y), FromFloat<T>(p.z), FromFloat<T>(p.w)};
        reinterpret_cast<uint2*>(params_low)[i] = *reinterpret_cast<const uint2*>(low);
      } else {
        reinterpret_cast<float4*>(params_low)[i] = p;
      }
    }
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

cudaError_t GradientStatistics(const float* grads, int64_t n, StepState* state, double* partials,
                               int* inf_flags, cudaStream_t stream) {
  if (Aligned16({grads}) && n % 4 == 0) {
    unscale_check_vec4_kernel<<<kReductionBlocks, kThreads, 0, stream>>>(grads, n / 4, state,
                                                                         partials, inf_flags);
  } else {
    unscale_check_kernel<<<kReductionBlocks, kThreads, 0, stream>>>(grads, n, state, partials,
                                                                    inf_flags);
  }
  if (cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  gradient_statistics_finalize_kernel<<<1, 1, 0, stream>>>(partials, inf_flags, kReductionBlocks,
                                                           state);
  return cudaGetLastError();
}

cudaError_t FinalizeStep(const StepConfig& config, const float* metrics, StepState* state,
                         cudaStream_t stream) {
  finalize_step_kernel<<<1, 1, 0, stream>>>(config, metrics, state);
  return cudaGetLastError();
}

cudaError_t UpdateParameters(const UpdateRule& rule, float* params, const float* grads,
                             float* slot_a, float* slot_b, int64_t n, const StepState* state,
                             void* params_low, DType low_dtype, const double* lr_on_device,
                             cudaStream_t stream) {
  const bool vectorized = Aligned16({params, grads, slot_a, slot_b}) && n % 4 == 0 &&
                          reinterpret_cast<uintptr_t>(params_low) % 8 == 0;
  return Dispatch(params_low == nullptr ? DType::kF32 : low_dtype, [&](auto tag) {
    using T = decltype(tag);
    if (vectorized && (sizeof(T) == 2 || reinterpret_cast<uintptr_t>(params_low) % 16 == 0)) {
      update_parameters_vec4_kernel<T><<<Blocks(n / 4), kThreads, 0, stream>>>(
          rule, params, grads, slot_a, slot_b, static_cast<T*>(params_low), n / 4, state,
          lr_on_device);
      return cudaGetLastError();
    }
    update_parameters_kernel<T><<<Blocks(n), kThreads, 0, stream>>>(
        rule, params, grads, slot_a, slot_b, static_cast<T*>(params_low), n, state,
        lr_on_device);
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

}  // namespace mptrain::cuda

// ---- Normalization layers ----

namespace mptrain::cuda {
namespace {

// Loads and stores by a dtype known at run time (the norms mix f32 with the compute dtype).
// BlockSum (above): every thread's value summed over the block, returned to all threads.

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
