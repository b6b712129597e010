#pragma once

// CUDA, cuBLAS and NCCL failures become absl::Status values carrying file:line, so that they
// travel up to the coordinator as the job's error instead of aborting the process.

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mptrain::cuda {

inline absl::Status CudaStatus(cudaError_t error, const char* expr, const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", expr, ": ",
                                          cudaGetErrorName(error), " (",
                                          cudaGetErrorString(error), ")"));
}

inline absl::Status CublasStatus(cublasStatus_t status, const char* expr, const char* file,
                                 int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", expr, ": ",
                                          cublasGetStatusName(status), " (",
                                          cublasGetStatusString(status), ")"));
}

// NCCL errors are collective failures (a peer died or the network broke): UNAVAILABLE.
inline absl::Status NcclStatus(ncclResult_t result, const char* expr, const char* file, int line) {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(file, ":", line, ": ", expr, ": ",
                                             ncclGetErrorString(result)));
}

}  // namespace mptrain::cuda

#define CUDA_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                      \
    ::absl::Status cuda_status_ = ::mptrain::cuda::CudaStatus((expr), #expr, __FILE__, __LINE__); \
    if (!cuda_status_.ok()) return cuda_status_;                                            \
  } while (0)

#define CUBLAS_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                        \
    ::absl::Status cublas_status_ =                                                           \
        ::mptrain::cuda::CublasStatus((expr), #expr, __FILE__, __LINE__);                     \
    if (!cublas_status_.ok()) return cublas_status_;                                          \
  } while (0)

#define NCCL_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                      \
    ::absl::Status nccl_status_ = ::mptrain::cuda::NcclStatus((expr), #expr, __FILE__, __LINE__); \
    if (!nccl_status_.ok()) return nccl_status_;                                            \
  } while (0)
