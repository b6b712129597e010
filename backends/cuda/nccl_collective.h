#pragma once

// The CUDA backend's collective: blocking NCCL communicators (ncclConfig_t.blocking = 1, as
// PyTorch's process groups have) from unique ids that rank 0 publishes through the job's
// key-value store. A non-blocking communicator would start a thread inside NCCL for every
// collective (ncclGroupEnd's asynchronous launch), ~60 µs per small allreduce. Their creation,
// which waits for every rank, runs on a thread the rank leaves behind on its deadline or on
// Abort(); NCCL_RUNTIME_CONNECT=0 makes every connection then, so that no later call waits on a
// peer.
//
// Each communicator ("lane", comm/lane_plan.h) has its own stream; a large gradient bucket is
// striped over the lanes (one between GPUs of a node, four by default between nodes,
// JobSpec.grad_comm_lanes), everything else runs on lane 0. The streams are ordered after the
// compute stream's work by an event and before the compute stream's later work by others;
// nothing here blocks the host. Every wait for the GPU polls ncclCommGetAsyncError with a
// deadline (as nccl-tests does) and calls ncclCommAbort on error, timeout or Abort() from the
// thread that waits, so no wait is ever endless.
//
// In a world of one rank the allreduces and the broadcast are the identity: they run nothing
// (NCCL's one-rank ncclAvg would launch a kernel per call), an allgather is a copy, and no NCCL
// communicator forms at all (its teardown alone took 0.5 s: what the slot's next job waited for).
//
// Network: NCCL takes its settings from the environment. The worker daemon gives each rank
// NCCL_SOCKET_IFNAME "=<interface>" (the interface holding the worker's advertised address,
// for bootstrap and the socket transport) and NCCL_SOCKET_FAMILY, unless the user set them
// (worker/address.h). NCCL has no setting for its listening ports (no release has a port
// range): its sockets listen on ports of the kernel's choice, whatever --port_range says.

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/peer_directory.h"
#include "comm/stop_token.h"
#include "trainer/backend.h"
#include "trainer/key_value_store.h"

namespace mptrain::cuda {

struct NcclCollectiveOptions {
  int rank = 0;
  int world_size = 1;
  // Rendezvous (the unique id) and where the peers run (comm/peer_directory.h); must outlive
  // the collective.
  KeyValueStore* store = nullptr;
  std::string host = "127.0.0.1";           // This rank's advertised address (for errors).
  int64_t rendezvous_timeout_ms = 120'000;  // Unique id and communicator creation.
  int64_t collective_timeout_ms = 60'000;   // One operation's wait for its peers.
  StopToken* stop_token = nullptr;          // Optional; aborts the collective when tripped.
  // Communicators the gradient allreduce is striped over: 1..kMaxLanes, or 0 to let rank 0
  // decide from where the ranks run (comm/lane_plan.h: 1 within a node, 4 across nodes).
  int lanes = 0;
};

class NcclCollective final : public Collective {
 public:
  // Blocks until the communicator is ready or the rendezvous timeout passes (then aborts it).
  static absl::StatusOr<std::unique_ptr<NcclCollective>> Connect(
      const NcclCollectiveOptions& options, cudaStream_t compute_stream);
  // The same with one timeout for the rendezvous and every operation.
  static absl::StatusOr<std::unique_ptr<NcclCollective>> Connect(int rank, int world_size,
                                                                 KeyValueStore* store,
                                                                 cudaStream_t compute_stream,
                                                                 int64_t timeout_ms);
  ~NcclCollective() override;

  // Mean over ranks of an f32 device buffer (ncclAvg), enqueued between compute-stream work.
  absl::Status AllReduceMean(Tensor buffer) override;
  absl::Status AllReduceMeanAsync(Tensor buffer) override;
  absl::Status JoinAllReduces() override;
  absl::Status AllReduceSumCompressedAsync(Tensor buffer) override;
  // ncclBroadcast in place on the comm stream, ordered between compute-stream work like
  // AllReduceMean.
  absl::Status Broadcast(Tensor buffer, int root) override;
  // sync_batch_norm's collectives: ncclAllGather and ncclAllReduce(ncclSum) on the comm stream,
  // ordered between compute-stream work like Broadcast (later compute work waits for them, and
  // so for any bucket allreduce queued before them on the comm stream).
  absl::Status AllGather(Tensor send, Tensor recv) override;
  absl::Status AllReduceSum(Tensor buffer) override;
  int rank() const override { return options_.rank; }
  // How many communicators the allreduces are striped over (what rank 0 decided).
  int lanes() const { return static_cast<int>(lanes_.size()); }
  int world_size() const override { return options_.world_size; }
  // Any thread: marks the collective aborted. The thread that waits on it (the backend's
  // polling loop, or the next call) then calls ncclCommAbort and returns ABORTED.
  void Abort(const std::string& reason) override;

  // Polled while waiting: ABORTED after Abort(), UNAVAILABLE on the communicator's
  // asynchronous error. The caller then calls AbortCommunicator().
  absl::Status AsyncError();
  // ncclCommAbort, once, on the thread that uses the communicator: kernels waiting on peers
  // return (NCCL's fault tolerance). The hooks of SetAbortHooks run around it.
  void AbortCommunicator();
  // For the owner of CUDA graphs that captured this communicator's collectives. NCCL's abort
  // sets the communicator's abort flag, then does not return until every such graph is
  // destroyed; destroying a graph waited for its launch (seen on 2xH200, driver 580, although
  // CUDA documents a deferred free), and a launch waiting on a dead peer ends only once the flag
  // is set. So: `before` runs first, on the aborting thread, and must not wait on the device (it
  // ends a capture in progress, whose lanes may not be joined yet); then each lane's
  // ncclCommAbort runs on a thread of its own while `during` destroys the graphs; then they are
  // joined. Either wait alone would last for ever.
  void SetAbortHooks(std::function<void()> before, std::function<void()> during) {
    before_abort_ = std::move(before);
    during_abort_ = std::move(during);
  }
  int64_t collective_timeout_ms() const { return options_.collective_timeout_ms; }
  // Whether collective work is still queued or running on a lane's stream (call before
  // AbortCommunicator).
  bool HasPendingWork();
  // A wait for `what` timed out with collective work pending: "collective allreduce timed out
  // after 60 s: rank 0 on h1 (10.0.0.2) waited for rank 1 on h2 (10.0.0.3) (...)". NCCL does
  // not say which peer is missing, so the ranks named are this rank's neighbours by rank.
  std::string TimeoutMessage(const char* what);

 private:
  NcclCollective(const NcclCollectiveOptions& options, cudaStream_t compute_stream)
      : options_(options), compute_stream_(compute_stream) {}
  struct Lane {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;  // Recorded on `stream` when the compute stream joins it.
    // Work was enqueued on it since the compute stream last joined it. Only those lanes are
    // joined: a lane with nothing new has nothing to wait for, and while a step is recorded as
    // a CUDA graph a lane that took no part is outside the capture, where waiting on its event
    // would invalidate the recording.
    bool pending = false;
  };
  // Rank 0 decides the lanes and makes their unique ids; every rank reads them.
  absl::StatusOr<std::vector<ncclUniqueId>> RendezvousUniqueIds();
  // One blocking communicator per id, formed on a detached thread; gives up (and has the thread
  // abort what it formed) on the rendezvous deadline or Abort().
  absl::StatusOr<std::vector<ncclComm_t>> InitBlockingCommunicators(
      const std::vector<ncclUniqueId>& ids);
  // Orders the first `lanes` lanes' streams after the compute stream's work so far and enqueues
  // `op` (grouped when it spans lanes).
  template <typename Op>
  absl::Status Enqueue(const char* name, int lanes, Op op);
  // An allreduce of `buffer` striped over the lanes (comm/lane_plan.h PlanStripes).
  absl::Status StripedAllReduce(const char* name, Tensor buffer, ncclDataType_t type,
                                ncclRedOp_t op);
  absl::Status AbortedStatus(const char* what);
  // What an allreduce or broadcast in a world of one returns without any work: ABORTED once
  // Abort() was called, as for any other collective, else OK.
  absl::Status AloneStatus(const char* what);

  NcclCollectiveOptions options_;
  cudaStream_t compute_stream_;
  std::function<void()> before_abort_, during_abort_;
  std::vector<Lane> lanes_;  // lanes_[0] carries everything that is not striped.
  cudaEvent_t grads_ready_ = nullptr;
  std::unique_ptr<PeerDirectory> peers_;
  bool communicator_aborted_ = false;  // Only the communicator's thread touches it.
  const char* last_op_ = "allreduce";  // For timeout messages.
  std::mutex abort_mu_;
  std::atomic<bool> abort_requested_{false};
  std::string abort_reason_;
  // Last: unregistered (waiting for a running callback) before anything above is destroyed.
  std::unique_ptr<StopToken::Registration> stop_registration_;
};

}  // namespace mptrain::cuda
