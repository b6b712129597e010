#pragma once

// For the benchmark tools only (a tool has nothing to recover from a failed call): print the
// failing expression with its error and exit.

#include <cublas_api.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(expr)                                                              \
  do {                                                                                \
    cudaError_t e = (expr);                                                           \
    if (e != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr,               \
                   cudaGetErrorString(e));                                            \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)
#define CHECK_LT(expr)                                                                \
  do {                                                                                \
    cublasStatus_t s = (expr);                                                        \
    if (s != CUBLAS_STATUS_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #expr, int(s)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)
