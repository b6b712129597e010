#pragma once

// What the CUDA kernel files share (device code only; include from .cu files): the storage
// types of the dtypes and conversions to and from fp32, dtype dispatch, grid sizing and the
// block-wide double sum.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "trainer/backend_types.h"

namespace mptrain::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 65535 * 16) blocks = 65535 * 16;  // Grid-stride loops cover the rest.
  return static_cast<int>(blocks < 1 ? 1 : blocks);
}

template <typename T>
__device__ __forceinline__ float ToFloat(T value);
template <>
__device__ __forceinline__ float ToFloat<__half>(__half value) { return __half2float(value); }
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 value) {
  return __bfloat162float(value);
}
template <>
__device__ __forceinline__ float ToFloat<float>(float value) { return value; }

template <typename T>
__device__ __forceinline__ T FromFloat(float value);
template <>
__device__ __forceinline__ __half FromFloat<__half>(float value) { return __float2half_rn(value); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}
template <>
__device__ __forceinline__ float FromFloat<float>(float value) { return value; }

// Calls f.template operator()<T>() with T the storage type of `dtype`.
template <typename F>
cudaError_t Dispatch(DType dtype, F f) {
  switch (dtype) {
    case DType::kF16: return f(__half{});
    case DType::kBF16: return f(__nv_bfloat16{});
    case DType::kF32: return f(float{});
  }
  return cudaErrorInvalidValue;
}

// Whether every pointer given (null ones aside) allows 16-byte vector loads and stores.
bool Aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

#define GRID_STRIDE(i, n)                                                       \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

__device__ __forceinline__ float Load(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void Store(void* p, DType dtype, int64_t i, float value) {
  switch (dtype) {
    case DType::kF16: static_cast<__half*>(p)[i] = __float2half_rn(value); break;
    case DType::kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(value); break;
    default: static_cast<float*>(p)[i] = value; break;
  }
}

// Block-wide sum of a double; every thread gets the result.
__device__ double BlockSum(double value) {
  __shared__ double shared[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffff, value, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  double total = 0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreads / 32; ++w) total += shared[w];
    shared[0] = total;
  }
  __syncthreads();
  total = shared[0];
  __syncthreads();
  return total;
}

// The dynamic shared memory a block may opt in to on the current device (H100/H200: 227 KiB,
// A100: ~163 KiB, consumer Ampere/Ada: ~99 KiB); 0 where it cannot be read.
size_t MaxDynamicSharedBytesPerBlock() {
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return 0;
  }
  return static_cast<size_t>(optin);
}

}  // namespace
}  // namespace mptrain::cuda
