// Parameters' initial values drawn where they live (init_kernels.h): each value a function of
// the seed and its index alone (trainer/normal_draws.h), so the kernel's split of the work
// changes nothing.

#include "backends/cuda/init_kernels.h"
#include "trainer/normal_draws.h"

#include <algorithm>

namespace mptrain::cuda {
namespace {

__global__ void fill_normal_kernel(float* out, int64_t n, uint64_t seed, int64_t first_index,
                                   double std) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = NormalParameterValue(seed, static_cast<uint64_t>(first_index + i), std);
  }
}

}  // namespace

cudaError_t FillNormal(float* out, int64_t n, uint64_t seed, int64_t first_index, double std,
                       cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  // Enough blocks to fill any GPU several times over; the grid-stride loop covers the rest.
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 8192);
  fill_normal_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(out, n, seed,
                                                                              first_index, std);
  return cudaGetLastError();
}

}  // namespace mptrain::cuda
