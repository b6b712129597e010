#pragma once

// Host launcher of the kernel that draws parameters' initial values on the device
// (init_kernels.cu).

#include <cuda_runtime.h>

#include <cstdint>

namespace mptrain::cuda {

// out[i] = NormalParameterValue(seed, first_index + i, std) for i in [0, n)
// (trainer/normal_draws.h): the values the host's FillNormalOnHost writes.
cudaError_t FillNormal(float* out, int64_t n, uint64_t seed, int64_t first_index, double std,
                       cudaStream_t stream);

}  // namespace mptrain::cuda
