// Parameters' initial values drawn where they live (init_kernels.h): each value a function of
// the seed and its index alone (trainer/normal_draws.h), so the kernel's split of the work
// changes nothing.

#include "backends/cuda/init_kernels.h"
#include "trainer/normal_draws.h"

#include <algorithm>

namespace mptrain::cuda {
namespace {

// A thread per pair of draws (one Philox call, one log for both): global pairs
// first_index / 2 .. (first_index + n - 1) / 2, each writing the values of its pair that fall
// inside out[0, n).
__global__ void fill_normal_kernel(float* out, int64_t n, uint64_t seed, int64_t first_index,
                                   double std) {
  const int64_t first_pair = first_index >> 1;
  const int64_t pairs = ((first_index + n - 1) >> 1) - first_pair + 1;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += stride) {
    const int64_t pair = first_pair + p;
    const NormalPair draws = StandardNormalPair(seed, static_cast<uint64_t>(pair));
    const int64_t even = 2 * pair - first_index;  // out's index of the pair's even draw
    if (even >= 0) out[even] = static_cast<float>(std * draws.even);
    if (even + 1 < n) out[even + 1] = static_cast<float>(std * draws.odd);
  }
}

}  // namespace

cudaError_t FillNormal(float* out, int64_t n, uint64_t seed, int64_t first_index, double std,
                       cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  // Enough blocks to fill any GPU several times over; the grid-stride loop covers the rest.
  const int64_t pairs = n / 2 + 1;
  const int64_t blocks = std::min<int64_t>((pairs + kThreads - 1) / kThreads, 8192);
  fill_normal_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(out, n, seed,
                                                                              first_index, std);
  return cudaGetLastError();
}

}  // namespace mptrain::cuda
