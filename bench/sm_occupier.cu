#include "bench/sm_occupier.h"

namespace mptrain::bench {
namespace {

constexpr int kThreads = 512;

__global__ void occupier_kernel(const float4* src, float4* dst, int64_t per_block, int repeats) {
  const float4* from = src + blockIdx.x * per_block;
  float4* to = dst + blockIdx.x * per_block;
  for (int r = 0; r < repeats; ++r) {
    for (int64_t i = threadIdx.x; i < per_block; i += kThreads) to[i] = from[i];
  }
}

}  // namespace

cudaError_t LaunchOccupier(const float* src, float* dst, int64_t elements, int ctas, int repeats,
                           cudaStream_t stream) {
  const int64_t per_block = elements / 4 / ctas;
  occupier_kernel<<<ctas, kThreads, 0, stream>>>(reinterpret_cast<const float4*>(src),
                                                 reinterpret_cast<float4*>(dst), per_block,
                                                 repeats);
  return cudaGetLastError();
}

}  // namespace mptrain::bench
