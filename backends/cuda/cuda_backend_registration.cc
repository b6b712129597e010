// Registers the CUDA backend (NCCL collective) under DeviceKind CUDA.

#include <cublasLt.h>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_status.h"
#include "common/status_macros.h"
#include "backends/cuda/nccl_collective.h"
#include "trainer/backend_registry.h"

namespace mptrain::cuda {
namespace {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options) {
  auto backend = CudaBackend::Create(
      options.device_index,
      [&](cudaStream_t stream) -> absl::StatusOr<std::unique_ptr<Collective>> {
        NcclCollectiveOptions nccl_options;
        nccl_options.rank = options.rank;
        nccl_options.world_size = options.world_size;
        nccl_options.store = options.store;
        nccl_options.host = options.host;
        nccl_options.rendezvous_timeout_ms = options.rendezvous_timeout_ms;
        nccl_options.collective_timeout_ms = options.collective_timeout_ms;
        nccl_options.stop_token = options.stop_token;
        nccl_options.lanes = options.grad_comm_lanes;
        auto nccl = NcclCollective::Connect(nccl_options, stream);
        if (!nccl.ok()) return nccl.status();
        return std::unique_ptr<Collective>(std::move(*nccl));
      },
      options.collective_timeout_ms);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<Backend>(std::move(*backend));
}

// No driver or no GPU is not an error: the machine simply has no CUDA devices.
absl::StatusOr<LocalDevices> DiscoverGpus() {
  LocalDevices devices;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return devices;
  }
  for (int index = 0; index < count; ++index) {
    cudaDeviceProp properties;
    if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) continue;
    v1::DeviceInfo info;
    info.set_index(index);
    info.set_name(properties.name);
    info.set_memory_bytes(static_cast<int64_t>(properties.totalGlobalMem));
    devices.devices.push_back(info);
  }
  devices.count = static_cast<int>(devices.devices.size());
  return devices;
}

// cuBLASLt sets its heuristics up at the first algorithm query of a process, and loads a kernel
// at its first launch: one small matmul per training dtype (fp16, bf16, fp32; fp32 accumulate,
// as the backend's) does that before a job's first step has to.
absl::Status RehearseLtMatmuls(cublasLtHandle_t handle) {
  constexpr int kSize = 64;
  void* buffer = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&buffer, 3 * kSize * kSize * 4));
  absl::Status status = CudaStatus(cudaMemset(buffer, 0, 3 * kSize * kSize * 4), "cudaMemset",
                                   __FILE__, __LINE__);
  char* const a = static_cast<char*>(buffer);
  char* const b = a + kSize * kSize * 4;
  char* const d = b + kSize * kSize * 4;
  for (cudaDataType_t type : {CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F}) {
    if (!status.ok()) break;
    cublasLtMatmulDesc_t operation = nullptr;
    cublasLtMatrixLayout_t layout = nullptr;
    cublasLtMatmulPreference_t preference = nullptr;
    status = CublasStatus(cublasLtMatmulDescCreate(&operation, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                          "cublasLtMatmulDescCreate", __FILE__, __LINE__);
    if (status.ok()) {
      status = CublasStatus(cublasLtMatrixLayoutCreate(&layout, type, kSize, kSize, kSize),
                            "cublasLtMatrixLayoutCreate", __FILE__, __LINE__);
    }
    if (status.ok()) {
      status = CublasStatus(cublasLtMatmulPreferenceCreate(&preference),
                            "cublasLtMatmulPreferenceCreate", __FILE__, __LINE__);
    }
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    if (status.ok() &&
        cublasLtMatmulAlgoGetHeuristic(handle, operation, layout, layout, layout, layout,
                                       preference, 1, &heuristic, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0) {
      const float alpha = 1.0f, beta = 0.0f;
      status = CublasStatus(cublasLtMatmul(handle, operation, &alpha, a, layout, b, layout, &beta,
                                           d, layout, d, layout, &heuristic.algo, nullptr, 0,
                                           nullptr),
                            "cublasLtMatmul", __FILE__, __LINE__);
    }
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    if (layout != nullptr) cublasLtMatrixLayoutDestroy(layout);
    if (operation != nullptr) cublasLtMatmulDescDestroy(operation);
  }
  const cudaError_t synced = cudaDeviceSynchronize();
  cudaFree(buffer);
  if (!status.ok()) return status;
  return CudaStatus(synced, "cudaDeviceSynchronize", __FILE__, __LINE__);
}

// What a rank's first CudaBackend::Create spends most of its time on, done ahead: the device's
// primary context (which every later cudaSetDevice of this process reuses), cuBLAS's and
// cuBLASLt's one-time library set-up (their handles are created and destroyed: a backend makes
// its own), and NCCL's per-process set-up, which happens at the first communicator (loading
// its kernels, NVML, probing the topology): a communicator of this one device, formed and
// destroyed (ncclCommInitAll needs no unique id and no peer).
absl::Status WarmUpGpu(int device_index) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_index));
  CUDA_RETURN_IF_ERROR(cudaFree(nullptr));
  cublasHandle_t cublas = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas));
  cublasDestroy(cublas);
  cublasLtHandle_t cublas_lt = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&cublas_lt));
  absl::Status rehearsed = RehearseLtMatmuls(cublas_lt);
  cublasLtDestroy(cublas_lt);
  RETURN_IF_ERROR(rehearsed);
  ncclComm_t comm = nullptr;
  int device = device_index;
  NCCL_RETURN_IF_ERROR(ncclCommInitAll(&comm, 1, &device));
  NCCL_RETURN_IF_ERROR(ncclCommDestroy(comm));
  return absl::OkStatus();
}

const BackendRegistrar kRegistrar(v1::CUDA,
                                  BackendEntry{CreateCudaBackend, DiscoverGpus, WarmUpGpu});

}  // namespace
}  // namespace mptrain::cuda
