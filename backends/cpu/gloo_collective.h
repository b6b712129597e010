#pragma once

// The CPU backend's collective: gloo over TCP, rendezvous through the job's key-value store
// (the coordinator's blocking KeyValueGet), so no shared filesystem or extra service is needed.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/key_value_store.h"

namespace gloo {
class Context;
}

namespace mptrain {

class GlooCollective final : public Collective {
 public:
  // Connects all ranks (blocks until every rank has joined or timeout_ms passes).
  // `host` is the address this rank listens on. UNAVAILABLE/DEADLINE_EXCEEDED on failure.
  static absl::StatusOr<std::unique_ptr<GlooCollective>> Connect(int rank, int world_size,
                                                                 const std::string& host,
                                                                 KeyValueStore* store,
                                                                 int64_t timeout_ms);

  // Host f32 buffer: pre-divided by world size, then summed (as DDP does).
  absl::Status AllReduceMean(Tensor buffer) override;
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

 private:
  GlooCollective(int rank, int world_size) : rank_(rank), world_size_(world_size) {}

  int rank_;
  int world_size_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t next_tag_ = 0;
};

}  // namespace mptrain
