#pragma once

// The CPU backend's collective: gloo over TCP, rendezvous through the job's key-value store
// (the coordinator's blocking KeyValueGet), so no shared filesystem or extra service is needed.
// Every operation waits at most collective_timeout_ms for its peers, and Abort() (or the stop
// token) ends a wait in progress at once.
//
// Where it listens: gloo's TCP device is created for `host` (the worker's advertised address),
// so every listening socket is bound to that address, never to 0.0.0.0. Debian 12's gloo
// (2022) has no port setting and listens while connecting on one socket per peer, each on a
// kernel-chosen port; with a port range (worker --port_range) each of those sockets takes a
// free port of the range instead. Once connected, no socket listens; the side that connects
// (the one with the larger address) does so from an ephemeral port, as any TCP client.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/peer_directory.h"
#include "comm/port_range.h"
#include "comm/stop_token.h"
#include "trainer/backend.h"
#include "trainer/key_value_store.h"

namespace gloo {
class Context;
}

namespace mptrain {

struct GlooCollectiveOptions {
  int rank = 0;
  int world_size = 1;
  std::string host = "127.0.0.1";  // The address this rank listens on; peers must reach it.
  // Rendezvous, and where the peers run (comm/peer_directory.h); must outlive the collective.
  KeyValueStore* store = nullptr;
  int64_t rendezvous_timeout_ms = 120'000;  // For every rank to join.
  int64_t collective_timeout_ms = 60'000;   // For one operation's peers.
  StopToken* stop_token = nullptr;          // Optional; aborts the collective when tripped.
  // Ports the listening sockets take (one per peer while connecting). Empty: the range in the
  // environment variable MPTRAIN_GLOO_PORT_RANGE (kGlooPortRangeVariable, which the worker
  // daemon sets for its ranks from --port_range) when it is set, else the kernel's choice.
  PortRange ports;
};

class GlooCollective final : public Collective {
 public:
  // Connects all ranks (blocks until every rank has joined or the rendezvous timeout passes).
  // UNAVAILABLE on failure (the message says which rank and why), including no free port in
  // the range within a few seconds; INVALID_ARGUMENT for a malformed MPTRAIN_GLOO_PORT_RANGE.
  static absl::StatusOr<std::unique_ptr<GlooCollective>> Connect(
      const GlooCollectiveOptions& options);
  // The same with one timeout for the rendezvous and every operation.
  static absl::StatusOr<std::unique_ptr<GlooCollective>> Connect(int rank, int world_size,
                                                                 const std::string& host,
                                                                 KeyValueStore* store,
                                                                 int64_t timeout_ms);
  ~GlooCollective() override;

  // Host f32 buffer: pre-divided by world size, then summed (as DDP does), by gloo's ring.
  // DEADLINE_EXCEEDED: a peer did not take part within the collective timeout; the message names
  // this rank and the one it waited for, with their hosts ("collective allreduce timed out after
  // 60 s: rank 0 on h1 (10.0.0.2) waited for rank 1 on h2 (10.0.0.3)"). UNAVAILABLE: a peer's
  // connection broke. ABORTED: Abort() was called (the message carries its reason).
  absl::Status AllReduceMean(Tensor buffer) override;
  // The buffer holds f16 or bf16 values in 4-byte floats (the CPU backend's low-precision
  // layout): they travel as 2-byte values, fp16 with gloo's float16 sum (as PyTorch's gloo
  // process group), bf16 with a sum that rounds each addition to bf16. Errors as AllReduceMean.
  absl::Status AllReduceSumCompressedAsync(Tensor buffer) override;
  // gloo's binomial tree from `root`; a timeout names the parent this rank waited to receive
  // from, or the children it waited to send to.
  absl::Status Broadcast(Tensor buffer, int root) override;
  // gloo's ring allgather (recv row r = rank r's send); the errors of AllReduceMean.
  absl::Status AllGather(Tensor send, Tensor recv) override;
  // gloo's ring allreduce with sum, nothing pre-divided; the errors of AllReduceMean.
  absl::Status AllReduceSum(Tensor buffer) override;
  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  void Abort(const std::string& reason) override;

 private:
  explicit GlooCollective(const GlooCollectiveOptions& options) : options_(options) {}
  // The status of a gloo operation `op` that threw `what`; a timeout names the peer of the
  // wait that timed out (`recv_from` for a receive, `send_to` for a send).
  absl::Status Failure(const char* op, const std::string& what,
                       const std::vector<int>& recv_from = {},
                       const std::vector<int>& send_to = {});

  // gloo's ring allreduce of `count` elements of T in place, combined by `reduce`. The ring
  // receives from rank + 1 and sends to rank − 1: a timeout names the one it waited for.
  template <typename T>
  absl::Status RingAllreduce(T* values, size_t count,
                             void (*reduce)(void*, const void*, const void*, size_t));

  GlooCollectiveOptions options_;
  std::unique_ptr<PeerDirectory> peers_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t next_tag_ = 0;
  std::vector<uint16_t> wire_;  // Compressed values as they travel (2 bytes each).
  std::mutex abort_mu_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;
  // Last: unregistered (waiting for a running callback) before anything above is destroyed.
  std::unique_ptr<StopToken::Registration> stop_registration_;
};

}  // namespace mptrain
