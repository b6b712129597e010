#include "backends/cuda/nccl_collective.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_status.h"

namespace mptrain::cuda {
namespace {

constexpr char kUniqueIdKey[] = "nccl_unique_id";
constexpr int64_t kPrefetchTimeoutMs = 5'000;

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::Connect(
    int rank, int world_size, KeyValueStore* store, cudaStream_t compute_stream,
    int64_t timeout_ms) {
  NcclCollectiveOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.store = store;
  options.rendezvous_timeout_ms = timeout_ms;
  options.collective_timeout_ms = timeout_ms;
  return Connect(options, compute_stream);
}

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::Connect(
    const NcclCollectiveOptions& options, cudaStream_t compute_stream) {
  const int rank = options.rank;
  const int world_size = options.world_size;
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL: rank ", rank, " is not in a world of ", world_size));
  }
  if (options.rendezvous_timeout_ms <= 0 || options.collective_timeout_ms <= 0) {
    return absl::InvalidArgumentError("NCCL: timeouts must be > 0 ms");
  }
  std::unique_ptr<NcclCollective> collective(new NcclCollective(options, compute_stream));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&collective->comm_stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&collective->grads_ready_, cudaEventDisableTiming));
  CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&collective->reduce_done_, cudaEventDisableTiming));

  // Where this rank runs, for its peers' errors; published before the communicator forms, so
  // every location is there once it has.
  KeyValueStore* store = options.store;
  collective->peers_ = std::make_unique<PeerDirectory>(store, rank, world_size);
  if (absl::Status published = collective->peers_->Publish(LocalPeerLocation(options.host));
      !published.ok()) {
    return absl::UnavailableError(
        absl::StrCat("rank ", rank, " cannot publish its location: ", published.message()));
  }

  // Rank 0 creates the unique id and publishes its 128 bytes; the others block on the store.
  ncclUniqueId id;
  if (rank == 0) {
    NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    absl::Status published =
        store->Set(kUniqueIdKey, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    if (!published.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot publish the NCCL unique id: ", published.message()));
    }
  } else {
    auto fetched = store->Get(kUniqueIdKey, options.rendezvous_timeout_ms);
    if (!fetched.ok()) {
      return absl::Status(fetched.status().code() == absl::StatusCode::kAborted
                              ? absl::StatusCode::kAborted
                              : absl::StatusCode::kUnavailable,
                          absl::StrCat("rank ", rank, " did not get the NCCL unique id: ",
                                       fetched.status().message()));
    }
    if (fetched->size() != sizeof(id)) {
      return absl::InternalError(absl::StrCat("NCCL unique id has ", fetched->size(),
                                              " bytes, expected ", sizeof(id)));
    }
    std::memcpy(&id, fetched->data(), sizeof(id));
  }

  // Non-blocking: every NCCL call may return ncclInProgress, and we poll for completion.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  NCCL_RETURN_IF_ERROR(ncclCommInitRankConfig(&collective->comm_, world_size, id, rank, &config));
  if (options.stop_token != nullptr) {
    NcclCollective* self = collective.get();
    collective->stop_registration_ =
        options.stop_token->OnStop([self](const std::string& reason) { self->Abort(reason); });
  }
  absl::Status ready =
      collective->WaitUntilNotInProgress(options.rendezvous_timeout_ms, "ncclCommInitRankConfig");
  if (!ready.ok()) {
    collective->AbortCommunicator();
    return ready;
  }
  collective->peers_->Prefetch(RingNeighbours(rank, world_size), kPrefetchTimeoutMs);
  return collective;
}

NcclCollective::~NcclCollective() {
  stop_registration_.reset();
  // A clean finalize can hang if a peer is gone; abort is always safe at teardown.
  AbortCommunicator();
  if (grads_ready_ != nullptr) cudaEventDestroy(grads_ready_);
  if (reduce_done_ != nullptr) cudaEventDestroy(reduce_done_);
  if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
}

void NcclCollective::Abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (abort_requested_.load()) return;
  abort_reason_ = reason;
  abort_requested_.store(true);
}

absl::Status NcclCollective::AbortedStatus(const char* what) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  return absl::AbortedError(absl::StrCat("collective ", what, " on rank ", options_.rank,
                                         " aborted: ", abort_reason_));
}

absl::Status NcclCollective::WaitUntilNotInProgress(int64_t timeout_ms, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  // Enqueueing a collective on a non-blocking communicator usually completes within tens of
  // microseconds: poll without sleeping for the first 2 ms (a 100 µs sleep made every small
  // collective cost ~0.19 ms against NCCL's ~0.04 ms), then back off to 100 µs sleeps.
  const auto spin_until = start + std::chrono::milliseconds(2);
  while (true) {
    if (abort_requested_.load()) return AbortedStatus(what);
    ncclResult_t state = ncclSuccess;
    NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      return absl::UnavailableError(absl::StrCat(what, " on rank ", options_.rank, " failed: ",
                                                 ncclGetErrorString(state)));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, " on rank ", options_.rank,
                                                      " did not complete within ", timeout_ms,
                                                      " ms"));
    }
    if (std::chrono::steady_clock::now() < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

absl::Status NcclCollective::AllReduceMean(Tensor buffer) {
  absl::Status status = AllReduceMeanAsync(buffer);
  if (!status.ok()) return status;
  return JoinAllReduces();
}

template <typename Op>
absl::Status NcclCollective::Enqueue(const char* name, Op op) {
  if (abort_requested_.load()) {
    AbortCommunicator();
    return AbortedStatus(name);
  }
  if (communicator_aborted_) return absl::UnavailableError("the NCCL communicator was aborted");
  last_op_ = name;
  // The comm stream waits for the work so far; the compute stream goes on (the backward pass).
  CUDA_RETURN_IF_ERROR(cudaEventRecord(grads_ready_, compute_stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(comm_stream_, grads_ready_, 0));
  NCCL_RETURN_IF_ERROR(op());
  // Non-blocking communicators may return before the operation is enqueued.
  if (absl::Status enqueued = WaitUntilNotInProgress(options_.collective_timeout_ms, name);
      !enqueued.ok()) {
    AbortCommunicator();
    return enqueued;
  }
  return absl::OkStatus();
}

absl::Status NcclCollective::AllReduceMeanAsync(Tensor buffer) {
  return Enqueue("allreduce", [&] {
    return ncclAllReduce(buffer.data, buffer.data, static_cast<size_t>(buffer.numel()),
                         ncclFloat32, ncclAvg, comm_, comm_stream_);
  });
}

absl::Status NcclCollective::AllReduceSumCompressedAsync(Tensor buffer) {
  if (buffer.dtype != DType::kF16 && buffer.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("compressed allreduce: the buffer must be f16 or bf16");
  }
  const ncclDataType_t type = buffer.dtype == DType::kF16 ? ncclFloat16 : ncclBfloat16;
  return Enqueue("allreduce", [&] {
    return ncclAllReduce(buffer.data, buffer.data, static_cast<size_t>(buffer.numel()), type,
                         ncclSum, comm_, comm_stream_);
  });
}

absl::Status NcclCollective::Broadcast(Tensor buffer, int root) {
  if (root < 0 || root >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root,
                                                   " is not a rank of a world of ",
                                                   options_.world_size));
  }
  absl::Status enqueued = Enqueue("broadcast", [&] {
    return ncclBroadcast(buffer.data, buffer.data, static_cast<size_t>(buffer.numel()),
                         ncclFloat32, root, comm_, comm_stream_);
  });
  if (!enqueued.ok()) return enqueued;
  return JoinAllReduces();  // Later compute-stream work sees the broadcast's result.
}

absl::Status NcclCollective::AllGather(Tensor send, Tensor recv) {
  const int64_t n = options_.world_size;
  if (recv.numel() != send.numel() * n || send.dtype != DType::kF32 ||
      recv.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("allgather: f32 [1, k] into [", n,
                                                   ", k] expected, got ", send.numel(), " into ",
                                                   recv.numel()));
  }
  absl::Status enqueued = Enqueue("allgather", [&] {
    return ncclAllGather(send.data, recv.data, static_cast<size_t>(send.numel()), ncclFloat32,
                         comm_, comm_stream_);
  });
  if (!enqueued.ok()) return enqueued;
  return JoinAllReduces();
}

absl::Status NcclCollective::AllReduceSum(Tensor buffer) {
  absl::Status enqueued = Enqueue("allreduce", [&] {
    return ncclAllReduce(buffer.data, buffer.data, static_cast<size_t>(buffer.numel()),
                         ncclFloat32, ncclSum, comm_, comm_stream_);
  });
  if (!enqueued.ok()) return enqueued;
  return JoinAllReduces();
}

absl::Status NcclCollective::JoinAllReduces() {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(reduce_done_, comm_stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_stream_, reduce_done_, 0));
  return absl::OkStatus();
}

absl::Status NcclCollective::AsyncError() {
  if (abort_requested_.load()) return AbortedStatus("wait");
  if (comm_ == nullptr) return absl::OkStatus();
  if (communicator_aborted_) return absl::UnavailableError("the NCCL communicator was aborted");
  ncclResult_t state = ncclSuccess;
  ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
  if (result != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclCommGetAsyncError: ",
                                               ncclGetErrorString(result)));
  }
  if (state != ncclSuccess && state != ncclInProgress) {
    return absl::UnavailableError(absl::StrCat("NCCL error on rank ", options_.rank, ": ",
                                               ncclGetErrorString(state)));
  }
  return absl::OkStatus();
}

bool NcclCollective::HasPendingWork() {
  if (comm_stream_ == nullptr || communicator_aborted_) return false;
  const cudaError_t state = cudaStreamQuery(comm_stream_);
  if (state != cudaErrorNotReady) cudaGetLastError();  // Do not leave an error behind.
  return state == cudaErrorNotReady;
}

std::string NcclCollective::TimeoutMessage(const char* what) {
  return CollectiveTimeoutMessage(
      last_op_, options_.collective_timeout_ms, peers_.get(),
      RingNeighbours(options_.rank, options_.world_size),
      absl::StrCat("while waiting for ", what,
                   "; NCCL does not say which peer is missing: these are its neighbours by rank"));
}

void NcclCollective::AbortCommunicator() {
  if (comm_ != nullptr && !communicator_aborted_) {
    ncclCommAbort(comm_);
    communicator_aborted_ = true;
  }
}

}  // namespace mptrain::cuda
