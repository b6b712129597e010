// Registers the CUDA backend (NCCL collective) under DeviceKind CUDA.

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_status.h"
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

// What a rank's first CudaBackend::Create spends most of its time on, done ahead: the device's
// primary context (which every later cudaSetDevice of this process reuses) and cuBLAS's and
// cuBLASLt's one-time library set-up (their handles are created and destroyed: a backend makes
// its own).
absl::Status WarmUpGpu(int device_index) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_index));
  CUDA_RETURN_IF_ERROR(cudaFree(nullptr));
  cublasHandle_t cublas = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas));
  cublasDestroy(cublas);
  cublasLtHandle_t cublas_lt = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&cublas_lt));
  cublasLtDestroy(cublas_lt);
  return absl::OkStatus();
}

const BackendRegistrar kRegistrar(v1::CUDA,
                                  BackendEntry{CreateCudaBackend, DiscoverGpus, WarmUpGpu});

}  // namespace
}  // namespace mptrain::cuda
