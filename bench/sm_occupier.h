#pragma once

// A stand-in for a collective's kernel on one GPU (bench/gemm_contention.cc): `ctas` blocks
// that stay resident while they copy, as NCCL's channels do during an allreduce, so that their
// effect on a concurrent GEMM can be measured without a second GPU.

#include <cuda_runtime.h>

#include <cstdint>

namespace mptrain::bench {

// Each of `ctas` blocks copies its share of `elements` floats from src to dst `repeats` times.
cudaError_t LaunchOccupier(const float* src, float* dst, int64_t elements, int ctas, int repeats,
                           cudaStream_t stream);

}  // namespace mptrain::bench
