#pragma once

// MPTRAIN_HD marks functions compiled for both the host (CPU backend, tests) and the GPU (CUDA
// kernels), so that numerics such as the scaler update are written once.
#if defined(__CUDACC__)
#define MPTRAIN_HD __host__ __device__
#else
#define MPTRAIN_HD
#endif
