// The CUDA backend's optimizer-step kernels, in step_math.h's three phases: the gradients'
// inf/NaN check and norm (GradScaler's unscale), the scaler's update on one thread, and the
// optimizer update (update_math.h) with the low-precision copy of the parameters.

#include "backends/cuda/step_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda/kernel_support.cuh"
#include "trainer/optim/update_math.h"
#include "trainer/step_math.h"

namespace mptrain::cuda {
namespace {

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

}  // namespace

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

}  // namespace mptrain::cuda
