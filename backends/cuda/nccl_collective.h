#pragma once

// The CUDA backend's collective: one NCCL communicator per rank, created non-blocking with a
// timeout from a unique id that rank 0 publishes through the job's key-value store. The
// allreduce runs on its own stream, ordered after the compute stream's work by an event and
// before the compute stream's later work by another; nothing here blocks the host.

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/key_value_store.h"

namespace mptrain::cuda {

class NcclCollective final : public Collective {
 public:
  // Blocks until the communicator is ready or timeout_ms passes (then aborts it).
  static absl::StatusOr<std::unique_ptr<NcclCollective>> Connect(int rank, int world_size,
                                                                 KeyValueStore* store,
                                                                 cudaStream_t compute_stream,
                                                                 int64_t timeout_ms);
  ~NcclCollective() override;

  // Mean over ranks of an f32 device buffer (ncclAvg), enqueued between compute-stream work.
  absl::Status AllReduceMean(Tensor buffer) override;
  absl::Status AllReduceMeanAsync(Tensor buffer) override;
  absl::Status JoinAllReduces() override;
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  // The communicator's asynchronous error, if any (UNAVAILABLE). Called while polling waits.
  absl::Status AsyncError();
  // Aborts the communicator so that kernels waiting on peers return (NCCL's fault tolerance).
  void Abort();

 private:
  NcclCollective(int rank, int world_size, cudaStream_t compute_stream)
      : rank_(rank), world_size_(world_size), compute_stream_(compute_stream) {}
  absl::Status WaitUntilNotInProgress(int64_t timeout_ms, const char* what);

  int rank_;
  int world_size_;
  cudaStream_t compute_stream_;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t grads_ready_ = nullptr;
  cudaEvent_t reduce_done_ = nullptr;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
};

}  // namespace mptrain::cuda
