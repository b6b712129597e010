#pragma once

// The job-scoped key-value store as the backends see it (NCCL unique id, gloo rendezvous).
// The rank process implements it with the coordinator's KeyValueSet/KeyValueGet RPCs; tests
// implement it in memory.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace mptrain {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists. DEADLINE_EXCEEDED after timeout_ms; ABORTED if the job ended.
  virtual absl::StatusOr<std::string> Get(const std::string& key, int64_t timeout_ms) = 0;
};

}  // namespace mptrain
