#include "backends/cuda/nccl_collective.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_status.h"
#include "comm/lane_plan.h"

namespace mptrain::cuda {
namespace {

constexpr char kUniqueIdKey[] = "nccl_unique_id";  // One ncclUniqueId per lane, concatenated.
constexpr char kNodeKeyPrefix[] = "nccl_node/";     // + rank: its LocalNodeId().
// Buckets are striped only in slices of at least 4 MiB of fp32 (smaller ones go whole on one
// lane: a slice's fixed cost is a launch and a proxy round), cut on 256-byte boundaries.
constexpr int64_t kMinStripeElements = int64_t{1} << 20;
constexpr int64_t kStripeAlignElements = 128;
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
  if (options.lanes < 0 || options.lanes > kMaxLanes) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL: lanes must be in [0, ", kMaxLanes, "], got ", options.lanes));
  }
  std::unique_ptr<NcclCollective> collective(new NcclCollective(options, compute_stream));
  CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&collective->grads_ready_, cudaEventDisableTiming));

  // Where this rank runs, for its peers' errors; published before the communicator forms, so
  // every location is there once it has.
  KeyValueStore* store = options.store;
  collective->peers_ = std::make_unique<PeerDirectory>(store, rank, world_size);
  if (absl::Status published = collective->peers_->Publish(LocalPeerLocation(options.host));
      !published.ok()) {
    return absl::UnavailableError(
        absl::StrCat("rank ", rank, " cannot publish its location: ", published.message()));
  }

  if (world_size == 1) {
    // A world of one: every collective is the identity (an allgather a copy), so no
    // communicator forms. NCCL's would cost its set-up and its teardown — 0.51 s per job on an
    // H100 (its proxy threads' end), which a slot's next job, coming right after, waited for.
    collective->lanes_.resize(1);
    CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&collective->lanes_[0].stream, cudaStreamNonBlocking));
    CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&collective->lanes_[0].done, cudaEventDisableTiming));
    if (options.stop_token != nullptr) {
      NcclCollective* self = collective.get();
      collective->stop_registration_ =
          options.stop_token->OnStop([self](const std::string& reason) { self->Abort(reason); });
    }
    return collective;
  }
  auto ids = collective->RendezvousUniqueIds();
  if (!ids.ok()) return ids.status();
  collective->lanes_.resize(ids->size());
  for (Lane& lane : collective->lanes_) {
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&lane.done, cudaEventDisableTiming));
  }

  if (options.stop_token != nullptr) {
    NcclCollective* self = collective.get();
    collective->stop_registration_ =
        options.stop_token->OnStop([self](const std::string& reason) { self->Abort(reason); });
  }
  auto comms = collective->InitBlockingCommunicators(*ids);
  if (!comms.ok()) return comms.status();
  for (size_t i = 0; i < comms->size(); ++i) collective->lanes_[i].comm = (*comms)[i];
  collective->peers_->Prefetch(RingNeighbours(rank, world_size), kPrefetchTimeoutMs);
  return collective;
}

namespace {

// What the thread that forms the communicators shares with the rank that waits for it. The
// rank may give up (deadline, abort); the thread then aborts whatever it formed.
struct BlockingInit {
  std::mutex mu;
  bool done = false;
  bool abandoned = false;
  std::vector<ncclComm_t> comms;
  ncclResult_t result = ncclSuccess;
  size_t failed_lane = 0;
};

}  // namespace

absl::StatusOr<std::vector<ncclComm_t>> NcclCollective::InitBlockingCommunicators(
    const std::vector<ncclUniqueId>& ids) {
  // Every connection forms during initialisation, so that no later call (a collective's
  // enqueue) waits on a peer; a value the user set is kept. Rank processes have it from their
  // worker (set before they start threads); this covers in-process users (tests, benchmarks).
  // NCCL reads it when its first communicator forms.
  static std::once_flag runtime_connect_once;
  std::call_once(runtime_connect_once, [] { setenv("NCCL_RUNTIME_CONNECT", "0", 0); });
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  auto state = std::make_shared<BlockingInit>();
  const int rank = options_.rank;
  const int world_size = options_.world_size;
  // Blocking communicators (as PyTorch's process groups are by default): a non-blocking one
  // starts a thread inside NCCL for every collective (ncclGroupEnd's asynchronous launch),
  // ~60 µs per small allreduce. Their creation blocks until every rank has joined, so it runs
  // on a thread of its own that the rank can leave behind.
  std::thread([state, ids, rank, world_size, device] {
    cudaSetDevice(device);
    std::vector<ncclComm_t> made;
    ncclResult_t result = ncclSuccess;
    size_t lane = 0;
    for (; lane < ids.size(); ++lane) {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 1;
      ncclComm_t comm = nullptr;
      result = ncclCommInitRankConfig(&comm, world_size, ids[lane], rank, &config);
      if (result != ncclSuccess) break;
      made.push_back(comm);
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->abandoned) break;
    }
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->abandoned || result != ncclSuccess) {
      for (ncclComm_t comm : made) ncclCommAbort(comm);
      made.clear();
    }
    state->comms = std::move(made);
    state->result = result;
    state->failed_lane = lane;
    state->done = true;
  }).detach();

  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.rendezvous_timeout_ms);
  while (true) {
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->done) {
        if (state->result != ncclSuccess) {
          return absl::UnavailableError(absl::StrCat(
              "ncclCommInitRankConfig (lane ", state->failed_lane, ") on rank ", rank, ": ",
              ncclGetErrorString(state->result)));
        }
        return state->comms;
      }
      if (abort_requested_.load()) {
        state->abandoned = true;
        return AbortedStatus("ncclCommInitRankConfig");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        state->abandoned = true;
        return absl::DeadlineExceededError(
            absl::StrCat("ncclCommInitRankConfig on rank ", rank, " did not complete within ",
                         options_.rendezvous_timeout_ms, " ms"));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

absl::StatusOr<std::vector<ncclUniqueId>> NcclCollective::RendezvousUniqueIds() {
  const int rank = options_.rank;
  const int world_size = options_.world_size;
  KeyValueStore* store = options_.store;
  // With lanes left to rank 0, each rank says which node it is on (as NCCL names nodes).
  if (options_.lanes == 0 && world_size > 1) {
    absl::Status published = store->Set(absl::StrCat(kNodeKeyPrefix, rank), LocalNodeId());
    if (!published.ok()) {
      return absl::UnavailableError(
          absl::StrCat("rank ", rank, " cannot publish its node: ", published.message()));
    }
  }
  std::vector<ncclUniqueId> ids;
  if (rank == 0) {
    std::vector<std::string> nodes = {LocalNodeId()};
    if (options_.lanes == 0) {
      // One deadline for all of them: the rendezvous waits at most its timeout in all.
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(options_.rendezvous_timeout_ms);
      for (int peer = 1; peer < world_size; ++peer) {
        const int64_t left_ms = std::max<int64_t>(
            1, std::chrono::duration_cast<std::chrono::milliseconds>(
                   deadline - std::chrono::steady_clock::now())
                   .count());
        auto node = store->Get(absl::StrCat(kNodeKeyPrefix, peer), left_ms);
        if (!node.ok()) {
          return absl::Status(node.status().code() == absl::StatusCode::kAborted
                                  ? absl::StatusCode::kAborted
                                  : absl::StatusCode::kUnavailable,
                              absl::StrCat("rank 0 did not learn rank ", peer,
                                           "'s node: ", node.status().message()));
        }
        nodes.push_back(*node);
      }
    }
    // A world of one has nothing to stripe.
    ids.resize(world_size == 1 ? 1 : ResolveLanes(options_.lanes, nodes));
    std::string value;
    for (ncclUniqueId& id : ids) {
      NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
      value.append(reinterpret_cast<const char*>(&id), sizeof(id));
    }
    absl::Status published = store->Set(kUniqueIdKey, value);
    if (!published.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot publish the NCCL unique ids: ", published.message()));
    }
    return ids;
  }
  // The others block on the store for rank 0's ids: as many as it decided lanes.
  auto fetched = store->Get(kUniqueIdKey, options_.rendezvous_timeout_ms);
  if (!fetched.ok()) {
    return absl::Status(fetched.status().code() == absl::StatusCode::kAborted
                            ? absl::StatusCode::kAborted
                            : absl::StatusCode::kUnavailable,
                        absl::StrCat("rank ", rank, " did not get the NCCL unique id: ",
                                     fetched.status().message()));
  }
  const size_t count = fetched->size() / sizeof(ncclUniqueId);
  if (fetched->size() % sizeof(ncclUniqueId) != 0 || count < 1 ||
      count > static_cast<size_t>(kMaxLanes)) {
    return absl::InternalError(absl::StrCat("NCCL unique ids: ", fetched->size(),
                                            " bytes, expected 1 to ", kMaxLanes, " ids of ",
                                            sizeof(ncclUniqueId)));
  }
  ids.resize(count);
  std::memcpy(ids.data(), fetched->data(), fetched->size());
  return ids;
}

NcclCollective::~NcclCollective() {
  stop_registration_.reset();
  // A clean finalize can hang if a peer is gone; abort is always safe at teardown.
  AbortCommunicator();
  for (Lane& lane : lanes_) {
    if (lane.done != nullptr) cudaEventDestroy(lane.done);
    if (lane.stream != nullptr) cudaStreamDestroy(lane.stream);
  }
  if (grads_ready_ != nullptr) cudaEventDestroy(grads_ready_);
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

absl::Status NcclCollective::AloneStatus(const char* what) {
  if (abort_requested_.load()) return AbortedStatus(what);
  return absl::OkStatus();
}

absl::Status NcclCollective::AllReduceMean(Tensor buffer) {
  absl::Status status = AllReduceMeanAsync(buffer);
  if (!status.ok()) return status;
  return JoinAllReduces();
}

template <typename Op>
absl::Status NcclCollective::Enqueue(const char* name, int lanes, Op op) {
  if (abort_requested_.load()) {
    AbortCommunicator();
    return AbortedStatus(name);
  }
  if (communicator_aborted_) return absl::UnavailableError("the NCCL communicator was aborted");
  last_op_ = name;
  // The lanes' streams wait for the work so far; the compute stream goes on (the backward).
  CUDA_RETURN_IF_ERROR(cudaEventRecord(grads_ready_, compute_stream_));
  for (int i = 0; i < lanes; ++i) {
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(lanes_[i].stream, grads_ready_, 0));
    lanes_[i].pending = true;
  }
  // Slices on several communicators go in one group: one launch for all of them.
  if (lanes > 1) NCCL_RETURN_IF_ERROR(ncclGroupStart());
  absl::Status issued = op();
  if (lanes > 1) {
    absl::Status ended = NcclStatus(ncclGroupEnd(), "ncclGroupEnd", __FILE__, __LINE__);
    if (issued.ok()) issued = ended;
  }
  if (!issued.ok()) {
    AbortCommunicator();
    return issued;
  }
  return absl::OkStatus();
}

absl::Status NcclCollective::StripedAllReduce(const char* name, Tensor buffer,
                                              ncclDataType_t type, ncclRedOp_t op) {
  // The mean or sum over one rank is the buffer itself. NCCL would still launch a kernel per
  // call for ncclAvg (its one-rank path scales by 1/1): 1.1 ms per mlp8k step on one GPU.
  if (options_.world_size == 1) return AloneStatus(name);
  const std::vector<Stripe> stripes =
      PlanStripes(buffer.numel(), lanes(), kMinStripeElements, kStripeAlignElements);
  if (stripes.empty()) return absl::OkStatus();
  const size_t element_bytes = DTypeBytes(buffer.dtype);
  return Enqueue(name, static_cast<int>(stripes.size()), [&]() -> absl::Status {
    for (size_t i = 0; i < stripes.size(); ++i) {
      char* data = static_cast<char*>(buffer.data) + stripes[i].offset * element_bytes;
      NCCL_RETURN_IF_ERROR(ncclAllReduce(data, data, static_cast<size_t>(stripes[i].count), type,
                                         op, lanes_[i].comm, lanes_[i].stream));
    }
    return absl::OkStatus();
  });
}

absl::Status NcclCollective::AllReduceMeanAsync(Tensor buffer) {
  if (buffer.dtype != DType::kF32) {
    return absl::InvalidArgumentError("allreduce mean: the buffer must be f32");
  }
  return StripedAllReduce("allreduce", buffer, ncclFloat32, ncclAvg);
}

absl::Status NcclCollective::AllReduceSumCompressedAsync(Tensor buffer) {
  if (buffer.dtype != DType::kF16 && buffer.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("compressed allreduce: the buffer must be f16 or bf16");
  }
  const ncclDataType_t type = buffer.dtype == DType::kF16 ? ncclFloat16 : ncclBfloat16;
  return StripedAllReduce("allreduce", buffer, type, ncclSum);
}

absl::Status NcclCollective::Broadcast(Tensor buffer, int root) {
  if (root < 0 || root >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root,
                                                   " is not a rank of a world of ",
                                                   options_.world_size));
  }
  if (options_.world_size == 1) return AloneStatus("broadcast");  // Rank 0's buffer already.
  absl::Status enqueued = Enqueue("broadcast", 1, [&]() -> absl::Status {
    NCCL_RETURN_IF_ERROR(ncclBroadcast(buffer.data, buffer.data,
                                       static_cast<size_t>(buffer.numel()), ncclFloat32, root,
                                       lanes_[0].comm, lanes_[0].stream));
    return absl::OkStatus();
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
  if (n == 1) {  // Rank 0's own row (no communicator in a world of one).
    if (absl::Status alone = AloneStatus("allgather"); !alone.ok()) return alone;
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(recv.data, send.data,
                                         static_cast<size_t>(send.numel()) * sizeof(float),
                                         cudaMemcpyDeviceToDevice, compute_stream_));
    return absl::OkStatus();
  }
  absl::Status enqueued = Enqueue("allgather", 1, [&]() -> absl::Status {
    NCCL_RETURN_IF_ERROR(ncclAllGather(send.data, recv.data, static_cast<size_t>(send.numel()),
                                       ncclFloat32, lanes_[0].comm, lanes_[0].stream));
    return absl::OkStatus();
  });
  if (!enqueued.ok()) return enqueued;
  return JoinAllReduces();
}

absl::Status NcclCollective::AllReduceSum(Tensor buffer) {
  if (options_.world_size == 1) return AloneStatus("allreduce");
  absl::Status enqueued = Enqueue("allreduce", 1, [&]() -> absl::Status {
    NCCL_RETURN_IF_ERROR(ncclAllReduce(buffer.data, buffer.data,
                                       static_cast<size_t>(buffer.numel()), ncclFloat32, ncclSum,
                                       lanes_[0].comm, lanes_[0].stream));
    return absl::OkStatus();
  });
  if (!enqueued.ok()) return enqueued;
  return JoinAllReduces();
}

absl::Status NcclCollective::JoinAllReduces() {
  for (Lane& lane : lanes_) {
    if (!lane.pending) continue;
    CUDA_RETURN_IF_ERROR(cudaEventRecord(lane.done, lane.stream));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_stream_, lane.done, 0));
    lane.pending = false;
  }
  return absl::OkStatus();
}

absl::Status NcclCollective::AsyncError() {
  if (abort_requested_.load()) return AbortedStatus("wait");
  if (communicator_aborted_) return absl::UnavailableError("the NCCL communicator was aborted");
  for (const Lane& lane : lanes_) {
    if (lane.comm == nullptr) continue;
    ncclResult_t state = ncclSuccess;
    ncclResult_t result = ncclCommGetAsyncError(lane.comm, &state);
    if (result != ncclSuccess) {
      return absl::UnavailableError(absl::StrCat("ncclCommGetAsyncError: ",
                                                 ncclGetErrorString(result)));
    }
    if (state != ncclSuccess && state != ncclInProgress) {
      return absl::UnavailableError(absl::StrCat("NCCL error on rank ", options_.rank, ": ",
                                                 ncclGetErrorString(state)));
    }
  }
  return absl::OkStatus();
}

bool NcclCollective::HasPendingWork() {
  if (communicator_aborted_) return false;
  for (const Lane& lane : lanes_) {
    if (lane.stream == nullptr) continue;
    const cudaError_t state = cudaStreamQuery(lane.stream);
    if (state != cudaErrorNotReady) cudaGetLastError();  // Do not leave an error behind.
    if (state == cudaErrorNotReady) return true;
  }
  return false;
}

std::string NcclCollective::TimeoutMessage(const char* what) {
  return CollectiveTimeoutMessage(
      last_op_, options_.collective_timeout_ms, peers_.get(),
      RingNeighbours(options_.rank, options_.world_size),
      absl::StrCat("while waiting for ", what,
                   "; NCCL does not say which peer is missing: these are its neighbours by rank"));
}

void NcclCollective::AbortCommunicator() {
  if (communicator_aborted_) return;
  communicator_aborted_ = true;
  if (before_abort_) before_abort_();
  // One thread per lane (SetAbortHooks): each lane's abort waits for the graphs that captured
  // it, and a graph with several lanes' kernels ends only once every one of their flags is set.
  std::vector<std::thread> aborts;
  for (const Lane& lane : lanes_) {
    if (lane.comm == nullptr) continue;
    auto abort = [comm = lane.comm] {
      int device = 0;
      if (ncclCommCuDevice(comm, &device) == ncclSuccess) cudaSetDevice(device);
      ncclCommAbort(comm);
    };
    try {
      aborts.emplace_back(abort);
    } catch (const std::system_error&) {
      abort();  // No thread to be had: in turn (no graph holds this lane, or it cannot end).
    }
  }
  if (during_abort_) during_abort_();
  for (std::thread& abort : aborts) abort.join();
}

}  // namespace mptrain::cuda
